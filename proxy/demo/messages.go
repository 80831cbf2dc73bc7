package demo

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// messagesRequest is what the demo reads of an Anthropic Messages API request.
type messagesRequest struct {
	System   json.RawMessage `json:"system"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

// contentBlock is what the demo reads of a content block.
type contentBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

// chat is the request as the chat completions messages the demo thinks about: a user message's
// tool_result blocks become tool messages, its other text a user message of parts after them.
func (mr messagesRequest) chat() (request, error) {
	var req request
	for _, t := range mr.Tools {
		var tool struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		tool.Function.Name = t.Name
		req.Tools = append(req.Tools, tool)
	}
	if len(mr.System) > 0 && string(mr.System) != "null" {
		req.Messages = append(req.Messages, message{Role: "system", Content: mr.System})
	}
	for _, m := range mr.Messages {
		var blocks []contentBlock
		if json.Unmarshal(m.Content, &blocks) != nil {
			req.Messages = append(req.Messages, message{Role: m.Role, Content: m.Content})
			continue
		}
		var parts []map[string]string
		for _, b := range blocks {
			switch b.Type {
			case "tool_result":
				req.Messages = append(req.Messages, message{Role: "tool", Content: toolResultText(b.Content), ToolCallID: b.ToolUseID})
			case "text":
				parts = append(parts, map[string]string{"type": "text", "text": b.Text})
			}
		}
		if len(parts) > 0 || m.Role != "user" {
			content, _ := json.Marshal(parts)
			req.Messages = append(req.Messages, message{Role: m.Role, Content: content})
		}
	}
	return req, nil
}

// toolResultText is a tool_result's content as a JSON string: its string, or its text blocks'.
func toolResultText(content json.RawMessage) json.RawMessage {
	var s string
	if json.Unmarshal(content, &s) == nil {
		return content
	}
	return jsonString(strings.TrimSuffix(ContentText(content), "\n"))
}

// messages serves POST /v1/messages: the same thinking as chat, in Anthropic's Messages API wire
// format, streamed and not.
func (d *model) messages(w http.ResponseWriter, r *http.Request) {
	var mr messagesRequest
	if err := json.NewDecoder(r.Body).Decode(&mr); err != nil {
		messagesError(w, "invalid JSON: "+err.Error())
		return
	}
	req, err := mr.chat()
	if err != nil {
		messagesError(w, err.Error())
		return
	}
	rp := d.think(req)
	n := d.n.Add(1)
	id := "msg_demo" + strconv.FormatInt(n, 10)
	var blocks []map[string]any
	if rp.content != "" {
		blocks = append(blocks, wire.MessagesText(rp.content))
	}
	for _, c := range rp.calls {
		blocks = append(blocks, wire.MessagesToolUse("toolu_"+strings.TrimPrefix(c.ID, "call_"), c.Name, json.RawMessage(c.Arguments)))
	}
	stop := "end_turn"
	if len(rp.calls) > 0 {
		stop = "tool_use"
	}
	prompt, completion := tokens(req, rp)
	usage := map[string]any{"input_tokens": prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": completion}
	if !mr.Stream {
		if blocks == nil {
			blocks = []map[string]any{}
		}
		b, _ := json.Marshal(wire.MessagesMessage(id, ModelName, blocks, stop, usage))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(b, '\n'))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	send := func(typ string, fields map[string]any) {
		_, _ = w.Write(wire.MessagesEvent(typ, fields))
		_ = rc.Flush()
	}
	start := map[string]any{"input_tokens": prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
	send("message_start", wire.MessagesStart(id, ModelName, start))
	send("ping", map[string]any{})
	for i, b := range blocks {
		switch b["type"] {
		case "text":
			send("content_block_start", wire.MessagesBlockStart(i, wire.MessagesText("")))
			for j, word := range strings.SplitAfter(rp.content, " ") {
				if word != "" {
					send("content_block_delta", wire.MessagesDelta(i, wire.MessagesTextDelta(word)))
					if j%8 == 7 {
						time.Sleep(5 * time.Millisecond) // a little of a real model's pace
					}
				}
			}
		case "tool_use":
			send("content_block_start", wire.MessagesBlockStart(i, wire.MessagesToolUseStart(b["id"].(string), b["name"].(string))))
			for a := string(b["input"].(json.RawMessage)); a != ""; {
				k := min(len(a), 12)
				send("content_block_delta", wire.MessagesDelta(i, wire.MessagesInputDelta(a[:k])))
				a = a[k:]
			}
		}
		send("content_block_stop", wire.MessagesBlockStop(i))
	}
	send("message_delta", wire.MessagesEnd(stop, usage))
	send("message_stop", map[string]any{})
}

// countTokens serves POST /v1/messages/count_tokens: the demo's count of the request (words).
func (d *model) countTokens(w http.ResponseWriter, r *http.Request) {
	var mr messagesRequest
	if err := json.NewDecoder(r.Body).Decode(&mr); err != nil {
		messagesError(w, "invalid JSON: "+err.Error())
		return
	}
	req, _ := mr.chat()
	prompt, _ := tokens(req, reply{})
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"input_tokens":%d}`, prompt)
}

// messagesError answers 400 in Anthropic's error shape.
func messagesError(w http.ResponseWriter, msg string) {
	wire.WriteJSON(w, http.StatusBadRequest, wire.MessagesError("invalid_request_error", msg))
}
