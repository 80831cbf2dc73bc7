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

// A scripted upstream of the Gemini API that checks each request as Google does what a proxy
// could get wrong: a model content's functionCall parts answered by functionResponse parts of
// the same names (and ids, when the calls had them) in the user content right after it, and
// every thoughtSignature one the fake gave out for its part (a part changed in any way is
// refused). A refused request gets Google's 400.

// GeminiPart is a part of a scripted Gemini reply.
type GeminiPart struct {
	Text    string // text (a thought's, with Thought)
	Thought bool
	// Call is a functionCall's name, Args its arguments' JSON, ID its id ("" for none).
	Call, Args, ID string
	// Signed: the part carries a thoughtSignature (GeminiSignature of its text or call).
	Signed bool
	Raw    string // a part of another kind, as JSON
}

// GeminiText is a text part.
func GeminiText(s string) GeminiPart { return GeminiPart{Text: s} }

// GeminiThought is a thought part, signed.
func GeminiThought(s string) GeminiPart { return GeminiPart{Text: s, Thought: true, Signed: true} }

// GeminiCall is a functionCall part, signed.
func GeminiCall(id, name, args string) GeminiPart {
	return GeminiPart{Call: name, Args: args, ID: id, Signed: true}
}

// GeminiSignature is the thoughtSignature of a part's text or call's name and arguments.
func GeminiSignature(of string) string {
	sum := sha256.Sum256([]byte("upstreamtest gemini\n" + of))
	return hex.EncodeToString(sum[:24])
}

func (p GeminiPart) signed() string {
	if p.Call != "" {
		return "call:" + p.Call
	}
	return "text:" + p.Text
}

func (p GeminiPart) json() map[string]any {
	var m map[string]any
	switch {
	case p.Raw != "":
		_ = json.Unmarshal([]byte(p.Raw), &m)
		return m
	case p.Call != "":
		m = wire.GeminiCall(p.ID, p.Call, json.RawMessage(cmpOr(p.Args, "{}")))
	default:
		m = wire.GeminiText(p.Text)
		if p.Thought {
			m["thought"] = true
		}
	}
	if p.Signed {
		m["thoughtSignature"] = GeminiSignature(p.signed())
	}
	return m
}

func cmpOr(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// GeminiReply is a scripted Gemini reply.
type GeminiReply struct {
	ID    string // responseId
	Parts []GeminiPart
	// Usage is the reply's usageMetadata; nil means prompt 10, cached 4, candidates 5, thoughts 2.
	Usage map[string]int
}

func (g GeminiReply) usage() map[string]int {
	if g.Usage != nil {
		return g.Usage
	}
	return map[string]int{"promptTokenCount": 10, "cachedContentTokenCount": 4, "candidatesTokenCount": 5, "thoughtsTokenCount": 2, "totalTokenCount": 17}
}

// response is a GenerateContentResponse of parts (none when nil).
func (g GeminiReply) response(parts []map[string]any, finish bool, usage any) []byte {
	if parts == nil {
		parts = []map[string]any{}
	}
	return wire.GeminiResponse(parts, finish, usage, "gemini-test", g.ID)
}

// JSON is the reply as generateContent's body.
func (g GeminiReply) JSON() string {
	parts := make([]map[string]any, len(g.Parts))
	for i, p := range g.Parts {
		parts[i] = p.json()
	}
	return string(g.response(parts, true, g.usage()))
}

// Events are the reply as streamGenerateContent sends it with alt=sse: a text part in two
// chunks, each other part in a chunk of its own, every chunk with the usage so far (cumulative:
// the prompt, then the whole), the last with the finishReason.
func (g GeminiReply) Events() []string {
	var out []string
	partial := wire.GeminiUsage(g.usage()["promptTokenCount"], 0, 0, false)
	var chunks [][]map[string]any
	for _, p := range g.Parts {
		if p.Call == "" && p.Raw == "" && !p.Signed && len(p.Text) > 1 {
			half := len(p.Text) / 2
			chunks = append(chunks, []map[string]any{wire.GeminiText(p.Text[:half])}, []map[string]any{wire.GeminiText(p.Text[half:])})
			continue
		}
		chunks = append(chunks, []map[string]any{p.json()})
	}
	for i, c := range chunks {
		last := i == len(chunks)-1
		var u any = partial
		if last {
			u = g.usage()
		}
		out = append(out, string(wire.Event(g.response(c, last, u))))
	}
	return out
}

// Gemini answers a Gemini request with g, streamed for streamGenerateContent, once the request
// passed Google's checks (CheckGemini).
func Gemini(g GeminiReply) Reply {
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if msg := CheckGemini(body); msg != "" {
			GeminiError(http.StatusBadRequest, "INVALID_ARGUMENT", msg)(w, r)
			return
		}
		if !strings.HasSuffix(r.URL.Path, ":streamGenerateContent") {
			JSON(http.StatusOK, g.JSON())(w, r)
			return
		}
		StreamRaw(g.Events())(w, r)
	}
}

