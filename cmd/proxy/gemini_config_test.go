package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGeminiConfig: GEMINI_UPSTREAM_BASE_URL is an http(s) URL or demo, named when it is not;
// unset, it is Google's API (or the demo model with UPSTREAM_BASE_URL=demo).
func TestGeminiConfig(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"ftp://x", "generativelanguage.googleapis.com"} {
		c := DefaultConfig()
		env := map[string]string{"DATABASE_URL": "x", "GEMINI_UPSTREAM_BASE_URL": bad}
		require.NoError(t, c.Load(nil, func(k string) string { return env[k] }, io.Discard))
		require.ErrorContains(t, c.Validate(), "GEMINI_UPSTREAM_BASE_URL")
	}
	c := DefaultConfig()
	env := map[string]string{"DATABASE_URL": "x", "GEMINI_UPSTREAM_BASE_URL": "http://127.0.0.1:9/", "GEMINI_UPSTREAM_API_KEY": "AIza-operator"}
	require.NoError(t, c.Load(nil, func(k string) string { return env[k] }, io.Discard))
	require.NoError(t, c.Validate())
	require.Equal(t, "AIza-operator", c.GeminiUpstreamAPIKey)
	require.NoError(t, c.Load([]string{"-gemini-upstream-base-url", "demo"}, func(string) string { return "" }, io.Discard))
	require.Equal(t, "demo", c.GeminiUpstreamBaseURL)
}
