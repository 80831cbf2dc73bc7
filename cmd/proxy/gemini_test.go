package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
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
	return geminiRun(t, geminiHome(t), t.TempDir(), exec.Command(npmBin(t, "gemini"), "-p", prompt), baseURL)
}

// geminiRun runs cmd (Gemini CLI, or a shell that runs it) in work with home and a Gemini API
// key, against baseURL, and returns what it printed.
func geminiRun(t *testing.T, home, work string, cmd *exec.Cmd, baseURL string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd = exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "HOME="+home, "GEMINI_API_KEY=sk-demo", "GOOGLE_GEMINI_BASE_URL="+baseURL,
		"GEMINI_CLI_TRUST_WORKSPACE=true", "GOOGLE_API_KEY=", "GOOGLE_CLOUD_PROJECT=", "GOOGLE_GENAI_USE_VERTEXAI=",
		"PATH="+filepath.Dir(npmBin(t, "gemini"))+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%v: %s", cmd.Args, out)
	t.Logf("%v:\n%s", cmd.Args, out)
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

// TestGeminiCLISessions: with the wrapper docs/clients.md prints (run as printed: it is read
// from the page) and THREAD_HEADER naming its header beside the other agents', each `gemini -p`
// run is a thread of its own, named by Gemini CLI's session id, created with THREAD_PARENTS: the
// second session does not see the first's objective, and both see the project's preference.
func TestGeminiCLISessions(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("../../docs/clients.md")
	require.NoError(t, err)
	wrapper := regexp.MustCompile("(?s)```sh\n(gemini_session\\(\\) \\{.*?\n\\}\n)```").FindSubmatch(page)
	require.NotNil(t, wrapper, "docs/clients.md prints the wrapper")
	m, logs := MustRunMain(t, func(c *Config) {
		c.ThreadHeader = "X-Claude-Code-Session-Id, session-id, X-Gemini-Session-Id"
		c.ThreadParents = "repo-x"
	})
	require.Equal(t, 201, adminCall(t, m, "POST", "/admin/v1/threads/repo-x/preferences", `{"title":"Go 1.26, no cgo","kind":"hard"}`, nil))

	home, work := geminiHome(t), t.TempDir()
	session := func(prompt string) string {
		script := string(wrapper[1]) + `gemini_session -p "$1"`
		return geminiRun(t, home, work, exec.Command("bash", "-c", script, "bash", prompt), m.URL)
	}
	out := session("My goal is a tidy repository. I prefer tabs over spaces.")
	require.Contains(t, out, "objective set: A tidy repository", "the demo answered: %s\nproxy logs:\n%s", out, logs.String())
	out = session("What do you know about my project?")
	require.Contains(t, out, "Your objective: (none yet)", "a session of its own: %s", out)
	require.Contains(t, out, "0 preference(s) recorded in this thread and 1 inherited (repo-x: 1)", "with its parents: %s", out)

	var children struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/repo-x/children", "", &children))
	require.Len(t, children.Data, 2, "two sessions, two threads")
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	objectives, first := []string{}, ""
	for _, c := range children.Data {
		require.Regexp(t, uuid, c.ID, "named by Gemini CLI's session id")
		var ws struct {
			adminWorkspace
			Parents []string `json:"parents"`
		}
		require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/"+c.ID, "", &ws))
		require.Equal(t, []string{"repo-x"}, ws.Parents)
		if ws.Objective != nil {
			objectives = append(objectives, ws.Objective.Text)
			first = c.ID
		}
		// Gemini CLI keeps the session under that id: its chat file names it.
		found, err := filepath.Glob(filepath.Join(home, ".gemini", "tmp", "*", "chats", "*"))
		require.NoError(t, err)
		require.True(t, strings.Contains(strings.Join(found, "\n"), c.ID[:8]), "a session of Gemini CLI's: %v", found)
	}
	require.Equal(t, []string{"A tidy repository"}, objectives, "one session set it, the other did not see it")

	// Resumed as docs/clients.md says, the first session is its thread again.
	resume := regexp.MustCompile("`(GEMINI_CLI_CUSTOM_HEADERS=\"X-Gemini-Session-Id: <id>\" gemini --resume <id>)`").FindSubmatch(page)
	require.NotNil(t, resume, "docs/clients.md prints how to resume a session")
	script := strings.ReplaceAll(string(resume[1]), "<id>", `"$1"`) + ` -p "$2"`
	out = geminiRun(t, home, work, exec.Command("bash", "-c", script, "bash", first, "What do you know about my project?"), m.URL)
	require.Contains(t, out, "Your objective: A tidy repository", "the resumed session's thread: %s", out)
	require.Equal(t, 200, adminCall(t, m, "GET", "/admin/v1/threads/repo-x/children", "", &children))
	require.Len(t, children.Data, 2, "no third thread")
}
