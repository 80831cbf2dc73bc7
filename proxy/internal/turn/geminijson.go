package turn

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// geminiParts reads a round's parts (of one body, or of a stream's chunks in order): a
// functionCall part is a call, the workspace's unless it names one of the client's functions
// (any other name is run as the workspace's, as in chat turns: the model gets an error
// envelope); every other part (text, thought, executableCode, types the proxy does not know) is
// the client's to see.
type geminiParts struct {
	calls []toolCall // the functionCall parts, in order (the client's marked)
	// hidden: a workspace call came. clientCall: a call of the client's came.
	hidden, clientCall bool
	// sig is the thoughtSignature of a workspace call the client does not see, which goes on
	// the next call of the client's that has none: the Gemini API asks the first call of a
	// step to carry its signature, and that call is then the client's.
	sig json.RawMessage
	// untrusted are the parts of a server tool's (codeExecutionResult …) or of a kind wsproxy does
	// not know (docs/spec.md §19).
	untrusted []workspace.Part
}

// modelPartKeys are the members of the parts the model writes itself: not untrusted content.
var modelPartKeys = map[string]bool{"text": true, "thought": true, "thoughtSignature": true, "thought_signature": true,
	"functionCall": true, "function_call": true, "executableCode": true, "executable_code": true, "inlineData": true,
	"inline_data": true, "partMetadata": true, "part_metadata": true, "videoMetadata": true, "video_metadata": true}

// add reads one part and returns what the client sees of it (nil: nothing, a workspace call).
// generated records the ids made for calls that came without one.
func (g *geminiParts) add(part json.RawMessage, client func(string) bool, generated *map[string]bool) json.RawMessage {
	o, err := rawjson.Parse(part)
	if err != nil {
		return part
	}
	for _, k := range o.Keys {
		if !modelPartKeys[k] {
			g.untrusted = append(g.untrusted, workspace.Part{Type: workspace.SourceServerTool, Tool: k})
		}
	}
	fc, err := rawjson.Parse(field(&o, "functionCall"))
	if err != nil {
		return part
	}
	c := toolCall{ID: text(fc.Get("id")), Name: text(fc.Get("name")), Arguments: arguments(fc.Get("args"))}
	if c.Arguments == "" {
		c.Arguments = "{}"
	}
	c.Client = client(c.Name)
	if c.ID == "" && !c.Client {
		c.ID = "call_" + randomHex(12) // the Runner records a call by its id
		if *generated == nil {
			*generated = map[string]bool{}
		}
		(*generated)[c.ID] = true
	}
	g.calls = append(g.calls, c)
	if !c.Client {
		g.hidden = true
		if sig := field(&o, "thoughtSignature"); !isNull(sig) && g.sig == nil {
			g.sig = append(json.RawMessage(nil), sig...)
		}
		return nil
	}
	g.clientCall = true
	if g.sig != nil && isNull(field(&o, "thoughtSignature")) {
		o.Set(spelling(&o, "thoughtSignature"), g.sig)
		g.sig = nil
		return o.Bytes()
	}
	g.sig = nil
	return part
}

// geminiCandidate is a response's first candidate and its content (empty objects for none).
func geminiCandidate(top rawjson.Object) (cand, content rawjson.Object, parts []json.RawMessage) {
	list, _ := rawjson.Split(top.Get("candidates"))
	if len(list) > 0 {
		cand, _ = rawjson.Parse(list[0])
	}
	if cand.Keys != nil {
		content, _ = rawjson.Parse(cand.Get("content"))
	}
	if content.Keys != nil {
		parts, _ = rawjson.Split(content.Get("parts"))
	}
	return cand, content, parts
}

// withParts is a response top with its first candidate's parts replaced by parts (its content
// made when it had none); the other candidates as they came.
func withParts(top rawjson.Object, parts []json.RawMessage) rawjson.Object {
	list, _ := rawjson.Split(top.Get("candidates"))
	var cand rawjson.Object
	if len(list) > 0 {
		cand, _ = rawjson.Parse(list[0])
	} else {
		list = []json.RawMessage{nil}
	}
	content, err := rawjson.Parse(cand.Get("content"))
	if err != nil {
		content = rawjson.Object{}
		content.Set("role", rawjson.String("model"))
	}
	if parts == nil {
		parts = []json.RawMessage{}
	}
	content.Set("parts", rawjson.AppendArray(nil, parts))
	cand.Set("content", content.Bytes())
	list[0] = cand.Bytes()
	out := top.Clone()
	out.Set("candidates", rawjson.AppendArray(nil, list))
	return out
}

// geminiModelContent is the model's content as the next round sends it back: the candidate's
// content as it came, its role model.
func geminiModelContent(content rawjson.Object, raw json.RawMessage) json.RawMessage {
	if text(content.Get("role")) == "model" {
		return raw
	}
	o := content.Clone()
	o.Set("role", rawjson.String("model"))
	return o.Bytes()
}

// geminiJSON is the dialect of a generateContent turn (docs/spec.md §18): each round's reply is
// one GenerateContentResponse, and the client gets one at the end.
type geminiJSON struct {
	req   *GeminiRequest
	up    Upstream
	first string            // the first round's responseId
	shown []json.RawMessage // the visible parts of the rounds before the last
	last  geminiParts
	view  []json.RawMessage // the last round's visible parts
	model json.RawMessage   // the last round's content, to send back
	top   rawjson.Object
	jsonAnswer
}

func (d *geminiJSON) request(withWorkspaceTools bool) Payload { return d.req.Body(withWorkspaceTools) }

func (d *geminiJSON) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	raw, err := d.post(ctx, d.up, body)
	if err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	top, err := rawjson.Parse(raw)
	if err != nil {
		return nil, usage{}, roundInfo{}, fmt.Errorf("%w: the response is not a JSON object", apierr.ErrUpstreamProtocol)
	}
	cand, content, parts := geminiCandidate(top)
	d.last, d.view = geminiParts{}, nil
	for _, p := range parts {
		if v := d.last.add(p, d.req.IsClientTool, &d.req.generated); v != nil {
			d.view = append(d.view, v)
		}
	}
	if content.Keys != nil {
		d.model = geminiModelContent(content, cand.Get("content"))
	}
	d.top = top
	id := text(field(&top, "responseId"))
	if d.first == "" {
		d.first = id
	}
	info := roundInfo{model: text(field(&top, "modelVersion")), id: id, untrusted: d.last.untrusted}
	if fr := text(field(&cand, "finishReason")); fr != "" {
		info.finishReasons = []string{fr}
	}
	return d.last.calls, geminiTokens(field(&top, "usageMetadata")), info, nil
}

func (d *geminiJSON) extend(calls []toolCall, results []tools.Result) {
	d.shown = append(d.shown, d.view...)
	d.req.appendRound(d.model, calls, results)
}

// finish answers with the last response: untouched when the turn was one round without a
// workspace call (the proxy is invisible), else with the visible parts of every round in its
// first candidate, the first round's responseId and the usage of every round.
func (d *geminiJSON) finish(_ []toolCall, usage *usageSum, rounds int) error {
	if rounds == 1 && !d.last.hidden {
		d.body = d.raw
		return nil
	}
	o := withParts(d.top, append(d.shown, d.view...))
	if d.first != "" {
		o.Set(spelling(&o, "responseId"), rawjson.String(d.first))
	}
	if rounds > 1 && !usage.empty() {
		o.Set(spelling(&o, "usageMetadata"), usage.json())
	}
	d.body = o.Bytes()
	return nil
}
