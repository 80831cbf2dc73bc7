package wire

import "encoding/json"

// The Gemini API (POST /v1beta/models/{model}:generateContent, and :streamGenerateContent with
// alt=sse): a GenerateContentResponse of one candidate, whole or as the chunks of a stream, each
// chunk a GenerateContentResponse of its own with the usage so far; errors in Google's shape.

// GeminiResponse is a GenerateContentResponse: one candidate whose model content is parts (as
// given: nil is null), with the finishReason STOP when finish (a whole answer, or a stream's last
// chunk); usage is its usageMetadata.
func GeminiResponse(parts []map[string]any, finish bool, usage any, model, id string) []byte {
	cand := map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "index": 0}
	if finish {
		cand["finishReason"] = "STOP"
	}
	b, _ := json.Marshal(map[string]any{"candidates": []any{cand}, "usageMetadata": usage, "modelVersion": model, "responseId": id})
	return b
}

// GeminiText is a text part.
func GeminiText(text string) map[string]any { return map[string]any{"text": text} }

// GeminiCall is a functionCall part; its id is left out when empty (Gemini's own calls have
// none).
func GeminiCall(id, name string, args json.RawMessage) map[string]any {
	fc := map[string]any{"name": name, "args": args}
	if id != "" {
		fc["id"] = id
	}
	return map[string]any{"functionCall": fc}
}

// GeminiUsage is a usageMetadata: the prompt's tokens (cached of them from the cache, left out
// when none), and, once the answer is whole (last), the candidates' tokens; the total is of what
// it counts.
func GeminiUsage(prompt, cached, candidates int, last bool) map[string]any {
	u := map[string]any{"promptTokenCount": prompt, "totalTokenCount": prompt}
	if cached > 0 {
		u["cachedContentTokenCount"] = cached
	}
	if last {
		u["candidatesTokenCount"], u["totalTokenCount"] = candidates, prompt+candidates
	}
	return u
}

// GeminiError is an error body in Google's shape: the HTTP status's code, the message, and the
// status's name (INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, …).
func GeminiError(status int, name, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"code": status, "message": msg, "status": name}})
	return b
}

// GeminiFunctionResponse is a functionResponse part as the models read it: the call's id (when
// it had one) and name, and the response object.
type GeminiFunctionResponse struct {
	ID       string          `json:"id"`
	Name     string          `json:"name"`
	Response json.RawMessage `json:"response"`
}
