package upstreamtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// A scripted upstream of Anthropic's Messages API that checks each request as Anthropic does
// what a proxy could get wrong: every tool_use of an assistant message answered by a
// tool_result in the user message right after it (those first, none for another id), every
// thinking block's signature its own (a thinking block changed in any way is refused), and with
// thinking on, an assistant message of tool calls that the request continues starting with its
// thinking. A refused request gets Anthropic's 400.

// Block is a content block of a scripted Messages reply.
type Block struct {
	Type     string // text, thinking, redacted_thinking, tool_use, or another (Raw)
	Text     string // text; thinking's thinking; redacted_thinking's data
	ID, Name string // tool_use
	Input    string // tool_use: the input's JSON
	Raw      string // a block of another type, as JSON
}

// TextBlock is a text block.
func TextBlock(s string) Block { return Block{Type: "text", Text: s} }

// ThinkingBlock is a thinking block, signed.
func ThinkingBlock(s string) Block { return Block{Type: "thinking", Text: s} }

// RedactedThinkingBlock is a redacted_thinking block carrying data.
func RedactedThinkingBlock(data string) Block { return Block{Type: "redacted_thinking", Text: data} }

// ToolUseBlock is a tool_use block.
func ToolUseBlock(id, name, input string) Block {
	return Block{Type: "tool_use", ID: id, Name: name, Input: input}
}

// Signature is the signature of a thinking block's text.
func Signature(thinking string) string {
	sum := sha256.Sum256([]byte("upstreamtest thinking\n" + thinking))
	return "sig_" + hex.EncodeToString(sum[:24])
}

// redactedData marks the data of the redacted_thinking blocks the fake gives out.
const redactedData = "EmwKAhgBEgy"

// json is the block as the API sends it whole (a non-streamed body, or a stream's content_block_start
// of a redacted_thinking block).
func (b Block) json() map[string]any {
	switch b.Type {
	case "text":
		return wire.MessagesText(b.Text)
	case "thinking":
		return map[string]any{"type": "thinking", "thinking": b.Text, "signature": Signature(b.Text)}
	case "redacted_thinking":
		return map[string]any{"type": "redacted_thinking", "data": redactedData + b.Text}
	case "tool_use":
		return wire.MessagesToolUse(b.ID, b.Name, json.RawMessage(b.Input))
	}
	var m map[string]any
	_ = json.Unmarshal([]byte(b.Raw), &m)
	return m
}

// MessageReply is a scripted Messages reply.
type MessageReply struct {
	ID         string
	Blocks     []Block
	StopReason string // "" means end_turn, or tool_use when a block is one
	// Usage is the reply's usage; nil means input 10, cache read 4, cache creation 2, output 5.
	Usage map[string]int
}

func (m MessageReply) stopReason() string {
	if m.StopReason != "" {
		return m.StopReason
	}
	for _, b := range m.Blocks {
		if b.Type == "tool_use" {
			return "tool_use"
		}
	}
	return "end_turn"
}

func (m MessageReply) usage() map[string]int {
	if m.Usage != nil {
		return m.Usage
	}
	return map[string]int{"input_tokens": 10, "cache_creation_input_tokens": 2, "cache_read_input_tokens": 4, "output_tokens": 5}
}

// Messages answers a Messages request with m, streamed when the request asks for a stream, once
// the request passed Anthropic's checks (CheckMessages).
func Messages(m MessageReply) Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		body, _ := io.ReadAll(r.Body)
		if msg := CheckMessages(body); msg != "" {
			MessagesError(http.StatusBadRequest, "invalid_request_error", msg)(w, r)
			return
		}
		_ = json.Unmarshal(body, &req)
		if !req.Stream {
			JSON(http.StatusOK, m.JSON())(w, r)
			return
		}
		StreamRaw(m.Events())(w, r)
	}
}

// JSON is the reply as a non-streamed body.
func (m MessageReply) JSON() string {
	blocks := make([]any, len(m.Blocks))
	for i, b := range m.Blocks {
		blocks[i] = b.json()
	}
	out, _ := json.Marshal(wire.MessagesMessage(m.ID, "claude-test", blocks, m.stopReason(), m.usage()))
	return string(out)
}

