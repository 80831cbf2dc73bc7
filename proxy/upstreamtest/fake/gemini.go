package fake

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// The Gemini API, in Google's shape (POST /v1beta/models/{model}:generateContent, and
// :streamGenerateContent?alt=sse): a JSON body of one candidate whose content's parts are the
// text, then a functionCall part a call, after the timing's total; or server-sent events, a
// chunk a piece of the text and a chunk a call (Gemini sends a call whole), each chunk with the
// usage so far (the prompt), the last with the finishReason and the whole usage.

// GeminiPart is what the fake reads of a content's part.
type GeminiPart struct {
	Text         string `json:"text"`
	Thought      bool   `json:"thought"`
	FunctionCall *struct {
		ID   string          `json:"id"`
		Name string          `json:"name"`
		Args json.RawMessage `json:"args"`
	} `json:"functionCall"`
	FunctionResponse *wire.GeminiFunctionResponse `json:"functionResponse"`
}

// GeminiParts are a Gemini content's parts (none for another API's message).
func (m Message) GeminiParts() []GeminiPart {
	var p []GeminiPart
	_ = json.Unmarshal(m.Parts, &p)
	return p
}

// geminiMethod is the Gemini API's method a path names ("" for another API's path).
func geminiMethod(path string) string {
	i := strings.LastIndexByte(path, ':')
	if i < 0 || !strings.Contains(path, "/models/") {
		return ""
	}
	switch m := path[i+1:]; m {
	case "generateContent", "streamGenerateContent":
		return m
	}
	return ""
}

// geminiModel is the model a Gemini path names.
func geminiModel(path string) string {
	path = path[strings.LastIndex(path, "/models/")+len("/models/"):]
	return path[:strings.LastIndexByte(path, ':')]
}

// fromGemini fills the request's common fields from a Gemini body: its contents are its
// messages (role user or model, their parts in Parts), its functionDeclarations its tools.
func (r *Request) fromGemini(path string) {
	r.Model, r.Stream = geminiModel(path), geminiMethod(path) == "streamGenerateContent"
	r.Messages = r.Contents
	var decls []json.RawMessage
	for _, t := range r.Tools {
		var d struct {
			FunctionDeclarations []json.RawMessage `json:"functionDeclarations"`
		}
		_ = json.Unmarshal(t, &d)
		decls = append(decls, d.FunctionDeclarations...)
	}
	r.Tools = decls
}

func (m *Model) gemini(w http.ResponseWriter, r *http.Request, req *Request, tool bool, start time.Time) {
	encode := func() [][]byte {
		a := m.answer(req, tool)
		u := fixedUsage
		if m.google != nil {
			prompt, cached := m.google.usage(req)
			u = usage{prompt: prompt, completion: len(a.text())/bytesPerToken + 10, cached: cached}
		}
		if req.Stream {
			return geminiEvents(req, a, u, m.opts.Timing.pieces())
		}
		return [][]byte{geminiJSON(req, geminiParts(a.text(), a.Calls, len(a.Calls) == 0), true, u)}
	}
	m.reply(w, r, req, start, memoKey{api: Gemini, stream: req.Stream, tool: tool, big: req.BigStream, model: req.Model}, encode)
}

// geminiParts are the parts of text (when not empty, or when always) and of calls.
func geminiParts(text string, calls []Call, always bool) []map[string]any {
	parts := []map[string]any{}
	if text != "" || always {
		parts = append(parts, wire.GeminiText(text))
	}
	for _, c := range calls {
		parts = append(parts, wire.GeminiCall(c.ID, c.Name, json.RawMessage(c.Arguments)))
	}
	return parts
}

// geminiJSON is a GenerateContentResponse of parts; the last one carries the finishReason and
// the whole usage, the others the prompt's only.
func geminiJSON(req *Request, parts []map[string]any, last bool, u usage) []byte {
	return wire.GeminiResponse(parts, last, wire.GeminiUsage(u.prompt, u.cached, u.completion, last), req.Model, "fake-model")
}

