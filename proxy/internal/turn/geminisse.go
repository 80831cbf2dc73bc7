package turn

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// geminiSSE is the dialect of a streamGenerateContent turn (docs/spec.md §18, §16): `data:`
// events of GenerateContentResponse chunks, no event names, no [DONE]. The client's parts go
// out as they come, never a workspace functionCall part; a round that called the workspace
// holds its chunk with the finishReason, and the turn's last such chunk goes out at its end.
// A chunk's usageMetadata is the round's so far (cumulative): the client gets it with the usage
// of the earlier rounds added. Chunks the proxy cannot read as a response, and the upstream's
// error chunk, pass as they came.
type geminiSSE struct {
	req *GeminiRequest
	up  Upstream
	streamOut
	round   int
	first   string // the first round's responseId
	model   string // the upstream's modelVersion (for traces)
	earlier usageSum
	cur     geminiRound
	scratch rawjson.Object
}

// geminiRound is what one streamed round keeps.
type geminiRound struct {
	parts geminiParts
	// sent are the round's parts as the next round sends them back, adjacent plain text parts
	// merged; text holds the one under way (thought: a thought's), kept counts the bytes of
	// text kept, at most maxRoundText.
	sent    []json.RawMessage
	text    strings.Builder
	thought bool
	inText  bool
	kept    int
	usage   json.RawMessage // the last chunk's usageMetadata
	// final is the chunk that carried the finishReason of a round that called the workspace,
	// held; inPlace: the round's finishReason went to the client where it came.
	final   rawjson.Object
	inPlace bool
	chunks  int
}

// keep keeps a part for the round sent back.
func (r *geminiRound) keep(part json.RawMessage) {
	o, err := rawjson.Parse(part)
	plain := err == nil && len(o.Keys) > 0 && o.Keys[0] == "text" && (len(o.Keys) == 1 || (len(o.Keys) == 2 && o.Keys[1] == "thought"))
	if plain {
		thought := string(o.Get("thought")) == "true"
		if r.inText && r.thought != thought {
			r.flushText()
		}
		r.inText, r.thought = true, thought
		if s := text(o.Get("text")); r.kept+len(s) <= maxRoundText {
			r.text.WriteString(s)
			r.kept += len(s)
		}
		return
	}
	r.flushText()
	r.sent = append(r.sent, append(json.RawMessage(nil), part...))
}

func (r *geminiRound) flushText() {
	if !r.inText {
		return
	}
	o := rawjson.Object{}
	o.Set("text", rawjson.String(r.text.String()))
	if r.thought {
		o.Set("thought", json.RawMessage("true"))
	}
	r.sent = append(r.sent, o.Bytes())
	r.text.Reset()
	r.inText = false
}

// content is the round's model content as the next round sends it back.
func (r *geminiRound) content() json.RawMessage {
	r.flushText()
	o := rawjson.Object{}
	o.Set("role", rawjson.String("model"))
	o.Set("parts", rawjson.AppendArray(nil, r.sent))
	return o.Bytes()
}

func (d *geminiSSE) request(withWorkspaceTools bool) Payload { return d.req.Body(withWorkspaceTools) }

func (d *geminiSSE) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	d.round++
	d.cur = geminiRound{}
	if err := d.attempt(func() error { return d.stream(ctx, body) }); err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	return d.cur.parts.calls, geminiTokens(d.cur.usage), roundInfo{model: d.model, id: d.first, untrusted: d.cur.parts.untrusted}, nil
}

// stream reads one round's chunks to the end of the stream.
func (d *geminiSSE) stream(ctx context.Context, body Payload) error {
	_, err := readEvents(ctx, d.up, body, d.flush, func(data []byte) (bool, error) { return false, d.event(data) })
	if err == nil && d.cur.chunks == 0 {
		return errStreamCut
	}
	return err
}

