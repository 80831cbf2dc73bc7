package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/demo"
)

// geminiCLI runs Gemini CLI (the pinned npm package) once in non-interactive mode against
// baseURL, with a Gemini API key, in a home and working folder of its own, and returns what it
// printed.
func geminiCLI(t *testing.T, baseURL, prompt string) string {
	t.Helper()
	home, work := t.TempDir(), t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".gemini"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".gemini", "settings.json"),
		[]byte(`{"security":{"auth":{"selectedType":"gemini-api-key"}}}`), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npmBin(t, "gemini"), "-p", prompt)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "HOME="+home, "GEMINI_API_KEY=sk-demo", "GOOGLE_GEMINI_BASE_URL="+baseURL,
		"GEMINI_CLI_TRUST_WORKSPACE=true", "GOOGLE_API_KEY=", "GOOGLE_CLOUD_PROJECT=", "GOOGLE_GENAI_USE_VERTEXAI=")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "gemini -p: %s", out)
	t.Logf("gemini -p %q:\n%s", prompt, out)
	return string(out)
}

// TestGeminiCLIEndToEnd: Gemini CLI, through wsproxy and the demo model as `make run` serves
// them, records the objective and the preference its user states (its routing classifier, a
// structured-output request, left alone and still answered), and a second run in the same
// thread is answered from the block.
func TestGeminiCLIEndToEnd(t *testing.T) {
	t.Parallel()
	m, logs := MustRunMain(t, nil)
	base := m.URL + "/threads/gemini-e2e"

	out := geminiCLI(t, base, "My goal is a tidy repository. I prefer tabs over spaces.")
	require.Contains(t, out, demo.Prefix, "the demo answered: %s\nproxy logs:\n%s", out, logs.String())
	require.Contains(t, out, "objective set: A tidy repository")
	require.Regexp(t, `kind[=":]+side`, logs.String(), "the routing classifier is a side request")
	require.Regexp(t, `kind[=":]+turn[^\n]*rounds[=":]+2`, logs.String(), "the turn ran the workspace's calls")

	var ws adminWorkspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/gemini-e2e", "", &ws))
	require.Equal(t, "A tidy repository", ws.Objective.Text)
	require.Len(t, ws.Preferences, 1)
	require.Equal(t, "Tabs over spaces", ws.Preferences[0].Title)

	out = geminiCLI(t, base, "What do you know about my project?")
	require.Contains(t, out, "Your objective: A tidy repository", "the second run sees the block: %s", out)
	require.Contains(t, out, "1 preference(s)")
}
