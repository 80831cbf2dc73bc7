package apierr

// The error shapes of the wire APIs whose errors are not OpenAI's: what the proxy answers on
// their routes (WithShape), and what the demo model answers as their provider would.

import (
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// MessagesShape is the Messages API's error body for an Error of the proxy (docs/spec.md §14):
// {"type":"error","error":{"type","message"}}, its type by the status, what Anthropic's SDKs
// branch on.
func MessagesShape(e *Error) []byte {
	var b struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	b.Type = "error"
	b.Error.Type = messagesErrorType(e.Status)
	b.Error.Message = e.Message
	out, _ := rawjson.Marshal(b)
	return out
}

// messagesErrorType is the Messages API's error type of a status.
func messagesErrorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status == http.StatusServiceUnavailable:
		return "overloaded_error"
	case status >= 500 || status == 0:
		return "api_error"
	}
	return "invalid_request_error"
}

// GeminiShape is the Gemini API's error body for an Error of the proxy (docs/spec.md §18):
// {"error":{"code","message","status"}}, Google's status name by the HTTP status.
func GeminiShape(e *Error) []byte {
	var b struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	b.Error.Code = e.Status
	if b.Error.Code == 0 {
		b.Error.Code = http.StatusInternalServerError
	}
	b.Error.Message = e.Message
	b.Error.Status = geminiStatus(b.Error.Code)
	out, _ := rawjson.Marshal(b)
	return out
}

// geminiStatus is Google's status name (google.rpc.Code) of an HTTP status.
func geminiStatus(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case status == http.StatusForbidden:
		return "PERMISSION_DENIED"
	case status == http.StatusNotFound:
		return "NOT_FOUND"
	case status == http.StatusConflict:
		return "ABORTED"
	case status == http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case status == StatusClientClosedRequest:
		return "CANCELLED"
	case status == http.StatusNotImplemented:
		return "UNIMPLEMENTED"
	case status == http.StatusBadGateway || status == http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case status == http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	case status >= 500:
		return "INTERNAL"
	}
	return "INVALID_ARGUMENT"
}
