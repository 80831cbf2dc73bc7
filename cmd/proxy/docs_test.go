package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/require"
)

// snippet is one fenced example of a documentation page.
type snippet struct {
	lang string
	line int      // the fence's line in its page
	text string   // the example as printed
	cmds []string // console: the commands
	outs []string // console: what each prints
}

// pageSnippets are the examples of a page (CONTRIBUTING.md says which fences run).
func pageSnippets(page string) []snippet {
	var out []snippet
	lines := strings.Split(page, "\n")
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok {
			continue
		}
		s := snippet{lang: strings.Fields(lang + " text")[0], line: i + 1}
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		s.text = strings.Join(body, "\n") + "\n"
		if s.lang == "console" {
			s.cmds, s.outs = consoleCommands(body)
		}
		out = append(out, s)
	}
	return out
}

// consoleCommands splits a console example into its `$ ` commands (with their `\`
// continuations) and the output printed after each.
func consoleCommands(body []string) (cmds, outs []string) {
	for i := 0; i < len(body); i++ {
		cmd, ok := strings.CutPrefix(body[i], "$ ")
		if !ok {
			if len(outs) > 0 {
				outs[len(outs)-1] += body[i] + "\n"
			}
			continue
		}
		for strings.HasSuffix(cmd, "\\") && i+1 < len(body) {
			i++
			cmd += "\n" + body[i]
		}
		cmds, outs = append(cmds, cmd), append(outs, "")
	}
	return cmds, outs
}

// printedMatches reports whether got is what an example says it prints, "…" standing for anything.
func printedMatches(want, got string) bool {
	parts := strings.Split(strings.TrimSpace(want), "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`(?s)\A` + strings.Join(parts, ".*?") + `\z`).MatchString(strings.TrimSpace(got))
}

// TestDocsSnippets runs the examples of README.md and docs/*.md as printed, page by page, each
// page against a fresh program serving the demo model (as a first `make run` does), from a folder
// holding its admin token where `make run` keeps it: console examples must print what they show, sh examples succeed, js
// examples run with Node and the pinned npm clients.
func TestDocsSnippets(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	pages = append([]string{"../../README.md"}, pages...)
	modules := nodeModules(t)
	var env []string
	for _, kv := range os.Environ() {
		// The examples meet the demo, never a real provider, nor a wsproxy of the environment's:
		// a page defines WSPROXY (its base URL) itself, with localhost:8080 mapped to the test's.
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "OPENAI_") && !strings.HasPrefix(k, "ANTHROPIC_") && !strings.HasPrefix(k, "WSPROXY") {
			env = append(env, kv)
		}
	}
	env = append(env, "PATH="+filepath.Join(modules, ".bin")+":"+os.Getenv("PATH"),
		"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1")
	// A page's examples meet a fresh program (as after a first `make run`), in a folder of their
	// own that holds its admin token where `make run` keeps it.
	start := func(t *testing.T) (dir, host string) {
		m, _ := MustRunMain(t, nil)
		u, err := url.Parse(m.URL)
		require.NoError(t, err)
		dir = t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, ".data"), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, ".data", "admin-token"), []byte(m.AdminToken+"\n"), 0o600))
		require.NoError(t, os.Symlink(modules, filepath.Join(dir, "node_modules")))
		require.NoError(t, os.Mkdir(filepath.Join(dir, "home"), 0o700))
		return dir, u.Host
	}

	ran := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		name := filepath.Base(page)
		// One shell per page, its examples in order; a marker line before each command names it.
		script := "set -eo pipefail\ncurl() { command curl --fail-with-body \"$@\"; }\n"
		var checks []snippet
		modulesJS := map[string]string{}
		n := 0
		mark := func(label string) string {
			n++
			return fmt.Sprintf("printf '\\n\\x1e%d %s\\x1e\\n'\n", n, label)
		}
		for _, s := range pageSnippets(string(b)) {
			at := fmt.Sprintf("%s:%d", name, s.line)
			switch s.lang {
			case "console":
				for i, c := range s.cmds {
					script += mark(at) + c + "\n"
					checks = append(checks, snippet{line: n, text: s.outs[i], cmds: []string{at + ": " + c}})
				}
			case "sh":
				script += mark(at) + s.text
			case "js":
				f := fmt.Sprintf("%s-%d.mjs", strings.TrimSuffix(name, ".md"), s.line)
				modulesJS[f] = s.text
				script += mark(at) + "node " + f + "\n"
			default:
				continue
			}
			ran++
		}
		if n == 0 {
			continue
		}
		t.Run(strings.TrimSuffix(name, ".md"), func(t *testing.T) {
			dir, host := start(t)
			address := strings.NewReplacer("localhost:8080", host, "127.0.0.1:8080", host)
			for f, text := range modulesJS {
				require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte(address.Replace(text)), 0o600))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", "-c", address.Replace(script))
			cmd.Dir, cmd.Env = dir, append(env, "HOME="+filepath.Join(dir, "home"))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			outputs := regexp.MustCompile("\n\x1e([0-9]+) ([^\x1e]*)\x1e\n").Split(stdout.String(), -1)
			markers := regexp.MustCompile("\x1e([0-9]+) ([^\x1e]*)\x1e").FindAllStringSubmatch(stdout.String(), -1)
			if err != nil {
				last := "before the first example"
				if len(markers) > 0 {
					last = markers[len(markers)-1][2]
				}
				t.Fatalf("the example at %s failed: %v\nstdout:\n%s\nstderr:\n%s", last, err, outputs[len(outputs)-1], stderr.String())
			}
			for _, c := range checks {
				got := outputs[c.line]
				require.True(t, printedMatches(c.text, got), "%s\nprints:\n%s\nthe page says:\n%s", c.cmds[0], got, c.text)
			}
		})
	}
	require.GreaterOrEqual(t, ran, 7, "the pages hold runnable examples")
}