// GeminiError answers status with an error in Google's shape.
func GeminiError(status int, name, msg string) Reply {
	return JSON(status, string(wire.GeminiError(status, name, msg)))
}

// geminiContent is what CheckGemini reads of a content.
type geminiContent struct {
	Role  string `json:"role"`
	Parts []struct {
		Text             *string `json:"text"`
		Thought          bool    `json:"thought"`
		ThoughtSignature string  `json:"thoughtSignature"`
		FunctionCall     *struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"functionCall"`
		FunctionResponse *wire.GeminiFunctionResponse `json:"functionResponse"`
	} `json:"parts"`
}

// CheckGemini is what Google refuses in a generateContent body ("" for nothing): a content
// without parts, a role other than user and model, a model content's functionCall parts not
// answered one for one (name and id) by the functionResponse parts of the next content, a
// functionResponse whose response is not an object, a thoughtSignature the fake did not give out
// for its part.
func CheckGemini(body []byte) string {
	var req struct {
		Contents []geminiContent `json:"contents"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return "Invalid JSON payload received. " + err.Error()
	}
	if len(req.Contents) == 0 {
		return "* GenerateContentRequest.contents: contents is not specified"
	}
	var pending []string // name/id of the calls of the content before
	for i, c := range req.Contents {
		if c.Role != "" && c.Role != "user" && c.Role != "model" {
			return fmt.Sprintf("Please use a valid role: user, model. (contents[%d])", i)
		}
		if len(c.Parts) == 0 {
			return fmt.Sprintf("* GenerateContentRequest.contents[%d].parts: contents.parts must not be empty.", i)
		}
		var answers, calls []string
		for j, p := range c.Parts {
			switch {
			case p.FunctionCall != nil:
				if p.ThoughtSignature != "" && p.ThoughtSignature != GeminiSignature("call:"+p.FunctionCall.Name) {
					return fmt.Sprintf("contents[%d].parts[%d]: Corrupted thought signature.", i, j)
				}
				calls = append(calls, p.FunctionCall.Name+"/"+p.FunctionCall.ID)
			case p.FunctionResponse != nil:
				if len(p.FunctionResponse.Response) == 0 || p.FunctionResponse.Response[0] != '{' {
					return fmt.Sprintf("contents[%d].parts[%d].function_response.response: must be an object", i, j)
				}
				answers = append(answers, p.FunctionResponse.Name+"/"+p.FunctionResponse.ID)
			case p.Text != nil && p.ThoughtSignature != "":
				if p.ThoughtSignature != GeminiSignature("text:"+*p.Text) {
					return fmt.Sprintf("contents[%d].parts[%d]: Corrupted thought signature.", i, j)
				}
			}
		}
		if len(pending) > 0 && strings.Join(pending, ",") != strings.Join(answers, ",") {
			return fmt.Sprintf("Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn (contents[%d]: calls %s, responses %s).",
				i, strings.Join(pending, ", "), strings.Join(answers, ", "))
		}
		pending = calls
	}
	return ""
}
