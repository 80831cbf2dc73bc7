package turn

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// A streamed chat round's accumulation: what one round keeps of its chunks for the next round
// (its content, reasoning and the workspace's calls), and which of its tool-call items belong
// to which call. What the client gets of the chunks is chatsse.go's.

// reasoningKeys are the delta members servers stream a model's reasoning in (DeepSeek, vLLM,
// SGLang: reasoning_content; vLLM, OpenRouter, Ollama: reasoning). A round sent back carries
// them as they came: servers expect a turn's reasoning back within it.
var reasoningKeys = [...]string{"reasoning_content", "reasoning"}

// chatRound is what one round keeps: only what the next round needs.
type chatRound struct {
	content   strings.Builder
	reasoning map[string]*strings.Builder
	truncated bool
	calls     []*callAcc
	byIndex   map[int]*callAcc
	byID      map[string]*callAcc
	clientN   int // the client's calls so far: the next client index
	maxArgs   int // the bytes of a workspace call's arguments kept
	finish    string
	usage     json.RawMessage
	// Where the round's usage came: in its finish chunk, and in a chunk that carried nothing
	// else (its choices empty, or one with an empty delta), kept as it came: the turn's usage
	// goes to the client where the last round's came, in the same shape.
	usageInFinish bool
	usageChunk    rawjson.Object
	// inPlace: the round's finish chunk came without a workspace call in the round, so it is the
	// turn's last, and it and what follows go to the client where they came (finishSent and
	// usageSent once they did).
	inPlace, finishSent, usageSent bool
}

func newChatRound(maxArgs int) chatRound {
	return chatRound{byIndex: map[int]*callAcc{}, byID: map[string]*callAcc{}, maxArgs: maxArgs}
}

// callAcc accumulates one tool call's deltas.
type callAcc struct {
	id, typ, name string
	args          strings.Builder
	length        int  // the bytes of arguments the deltas brought (args keeps at most maxArgs)
	decided       bool // the name is known: the client's or the proxy's
	client        bool
	clientIndex   int
	shown         bool // the client got its first item
}

// keepText keeps the round's text of a delta: its content and reasoning.
func (r *chatRound) keepText(delta rawjson.Object) {
	r.keep(&r.content, delta.Get("content"))
	for _, key := range reasoningKeys {
		if v := delta.Get(key); !isNull(v) {
			if r.reasoning == nil {
				r.reasoning = map[string]*strings.Builder{}
			}
			if r.reasoning[key] == nil {
				r.reasoning[key] = &strings.Builder{}
			}
			r.keep(r.reasoning[key], v)
		}
	}
}

// keep appends the text of a raw JSON string to what the round keeps, up to maxRoundText;
// anything but a string is ignored.
func (r *chatRound) keep(b *strings.Builder, raw json.RawMessage) {
	if len(raw) < 2 || raw[0] != '"' {
		return
	}
	if b.Len()+len(raw)-2 > maxRoundText {
		r.truncated = true
		return
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		b.Write(raw[1 : len(raw)-1]) // no escapes: the bytes are the text
		return
	}
	b.WriteString(text(raw))
}

// toolCalls accumulates a delta's tool-call items and returns those the client gets: its own
// calls, re-indexed from 0, each item otherwise as it came (an item that is not an object, too).
// ok is false when raw is not an array: the client gets it as it came.
//
// An item belongs to the call of its index; without an index, to the call of its id; without
// either, to the call still open, unless it brings a name while that call has one (a name
// begins a call: two whole calls in one chunk are two calls). Empty ids and names name nothing.
func (r *chatRound) toolCalls(req *ChatRequest, raw json.RawMessage) (out []json.RawMessage, ok bool) {
	items, err := rawjson.Split(raw)
	if err != nil {
		return nil, false
	}
	for _, item := range items {
		d, o, isObject := readChatCall(item)
		if !isObject {
			out = append(out, item)
			continue
		}
		acc := r.callOf(d)
		if d.id != "" && acc.id == "" {
			acc.id = d.id
			r.byID[d.id] = acc
		}
		if d.typ != "" {
			acc.typ = d.typ
		}
		acc.name += d.name
		if !acc.decided && acc.name != "" {
			acc.decided = true
			if req.IsClientTool(acc.name) {
				acc.client, acc.clientIndex = true, r.clientN
				r.clientN++
			}
		}
		switch {
		case acc.client && !acc.shown:
			// The first item the client gets of this call carries all of it so far.
			acc.args.WriteString(d.args)
			acc.shown = true
			out = append(out, clientCallItem(acc))
			acc.args.Reset() // the client has it; the proxy does not run client calls
		case acc.client:
			o.Set("index", rawjson.Int(acc.clientIndex))
			out = append(out, o.Bytes())
		default:
			acc.length += len(d.args)
			if acc.length <= r.maxArgs {
				acc.args.WriteString(d.args)
			}
		}
	}
	return out, true
}

// hidCalls reports whether the round called the workspace's tools (whose calls the client
// never sees).
func (r *chatRound) hidCalls() bool {
	for _, c := range r.calls {
		if !c.client {
			return true
		}
	}
	return false
}

// callOf is the call a tool-call item belongs to (see toolCalls), a new one when none.
func (r *chatRound) callOf(d chatCall) *callAcc {
	var acc *callAcc
	switch open := len(r.calls) - 1; {
	case d.index >= 0:
		acc = r.byIndex[d.index]
	case d.id != "":
		acc = r.byID[d.id]
	case open >= 0 && (d.name == "" || r.calls[open].name == ""):
		acc = r.calls[open]
	}
	if acc == nil {
		acc = &callAcc{}
		r.calls = append(r.calls, acc)
		if d.index >= 0 {
			r.byIndex[d.index] = acc
		}
	}
	return acc
}

// clientCallItem is the first item of a client's call: its index, the id and type when known,
// its name and the arguments so far.
func clientCallItem(acc *callAcc) json.RawMessage {
	o := rawjson.Object{}
	o.Set("index", rawjson.Int(acc.clientIndex))
	if acc.id != "" {
		o.Set("id", rawjson.String(acc.id))
	}
	typ := acc.typ
	if typ == "" {
		typ = "function"
	}
	o.Set("type", rawjson.String(typ))
	fn := rawjson.Object{}
	fn.Set("name", rawjson.String(acc.name))
	fn.Set("arguments", rawjson.String(acc.args.String()))
	o.Set("function", fn.Bytes())
	return o.Bytes()
}
