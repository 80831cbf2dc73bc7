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

// messageRound is one round's reply of the Messages API: its content blocks as they came, which
// of them are workspace tool_use blocks (never shown to the client), and its tool calls.
type messageRound struct {
	blocks []json.RawMessage
	hidden []bool
	calls  []toolCall // the tool_use blocks, in order (the client's marked)
	// untrusted are the blocks of a server tool's (server_tool_use, web_search_tool_result …) or
	// of a type wsproxy does not know (docs/spec.md §19).
	untrusted []workspace.Part
}

// modelBlockTypes are the content blocks the model writes itself: not untrusted content.
var modelBlockTypes = map[string]bool{"text": true, "thinking": true, "redacted_thinking": true, "tool_use": true}

// add reads one content block of the round: a tool_use block is a call, the workspace's unless
// it names one of the client's tools (any other name is run as the workspace's, as in chat
// turns: the model gets an error envelope); every other block (text, thinking,
// redacted_thinking, server tool blocks, types the proxy does not know) is the client's to see.
func (m *messageRound) add(block json.RawMessage, client func(string) bool) {
	hidden := false
	o, err := rawjson.Parse(block)
	if typ := text(o.Get("type")); err == nil && !modelBlockTypes[typ] {
		id := text(o.Get("id"))
		if id == "" {
			id = text(o.Get("tool_use_id"))
		}
		m.untrusted = append(m.untrusted, workspace.Part{Type: workspace.SourceServerTool, Tool: typ, CallID: id})
	}
	if err == nil && text(o.Get("type")) == "tool_use" {
		c := toolCall{ID: text(o.Get("id")), Name: text(o.Get("name")), Arguments: arguments(o.Get("input")), Raw: block}
		c.Client = client(c.Name)
		if c.ID == "" && !c.Client {
			c.ID = "toolu_" + randomHex(12) // the round sent back needs one
			o.Set("id", rawjson.String(c.ID))
			block = o.Bytes()
		}
		if c.Arguments == "" {
			c.Arguments = "{}"
		}
		hidden = !c.Client
		m.calls = append(m.calls, c)
	}
	m.blocks = append(m.blocks, block)
	m.hidden = append(m.hidden, hidden)
}

// hasHidden reports a workspace call in the round.
func (m *messageRound) hasHidden() bool {
	for _, h := range m.hidden {
		if h {
			return true
		}
	}
	return false
}

// visible appends the round's blocks the client may see (all but the workspace's tool_use).
func (m *messageRound) visible(dst []json.RawMessage) []json.RawMessage {
	for i, b := range m.blocks {
		if !m.hidden[i] {
			dst = append(dst, b)
		}
	}
	return dst
}

// sentBack is the round's content as the assistant message of the next round carries it:
// every block as it came, but text blocks with no text (which the API refuses in a request).
func (m *messageRound) sentBack() []json.RawMessage {
	out := make([]json.RawMessage, 0, len(m.blocks))
	for _, b := range m.blocks {
		if o, err := rawjson.Parse(b); err == nil && text(o.Get("type")) == "text" && text(o.Get("text")) == "" {
			continue
		}
		out = append(out, b)
	}
	return out
}

// stopReason is the stop_reason the client gets for a round that ended the turn: the round's
// own, but "end_turn" where the round's tool_use blocks were all the workspace's.
func stopReason(raw json.RawMessage, m *messageRound, clientCalls []toolCall) json.RawMessage {
	if m.hasHidden() && len(clientCalls) == 0 && text(raw) == "tool_use" {
		return rawjson.String("end_turn")
	}
	return raw
}

// messagesJSON is the dialect of a non-streamed Messages turn (docs/spec.md §14): each round's
// reply is one message object, and the client gets one at the end.
type messagesJSON struct {
	req   *MessagesRequest
	up    Upstream
	first string            // the turn's id: its first round's message id
	shown []json.RawMessage // the visible blocks of the rounds before the last
	last  *messageRound
	top   rawjson.Object // the last round's message
	jsonAnswer
}

func (d *messagesJSON) request(withWorkspaceTools bool) Payload {
	return d.req.Body(withWorkspaceTools)
}

func (d *messagesJSON) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	raw, err := d.post(ctx, d.up, body)
	if err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	top, err := rawjson.Parse(raw)
	if err != nil {
		return nil, usage{}, roundInfo{}, fmt.Errorf("%w: the message is not a JSON object", apierr.ErrUpstreamProtocol)
	}
	m := &messageRound{}
	if content := top.Get("content"); !isNull(content) {
		blocks, _ := rawjson.Split(content)
		for _, b := range blocks {
			m.add(b, d.req.IsClientTool)
		}
	}
	if d.first == "" {
		d.first = messageID(text(top.Get("id")))
	}
	d.last, d.top = m, top
	info := roundInfo{model: text(top.Get("model")), id: text(top.Get("id")), untrusted: m.untrusted}
	if sr := text(top.Get("stop_reason")); sr != "" {
		info.finishReasons = []string{sr}
	}
	return m.calls, messagesTokens(top.Get("usage")), info, nil
}

func (d *messagesJSON) extend(calls []toolCall, results []tools.Result) {
	d.shown = d.last.visible(d.shown)
	d.req.appendRound(d.last.sentBack(), calls, results)
}

// finish answers with the last message: untouched when the turn was one round without a
// workspace call (the proxy is invisible), else under the first round's id with the visible
// blocks of every round, the stop_reason of the last and the usage summed.
func (d *messagesJSON) finish(clientCalls []toolCall, usage *usageSum, rounds int) error {
	if rounds == 1 && !d.last.hasHidden() {
		d.body = d.raw
		return nil
	}
	o := d.top.Clone()
	o.Set("id", rawjson.String(d.first))
	o.Set("content", rawjson.AppendArray(nil, d.last.visible(d.shown)))
	if sr := o.Get("stop_reason"); sr != nil {
		o.Set("stop_reason", stopReason(sr, d.last, clientCalls))
	}
	if rounds > 1 && !usage.empty() {
		o.Set("usage", usage.json())
	}
	d.body = o.Bytes()
	return nil
}