// Events are the reply as Anthropic streams it: message_start, a ping, each block's start,
// deltas (text and thinking in two pieces, the signature whole, a tool's input in pieces of 7
// bytes) and stop, message_delta, message_stop.
func (m MessageReply) Events() []string {
	var out []string
	send := func(typ string, v map[string]any) { out = append(out, string(wire.MessagesEvent(typ, v))) }
	start := map[string]int{}
	for k, v := range m.usage() {
		start[k] = v
	}
	start["output_tokens"] = 1
	send("message_start", wire.MessagesStart(m.ID, "claude-test", start))
	send("ping", map[string]any{})
	for i, b := range m.Blocks {
		delta := func(d map[string]any) { send("content_block_delta", wire.MessagesDelta(i, d)) }
		halves := func(s string) []string { n := Cut(s, len(s)/2); return []string{s[:n], s[n:]} }
		switch b.Type {
		case "text":
			send("content_block_start", wire.MessagesBlockStart(i, wire.MessagesText("")))
			for _, p := range halves(b.Text) {
				delta(wire.MessagesTextDelta(p))
			}
		case "thinking":
			send("content_block_start", wire.MessagesBlockStart(i, map[string]any{"type": "thinking", "thinking": "", "signature": ""}))
			for _, p := range halves(b.Text) {
				delta(map[string]any{"type": "thinking_delta", "thinking": p})
			}
			delta(map[string]any{"type": "signature_delta", "signature": Signature(b.Text)})
		case "tool_use":
			send("content_block_start", wire.MessagesBlockStart(i, wire.MessagesToolUseStart(b.ID, b.Name)))
			for a := b.Input; a != ""; {
				n := Cut(a, 7)
				delta(wire.MessagesInputDelta(a[:n]))
				a = a[n:]
			}
		default:
			send("content_block_start", wire.MessagesBlockStart(i, b.json()))
		}
		send("content_block_stop", wire.MessagesBlockStop(i))
	}
	send("message_delta", wire.MessagesEnd(m.stopReason(), m.usage()))
	send("message_stop", map[string]any{})
	return out
}

// MessagesError answers status with an error in Anthropic's shape.
func MessagesError(status int, typ, msg string) Reply {
	return JSON(status, string(wire.MessagesError(typ, msg)))
}

// CheckMessages is what Anthropic refuses in a Messages request body ("" for nothing): a
// tool_use without its tool_result right after it, a tool_result without its tool_use right
// before it or after other blocks, an empty text block, a thinking block changed since the fake
// gave it out (its signature), and with thinking on, a continued assistant message of tool calls
// that does not start with its thinking.
func CheckMessages(body []byte) string {
	var req struct {
		Thinking *struct {
			Type string `json:"type"`
		} `json:"thinking"`
		Messages []apiMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "invalid JSON: " + err.Error()
	}
	thinkingOn := req.Thinking != nil && req.Thinking.Type != "disabled"
	last := -1 // the last assistant message
	for i, m := range req.Messages {
		if m.Role == "assistant" {
			last = i
		}
	}
	var pending []string // the tool_use ids of the assistant message before this one
	for i, m := range req.Messages {
		blocks := m.blocks()
		var results []string
		for j, b := range blocks {
			switch b.Type {
			case "text":
				if b.Text == nil || *b.Text == "" {
					return fmt.Sprintf("messages.%d.content.%d: text content blocks must be non-empty", i, j)
				}
			case "thinking":
				if m.Role != "assistant" || b.Signature != Signature(b.Thinking) {
					return fmt.Sprintf("messages.%d.content.%d: Invalid `signature` in `thinking` block", i, j)
				}
			case "redacted_thinking":
				if !strings.HasPrefix(b.Data, redactedData) {
					return fmt.Sprintf("messages.%d.content.%d: Invalid `data` in `redacted_thinking` block", i, j)
				}
			case "tool_result":
				if m.Role != "user" || len(results) != j {
					return fmt.Sprintf("messages.%d.content.%d: tool_result blocks must come first in a user message, right after the tool_use", i, j)
				}
				results = append(results, b.ToolUseID)
			}
		}
		if len(pending) > 0 || len(results) > 0 {
			if len(results) != len(pending) || strings.Join(pending, ",") != strings.Join(sorted(results, pending), ",") {
				return fmt.Sprintf("messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s (tool_result ids: %s)",
					i-1, strings.Join(pending, ", "), strings.Join(results, ", "))
			}
		}
		pending = nil
		if m.Role != "assistant" {
			continue
		}
		for _, b := range blocks {
			if b.Type == "tool_use" {
				pending = append(pending, b.ID)
			}
		}
		if thinkingOn && i == last && i+1 < len(req.Messages) && len(pending) > 0 &&
			blocks[0].Type != "thinking" && blocks[0].Type != "redacted_thinking" {
			return fmt.Sprintf("messages.%d.content.0.type: Expected `thinking` or `redacted_thinking`, but found `%s`. When `thinking` is enabled, "+
				"a final `assistant` message must start with a thinking block", i, blocks[0].Type)
		}
	}
	if len(pending) > 0 {
		return fmt.Sprintf("messages.%d: `tool_use` ids were found without `tool_result` blocks immediately after: %s", len(req.Messages)-1,
			strings.Join(pending, ", "))
	}
	return ""
}

// apiMessage is a message of a Messages request.
type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// apiBlock is what CheckMessages reads of a content block.
type apiBlock struct {
	Type      string  `json:"type"`
	Text      *string `json:"text"`
	Thinking  string  `json:"thinking"`
	Signature string  `json:"signature"`
	Data      string  `json:"data"`
	ID        string  `json:"id"`
	ToolUseID string  `json:"tool_use_id"`
}

// blocks are the message's content blocks (none for a string content).
func (m apiMessage) blocks() []apiBlock {
	var bs []apiBlock
	_ = json.Unmarshal(m.Content, &bs)
	return bs
}

// sorted is results in the order of want (those want names), for comparing sets.
func sorted(results, want []string) []string {
	seen := map[string]bool{}
	for _, r := range results {
		seen[r] = true
	}
	var out []string
	for _, w := range want {
		if seen[w] {
			out = append(out, w)
		}
	}
	return out
}
