package apierr

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// TestGeminiShape: Google's shape, its status named by the HTTP status.
func TestGeminiShape(t *testing.T) {
	t.Parallel()
	for status, name := range map[int]string{400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
		429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"} {
		require.JSONEq(t, `{"error":{"code":`+strings.TrimSpace(string(rawjson.Int(status)))+`,"message":"m","status":"`+name+`"}}`,
			string(GeminiShape(&Error{Status: status, Message: "m"})))
	}
}
