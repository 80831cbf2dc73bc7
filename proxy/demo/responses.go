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

// responsesRequest is what the demo reads of a Responses API request.
type responsesRequest struct {
	Instructions       string          `json:"instructions"`
	Input              json.RawMessage `json:"input"`
	PreviousResponseID string          `json:"previous_response_id"`
	Tools              []struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

// inputItem is what the demo reads of an input item.
type inputItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	CallID  string          `json:"call_id"`
	Name    string          `json:"name"`
	Output  json.RawMessage `json:"output"`
}

// chat is the request as the chat completions messages the demo thinks about.
func (rr responsesRequest) chat() (request, error) {
	var req request
	for _, t := range rr.Tools {
		name := t.Name
		if name == "" {
			name = t.Function.Name
		}
		var tool struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		tool.Function.Name = name
		req.Tools = append(req.Tools, tool)
	}
	if rr.Instructions != "" {
		req.Messages = append(req.Messages, message{Role: "system", Content: jsonString(rr.Instructions)})
	}
	var s string
	if json.Unmarshal(rr.Input, &s) == nil {
		req.Messages = append(req.Messages, message{Role: "user", Content: jsonString(s)})
		return req, nil
	}
	var items []inputItem
	if len(rr.Input) > 0 {
		if err := json.Unmarshal(rr.Input, &items); err != nil {
			return req, fmt.Errorf("input must be a string or an array of items: %w", err)
		}
	}
	for _, it := range items {
		switch {
		case it.Type == "function_call_output":
			req.Messages = append(req.Messages, message{Role: "tool", Content: it.Output, ToolCallID: it.CallID})
		case it.Type == "function_call":
			req.Messages = append(req.Messages, message{Role: "assistant"})
		case it.Role != "":
			req.Messages = append(req.Messages, message{Role: it.Role, Content: it.Content})
		}
	}
	return req, nil
}

func jsonString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// responses serves POST /v1/responses: the same thinking as chat, in the Responses API's wire
// format, streamed and not. The demo stores nothing (store is false on its responses, as on
// vLLM and Ollama), so it cannot continue a previous_response_id.
func (d *model) responses(w http.ResponseWriter, r *http.Request) {
	fail := func(msg string) {
		wire.WriteJSON(w, http.StatusBadRequest, wire.OpenAIError(msg, "invalid_request_error", "", ""))
	}
	var rr responsesRequest
	if err := json.NewDecoder(r.Body).Decode(&rr); err != nil {
		fail("invalid JSON: " + err.Error())
		return
	}
	if rr.PreviousResponseID != "" {
		fail("the demo model stores no responses (store is false): send the whole input instead of previous_response_id")
		return
	}
	req, err := rr.chat()
	if err != nil {
		fail(err.Error())
		return
	}
	rp := d.think(req)
	n := d.n.Add(1)
	id := "resp_demo" + strconv.FormatInt(n, 10)
	var items []map[string]any
	if rp.content != "" {
		items = append(items, wire.ResponsesMessage("msg_demo"+strconv.FormatInt(n, 10), "completed",
			[]any{map[string]any{"type": "output_text", "text": rp.content, "annotations": []any{}}}))
	}
	for i, c := range rp.calls {
		items = append(items, wire.ResponsesFunctionCall(fmt.Sprintf("fc_demo%d_%d", n, i), "completed", c.ID, c.Name, c.Arguments))
	}
	prompt, completion := tokens(req, rp)
	object := func(status string, output []map[string]any, usage any) map[string]any {
		if output == nil {
			output = []map[string]any{}
		}
		return map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "status": status, "error": nil,
			"incomplete_details": nil, "model": ModelName, "output": output, "parallel_tool_calls": true, "previous_response_id": nil,
			"store": false, "tool_choice": "auto", "tools": []any{}, "usage": usage, "metadata": map[string]any{}}
	}
	usage := wire.ResponsesUsage(prompt, 0, completion)
	if !rr.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(object("completed", items, usage))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	var events wire.ResponsesStream
	send := func(typ string, fields map[string]any) {
		_, _ = w.Write(events.Event(typ, fields))
		_ = rc.Flush()
	}
	send("response.created", map[string]any{"response": object("in_progress", nil, nil)})
	send("response.in_progress", map[string]any{"response": object("in_progress", nil, nil)})
	for i, item := range items {
		itemID := item["id"]
		switch item["type"] {
		case "message":
			send("response.output_item.added", map[string]any{"output_index": i, "item": wire.ResponsesMessage(itemID.(string), "in_progress", []any{})})
			part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
			send("response.content_part.added", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0, "part": part})
			for j, word := range strings.SplitAfter(rp.content, " ") {
				if word != "" {
					send("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0, "delta": word})
					if j%8 == 7 {
						time.Sleep(5 * time.Millisecond) // a little of a real model's pace
					}
				}
			}
			send("response.output_text.done", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0, "text": rp.content})
			send("response.content_part.done", map[string]any{"item_id": itemID, "output_index": i, "content_index": 0,
				"part": map[string]any{"type": "output_text", "text": rp.content, "annotations": []any{}}})
		case "function_call":
			added := wire.ResponsesFunctionCall(itemID.(string), "in_progress", item["call_id"].(string), item["name"].(string), "")
			send("response.output_item.added", map[string]any{"output_index": i, "item": added})
			args := item["arguments"].(string)
			for a := args; a != ""; {
				k := min(len(a), 12)
				send("response.function_call_arguments.delta", map[string]any{"item_id": itemID, "output_index": i, "delta": a[:k]})
				a = a[k:]
			}
			send("response.function_call_arguments.done", map[string]any{"item_id": itemID, "output_index": i, "arguments": args})
		}
		send("response.output_item.done", map[string]any{"output_index": i, "item": item})
	}
	send("response.completed", map[string]any{"response": object("completed", items, usage)})
}