// geminiEvents are a streamed answer's events: a chunk a piece of the text, then a chunk a call.
func geminiEvents(req *Request, a Answer, u usage, n int) [][]byte {
	var chunks [][]map[string]any
	pieces := a.Pieces
	if pieces == nil && (a.Text != "" || len(a.Calls) == 0) {
		pieces = split(a.Text, n)
	}
	for _, p := range pieces {
		chunks = append(chunks, geminiParts(p, nil, true))
	}
	for _, c := range a.Calls {
		chunks = append(chunks, geminiParts("", []Call{c}, false))
	}
	out := make([][]byte, len(chunks))
	for i, c := range chunks {
		out[i] = wire.Event(geminiJSON(req, c, i == len(chunks)-1, u))
	}
	return out
}

// writeGeminiError answers an error in Google's shape.
func writeGeminiError(w http.ResponseWriter, status int, msg string) {
	name := map[int]string{http.StatusBadRequest: "INVALID_ARGUMENT", http.StatusServiceUnavailable: "UNAVAILABLE"}[status]
	wire.WriteJSON(w, status, wire.GeminiError(status, name, msg))
}

// Implicit caching as Google documents it for the Gemini API: a request whose prompt starts
// with the prefix of an earlier request to the same model is served that prefix from the cache,
// reported as usageMetadata.cachedContentTokenCount and billed at 25 % of the input price
// (Gemini 2.5 and later), with a minimum of 1,024 tokens (Flash's; Pro's is 4,096). No cache
// key and no step: the cached part is the longest common prefix itself.
const GeminiMinTokens = 1024

// geminiCache is a model of the Gemini API's implicit cache. It renders each prompt as the model
// sees it — the tools' declarations, the systemInstruction, then the contents in order, each
// part in a canonical form — and answers usage by the rule above.
type geminiCache struct {
	mu   sync.Mutex
	seen map[string][]string // prompts seen, per model
}

func newGeminiCache() *geminiCache { return &geminiCache{seen: map[string][]string{}} }

// renderGeminiPrompt is the prompt as the model lays it out: each declaration, the system's
// parts, then each content's role and parts.
func renderGeminiPrompt(req *Request) string {
	var b strings.Builder
	for _, t := range req.Tools {
		b.Write(canonical(t))
		b.WriteByte('\n')
	}
	parts := func(raw json.RawMessage) {
		var ps []json.RawMessage
		_ = json.Unmarshal(raw, &ps)
		for _, p := range ps {
			b.Write(canonical(p))
			b.WriteByte('\n')
		}
	}
	if len(req.SystemInstruction) > 0 && string(req.SystemInstruction) != "null" {
		var sys struct {
			Parts json.RawMessage `json:"parts"`
		}
		b.WriteString("<|system|>")
		if json.Unmarshal(req.SystemInstruction, &sys) == nil {
			parts(sys.Parts)
		} else {
			b.Write(req.SystemInstruction) // a string
		}
		b.WriteString("<|end|>\n")
	}
	for _, m := range req.Messages {
		b.WriteString("<|" + cmpRole(m.Role) + "|>")
		parts(m.Parts)
		b.WriteString("<|end|>\n")
	}
	return b.String()
}

func cmpRole(role string) string {
	if role == "" {
		return "user"
	}
	return role
}

// usage returns the prompt's tokens and the part of them served from the cache, and remembers
// the prompt.
func (c *geminiCache) usage(req *Request) (prompt, cached int) {
	p := renderGeminiPrompt(req)
	c.mu.Lock()
	defer c.mu.Unlock()
	best := 0
	for _, earlier := range c.seen[req.Model] {
		best = max(best, commonPrefix(p, earlier))
	}
	c.seen[req.Model] = append(c.seen[req.Model], p)
	if best/bytesPerToken < GeminiMinTokens {
		return len(p) / bytesPerToken, 0
	}
	return len(p) / bytesPerToken, best / bytesPerToken
}
