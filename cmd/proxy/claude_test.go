package main

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/demo"
)

// claude runs Claude Code (the pinned npm package) once in print mode against baseURL, in a
// home and working folder of its own, and returns what it printed.
func claude(t *testing.T, baseURL, prompt string, env ...string) string {
	t.Helper()
	home, work := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npmBin(t, "claude"), "-p", prompt)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "HOME="+home, "ANTHROPIC_BASE_URL="+baseURL, "ANTHROPIC_AUTH_TOKEN=wsproxy-e2e",
		"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "ANTHROPIC_API_KEY=")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "claude -p: %s", out)
	t.Logf("claude -p %q:\n%s", prompt, out)
	return string(out)
}

// TestClaudeCodeEndToEnd: Claude Code, through wsproxy and the demo model as `make run` serves
// them, records the objective and the preference its user states (the admin REST shows them
// with the demo's reason), and a second run in the same thread is answered from the block.
func TestClaudeCodeEndToEnd(t *testing.T) {
	t.Parallel()
	m, logs := MustRunMain(t, nil)
	base := m.URL + "/threads/cc-e2e"

	out := claude(t, base, "My goal is a tidy repository. I prefer tabs.")
	require.Contains(t, out, demo.Prefix, "the demo answered: %s\nproxy logs:\n%s", out, logs.String())
	require.Contains(t, out, "objective set: A tidy repository")

	var ws workspace
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/cc-e2e", "", &ws))
	require.Equal(t, "A tidy repository", ws.Objective.Text)
	require.Len(t, ws.Preferences, 1)
	require.Equal(t, "Tabs", ws.Preferences[0].Title)
	var events struct {
		Data []struct {
			Kind   string  `json:"kind"`
			Reason *string `json:"reason"`
		} `json:"data"`
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/cc-e2e/events", "", &events))
	reasons := map[string]string{}
	for _, ev := range events.Data {
		if ev.Reason != nil {
			reasons[ev.Kind] = *ev.Reason
		}
	}
	require.Equal(t, "The user stated their goal.", reasons["objective_set"])
	require.Equal(t, "The user stated preferences to record.", reasons["preference_added"])

	out = claude(t, base, "What do you know about my project?")
	require.Contains(t, out, "Your objective: A tidy repository", "the second run sees the block: %s", out)
	require.Contains(t, out, "1 preference(s)")
}