// event handles one chunk: it keeps what the round needs and emits what the client gets.
func (d *geminiSSE) event(data []byte) error {
	ev, err := rawjson.ParseInto(d.scratch, data)
	if err != nil {
		if err := notJSON(data); err != nil {
			return err
		}
		return d.send(data)
	}
	d.scratch = ev
	if !isNull(ev.Get("error")) {
		return &apierr.StreamError{Data: append([]byte(nil), data...)}
	}
	d.cur.chunks++
	if u := field(&ev, "usageMetadata"); !isNull(u) {
		d.cur.usage = append(json.RawMessage(nil), u...)
	}
	if d.round == 1 {
		if id := text(field(&ev, "responseId")); id != "" && d.first == "" {
			d.first = id
		}
		if m := text(field(&ev, "modelVersion")); m != "" {
			d.model = m
		}
	}
	cand, _, parts := geminiCandidate(ev)
	var view []json.RawMessage
	changed := false
	for _, p := range parts {
		v := d.cur.parts.add(p, d.req.IsClientTool, &d.req.generated)
		if v == nil || len(v) != len(p) {
			changed = true
		}
		if v != nil {
			view = append(view, v)
		}
		if !d.cur.parts.clientCall {
			d.cur.keep(p)
		}
	}
	finished := cand.Keys != nil && !isNull(field(&cand, "finishReason"))
	if finished && d.cur.parts.hidden {
		d.cur.final = withParts(ev, nil).Own()
		if len(view) == 0 {
			return nil
		}
		out := withParts(ev, view)
		out.Set("candidates", withoutFinish(out.Get("candidates")))
		out.Del(spelling(&out, "usageMetadata"))
		return d.send(out.Bytes())
	}
	d.cur.inPlace = d.cur.inPlace || finished
	if !changed && (d.round == 1 || isNull(field(&ev, "usageMetadata"))) {
		return d.send(data)
	}
	if changed && len(view) == 0 && !finished {
		return nil // only the workspace's calls
	}
	out := ev
	if changed {
		out = withParts(ev, view)
	}
	if d.round > 1 && !isNull(field(&ev, "usageMetadata")) {
		out.Set(spelling(&out, "usageMetadata"), d.earlier.with(d.cur.usage))
	}
	return d.send(out.Bytes())
}

// withoutFinish is a candidates list whose first candidate has no finishReason.
func withoutFinish(list json.RawMessage) json.RawMessage {
	cands, err := rawjson.Split(list)
	if err != nil || len(cands) == 0 {
		return list
	}
	c, err := rawjson.Parse(cands[0])
	if err != nil {
		return list
	}
	c.Del(spelling(&c, "finishReason"))
	cands[0] = c.Bytes()
	return rawjson.AppendArray(nil, cands)
}

func (d *geminiSSE) extend(calls []toolCall, results []tools.Result) {
	d.req.appendRound(d.cur.content(), calls, results)
	d.earlier.keep(d.cur.usage)
}

// finish ends the stream: the held chunk of the last round's finishReason (the round called
// the workspace too), with the usage of every round. A round without workspace calls sent its
// own in place; a round that sent none (a server that names no finishReason) gets none.
func (d *geminiSSE) finish(_ []toolCall, usage *usageSum, rounds int) error {
	out := d.cur.final
	if d.cur.inPlace || out.Keys == nil { // a stream without a finishReason ends without one
		return nil
	}
	if d.first != "" && (field(&out, "responseId") != nil) {
		out.Set(spelling(&out, "responseId"), rawjson.String(d.first))
	}
	if u := usage.json(); u != nil {
		out.Set(spelling(&out, "usageMetadata"), u)
	}
	return d.send(out.Bytes())
}

// Failure is the chunk that ends a stream whose turn failed after its first byte: the
// upstream's own error chunk or error body as it came, else the proxy's error in Google's shape.
func (d *geminiSSE) Failure(err error) (string, []byte) {
	var se *apierr.StreamError
	if errors.As(err, &se) {
		return "", se.Data
	}
	var ue *apierr.UpstreamError
	if errors.As(err, &ue) && isGeminiError(ue.Body) {
		return "", compactJSON(ue.Body)
	}
	return "", GeminiError(apierr.StreamFailure(err))
}

// End is what follows the last chunk: nothing (the Gemini API sends no [DONE]).
func (d *geminiSSE) End() []byte { return nil }

// Keepalive is an empty event: two line ends. Google's SDKs read past it but fail on an SSE
// comment, and on a lone line end before an event (the Go SDK splits its stream at blank lines
// and calls what does not start with `data:` an invalid chunk; the JavaScript SDK, Gemini CLI's,
// skips white space but waits for a `data:` line at the start of its buffer).
func (d *geminiSSE) Keepalive() []byte { return geminiKeepalive }

var geminiKeepalive = []byte("\n\n")

func (d *geminiSSE) send(data []byte) error { return d.sendEvent("", data) }
