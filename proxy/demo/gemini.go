package demo

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// geminiRequest is what the demo reads of a Gemini API request.
type geminiRequest struct {
	Contents          []geminiContent `json:"contents"`
	SystemInstruction *geminiContent  `json:"systemInstruction"`
	Tools             []struct {
		FunctionDeclarations []struct {
			Name string `json:"name"`
		} `json:"functionDeclarations"`
	} `json:"tools"`
	GenerationConfig struct {
		ResponseMimeType   string          `json:"responseMimeType"`
		ResponseSchema     json.RawMessage `json:"responseSchema"`
		ResponseJSONSchema json.RawMessage `json:"responseJsonSchema"`
	} `json:"generationConfig"`
	GenerateContentRequest *geminiRequest `json:"generateContentRequest"`
}

type geminiContent struct {
	Role  string `json:"role"`
	Parts []struct {
		Text             string                       `json:"text"`
		Thought          bool                         `json:"thought"`
		FunctionResponse *wire.GeminiFunctionResponse `json:"functionResponse"`
	} `json:"parts"`
}

// chat is the request as the chat completions messages the demo thinks about: a content's
// functionResponse parts become tool messages, its text a message of parts after them.
func (gr geminiRequest) chat() request {
	var req request
	for _, t := range gr.Tools {
		for _, f := range t.FunctionDeclarations {
			var tool struct {
				Function struct {
					Name string `json:"name"`
				} `json:"function"`
			}
			tool.Function.Name = f.Name
			req.Tools = append(req.Tools, tool)
		}
	}
	if gr.SystemInstruction != nil {
		req.Messages = append(req.Messages, gr.SystemInstruction.message("system")...)
	}
	for _, c := range gr.Contents {
		role := c.Role
		if role == "" || role == "user" {
			role = "user"
		} else {
			role = "assistant"
		}
		req.Messages = append(req.Messages, c.message(role)...)
	}
	return req
}

// message is a content as chat messages of role.
func (c geminiContent) message(role string) []message {
	var out []message
	var parts []map[string]string
	for _, p := range c.Parts {
		switch {
		case p.FunctionResponse != nil:
			out = append(out, message{Role: "tool", Content: jsonString(string(p.FunctionResponse.Response)), ToolCallID: p.FunctionResponse.ID})
		case p.Text != "" && !p.Thought:
			parts = append(parts, map[string]string{"type": "text", "text": p.Text})
		}
	}
	if len(parts) > 0 || (role != "user" && role != "system") {
		content, _ := json.Marshal(parts)
		out = append(out, message{Role: role, Content: content})
	}
	return out
}

// gemini serves POST /v1beta/models/{model}:{method}: generateContent and streamGenerateContent
// (the same thinking as chat, in the Gemini API's wire format; a request for structured output
// gets a JSON text that fits its schema), and countTokens.
func (d *model) gemini(w http.ResponseWriter, r *http.Request) {
	call := r.PathValue("call")
	method := call[strings.LastIndexByte(call, ':')+1:]
	var gr geminiRequest
	if err := json.NewDecoder(r.Body).Decode(&gr); err != nil {
		geminiError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return
	}
	switch method {
	case "countTokens":
		if gr.GenerateContentRequest != nil {
			gr = *gr.GenerateContentRequest
		}
		prompt, _ := tokens(gr.chat(), reply{})
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"totalTokens":%d}`, prompt)
		return
	case "generateContent", "streamGenerateContent":
	default:
		geminiError(w, http.StatusNotFound, "the demo model does not serve "+method)
		return
	}
	req := gr.chat()
	var rp reply
	if schema := structured(gr); schema != nil {
		b, _ := json.Marshal(fill(schema))
		rp = reply{content: string(b)}
	} else {
		rp = d.think(req)
	}
	n := d.n.Add(1)
	id := "demo-" + strconv.FormatInt(n, 10)
	var parts []map[string]any
	if rp.content != "" {
		parts = append(parts, wire.GeminiText(rp.content))
	}
	for _, c := range rp.calls {
		parts = append(parts, wire.GeminiCall(c.ID, c.Name, json.RawMessage(c.Arguments)))
	}
	prompt, completion := tokens(req, rp)
	usage := wire.GeminiUsage(prompt, 0, completion, true)
	if method == "generateContent" {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(wire.GeminiResponse(parts, true, usage, ModelName, id), '\n'))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	send := func(parts []map[string]any, finish bool, usage map[string]any) {
		_, _ = w.Write(wire.Event(wire.GeminiResponse(parts, finish, usage, ModelName, id)))
		_ = rc.Flush()
	}
	partial := wire.GeminiUsage(prompt, 0, 0, false)
	words := strings.SplitAfter(rp.content, " ")
	for i, word := range words {
		if word == "" {
			continue
		}
		if i == len(words)-1 && len(rp.calls) == 0 {
			send([]map[string]any{wire.GeminiText(word)}, true, usage)
			return
		}
		send([]map[string]any{wire.GeminiText(word)}, false, partial)
	}
	send(parts[min(len(parts), boolInt(rp.content != "")):], true, usage)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// structured is the schema a request for structured output asks for (an empty one for JSON
// without a schema); nil for none.
func structured(gr geminiRequest) map[string]any {
	g := gr.GenerationConfig
	for _, raw := range []json.RawMessage{g.ResponseJSONSchema, g.ResponseSchema} {
		var s map[string]any
		if json.Unmarshal(raw, &s) == nil && s != nil {
			return s
		}
	}
	if g.ResponseMimeType == "application/json" {
		return map[string]any{}
	}
	return nil
}

// fill is a value that fits a JSON schema (or Gemini's OpenAPI subset): an object of its
// properties, an enum's first value, "demo" for a string, a number's minimum (or 1).
func fill(schema map[string]any) any {
	if enum, ok := schema["enum"].([]any); ok && len(enum) > 0 {
		return enum[0]
	}
	typ, _ := schema["type"].(string)
	switch strings.ToLower(typ) {
	case "string":
		return "demo"
	case "integer", "number":
		if low, ok := schema["minimum"].(float64); ok {
			return low
		}
		return 1 // scores and counts start at 1 (Gemini CLI's classifier's do)
	case "boolean":
		return false
	case "array":
		return []any{}
	}
	out := map[string]any{}
	props, _ := schema["properties"].(map[string]any)
	for name, p := range props {
		if ps, ok := p.(map[string]any); ok {
			out[name] = fill(ps)
		}
	}
	return out
}

// geminiError answers status in Google's shape.
func geminiError(w http.ResponseWriter, status int, msg string) {
	name := "INVALID_ARGUMENT"
	if status == http.StatusNotFound {
		name = "NOT_FOUND"
	}
	wire.WriteJSON(w, status, wire.GeminiError(status, name, msg))
}