// TestPrintedMatches: "…" in an example's output stands for anything, the rest is exact.
func TestPrintedMatches(t *testing.T) {
	t.Parallel()
	require.True(t, printedMatches(`{"a":1,…,"z":2}`, `{"a":1,"b":[3],"z":2}`+"\n"))
	require.False(t, printedMatches(`{"a":1,…,"z":2}`, `{"a":2,"b":[3],"z":2}`))
	require.True(t, printedMatches("<workspace>\nObjective: x\n</workspace>\n\n", "<workspace>\nObjective: x\n</workspace>"))
	require.False(t, printedMatches("a.b", "axb"), "the rest is literal")
	cmds, outs := consoleCommands(strings.Split("$ curl a \\\n    -d b\n{\"x\":1}\n\n$ echo\n", "\n"))
	require.Equal(t, []string{"curl a \\\n    -d b", "echo"}, cmds)
	require.Equal(t, "{\"x\":1}\n\n", outs[0])
}

// TestDocsLinks: every relative link of the repository's Markdown pages names a file that
// exists and, with a #fragment, one of that page's headings.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, p := range []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md", "BENCHMARKS.md", "proxy/testdata/wire/README.md"} {
		pages = append(pages, filepath.Join(root, p))
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked, broken := 0, []string{}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(withoutCode(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, fragment, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			rel, _ := filepath.Rel(root, page)
			md, err := os.ReadFile(path)
			if fragment == "" && errors.Is(err, syscall.EISDIR) {
				err = nil
			}
			switch {
			case err != nil:
				broken = append(broken, rel+" links "+target+": no such file")
			case fragment != "" && !slices.Contains(headingSlugs(string(md)), fragment):
				broken = append(broken, rel+" links "+target+": no such heading")
			}
			checked++
		}
	}
	require.Empty(t, broken)
	require.Greater(t, checked, 20)
}

// withoutCode is a Markdown page without its fenced blocks.
func withoutCode(page string) string {
	var out []string
	fenced := false
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// headingSlugs are the anchors GitHub gives a page's headings: lower case, punctuation dropped,
// spaces as hyphens.
func headingSlugs(page string) []string {
	var slugs []string
	for _, l := range strings.Split(withoutCode(page), "\n") {
		h := strings.TrimLeft(l, "#")
		if h == l || !strings.HasPrefix(h, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slugs = append(slugs, b.String())
	}
	return slugs
}
