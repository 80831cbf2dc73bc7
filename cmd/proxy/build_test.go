package main

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// runIn runs a command in dir and returns its combined output, failing the test when it fails.
func runIn(t *testing.T, dir string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %v:\n%s", name, args, out)
	return string(out)
}

// requireStatic fails unless the ELF binary at p is statically linked (no interpreter, no
// shared libraries), as a scratch image needs it.
func requireStatic(t *testing.T, p string) *elf.File {
	t.Helper()
	f, err := elf.Open(p)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	for _, prog := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, prog.Type, "%s has a dynamic loader", p)
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs, "%s links shared libraries", p)
	return f
}

// TestMakeBuild: `make build` stamps the version git describes, and the binary names itself
// wsproxy in its messages.
func TestMakeBuild(t *testing.T) {
	t.Parallel()
	dir := repoCopy(t)
	runIn(t, dir, "make", "build")
	bin := filepath.Join(dir, "bin", "wsproxy")
	requireStatic(t, bin)
	require.Equal(t, "wsproxy "+testVersion+"\n", runIn(t, dir, bin, "version"))
	require.Contains(t, runIn(t, dir, bin, "-h"), "usage: wsproxy [flags]")

	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	require.Equal(t, 1, exit.ExitCode(), "a bad configuration: %s", out)
	require.True(t, strings.HasPrefix(string(out), "wsproxy: DATABASE_URL is required"), "%s", out)
}

// TestPgBouncerTestsExist: every name in the Makefile's PGBOUNCER_TESTS is a test of the
// repository, so a renamed test cannot silently drop out of the PgBouncer run.
func TestPgBouncerTestsExist(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^PGBOUNCER_TESTS = \^\(([^)]*)\)\$\$$`).FindSubmatch(mk)
	require.NotNil(t, m, "the Makefile sets PGBOUNCER_TESTS = ^(A|B|...)$$")
	tests := map[string]bool{}
	def := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`)
	require.NoError(t, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		for _, m := range def.FindAllSubmatch(b, -1) {
			tests[string(m[1])] = true
		}
		return err
	}))
	names := strings.Split(string(m[1]), "|")
	require.Greater(t, len(names), 10)
	for _, name := range names {
		require.True(t, tests[name], "PGBOUNCER_TESTS names %s, which is no test", name)
	}
}

// roomImports is docs/architecture.md's table of rooms as a rule: each package of the module
// (its path in the module), the module's packages it may import (non-test code), and the
// packages its dependencies may never include, directly or not. Every package of the module
// must be here, so a new one is placed in the table.
var roomImports = map[string]struct {
	may   []string
	never []string
}{
	// The turn engine: never the user path, never Prometheus, never an HTTP server.
	"proxy/internal/turn": {may: []string{"tools", "workspace", "proxy/internal/apierr", "proxy/internal/rawjson", "proxy/internal/sse", "proxy/internal/genai"},
		never: []string{"proxy/internal/admin", "proxy/internal/mcp", "github.com/prometheus", "net/http/httputil"}},
	// The user path: never the turn engine.
	"proxy/internal/admin": {may: []string{"workspace", "proxy/internal/auth", "proxy/internal/apierr", "proxy/internal/eventhub", "proxy/internal/rawjson", "proxy/internal/sse"},
		never: []string{"proxy/internal/turn", "proxy/internal/mcp", "github.com/prometheus"}},
	// The agent path from outside: never the turn engine, never the user path.
	"proxy/internal/mcp": {may: []string{"tools", "workspace", "proxy/internal/auth", "proxy/internal/apierr", "proxy/internal/eventhub", "proxy/internal/genai", "proxy/internal/rawjson"},
		never: []string{"proxy/internal/turn", "proxy/internal/admin", "github.com/prometheus"}},
	// The edge: the rooms and what is shared below them; the database only through workspace.
	"proxy": {may: []string{"tools", "workspace", "proxy/internal/turn", "proxy/internal/admin", "proxy/internal/mcp", "proxy/internal/apierr", "proxy/internal/auth",
		"proxy/internal/eventhub", "proxy/internal/limits", "proxy/internal/rawjson", "proxy/internal/sse"}},
	// The domain: every statement through db; never the tools, HTTP, Prometheus or the proxy.
	"workspace": {may: []string{"db"}, never: []string{"tools", "net/http", "github.com/prometheus", "proxy"}},
	// The five tools: the database only through workspace; no HTTP.
	"tools": {may: []string{"workspace"}, never: []string{"net/http", "github.com/prometheus", "proxy"}},
	"db":    {never: []string{"net/http", "workspace", "tools", "proxy"}},
	// Shared below the rooms.
	"proxy/internal/apierr":   {may: []string{"workspace", "proxy/internal/rawjson"}},
	"proxy/internal/auth":     {may: []string{"workspace", "proxy/internal/apierr"}},
	"proxy/internal/eventhub": {may: []string{"workspace"}},
	"proxy/internal/genai":    {may: []string{"tools"}},
	"proxy/internal/limits":   {may: []string{"workspace"}},
	"proxy/internal/rawjson":  {},
	"proxy/internal/sse":      {},
	// The proposals' webhook, for the program: the domain's notices, no room's insides.
	"proxy/webhook": {may: []string{"workspace"}},
	// The tests' kit: imported by tests only (no row here allows it), never by a room's code.
	"proxy/internal/testkit": {may: []string{"workspace", "proxy/internal/auth", "proxy/internal/eventhub"},
		never: []string{"proxy/internal/turn", "proxy/internal/admin", "proxy/internal/mcp"}},
	// The demo model, the test upstream and the fake model know nothing of wsproxy's insides;
	// they write each wire API's answers with its one writer.
	"proxy/demo":              {may: []string{"proxy/upstreamtest/wire"}},
	"proxy/upstreamtest":      {may: []string{"proxy/demo", "proxy/upstreamtest/fake", "proxy/upstreamtest/wire"}},
	"proxy/upstreamtest/fake": {may: []string{"proxy/demo", "proxy/upstreamtest/wire"}},
	"proxy/upstreamtest/wire": {},
	// The programs.
	"":          {},
	"cmd/proxy": {may: []string{"*"}},
	"cmd/load":  {may: []string{"cmd/load/loadbench", "proxy/upstreamtest/fake"}},
	// The load tool's harness: from outside, over HTTP and the binary, as a client would; and,
	// for the floor under workspace writes (make bench-writes), the domain in its own process.
	"cmd/load/loadbench": {may: []string{"db", "db/dbfault", "workspace", "proxy/demo", "proxy/upstreamtest/fake"}},
	"db/dbfault":         {},
	"db/dbtest":          {may: []string{"db", "db/dbfault"}},
}

// TestRoomsImports checks the import graph against roomImports: a dialect cannot reach the
// panel, neither the admin REST nor MCP can start a turn, only workspace reaches the database,
// which never knows the tools.
func TestRoomsImports(t *testing.T) {
	t.Parallel()
	const module = "github.com/wsproxy/wsproxy"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}:{{join .Imports \" \"}}", module+"/...").Output()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
		rule, ok := roomImports[rel]
		require.True(t, ok, "package %q is not in roomImports (docs/architecture.md's table): place it", rel)
		seen[rel] = true
		for _, imp := range strings.Fields(imports) {
			dep, inModule := strings.CutPrefix(imp, module+"/")
			if !inModule || slices.Contains(rule.may, "*") {
				continue
			}
			require.Contains(t, rule.may, dep, "%s imports %s, which docs/architecture.md's table does not allow", pkg, imp)
		}
		if len(rule.never) == 0 {
			continue
		}
		deps, err := exec.Command("go", "list", "-deps", pkg).Output()
		require.NoError(t, err)
		for _, d := range strings.Fields(string(deps)) {
			for _, never := range rule.never {
				if !strings.Contains(strings.SplitN(never, "/", 2)[0], ".") && !strings.HasPrefix(never, "net/") {
					never = module + "/" + never // a package of the module
				}
				require.False(t, d == never || strings.HasPrefix(d, never+"/"), "%s depends on %s (never %s)", pkg, d, never)
			}
		}
	}
	for rel := range roomImports {
		require.True(t, seen[rel], "roomImports names %q, which is no package of the module", rel)
	}
}

// TestRoomsFiles checks docs/architecture.md's file map ("File by file") against the tree, as
// TestRoomsImports checks its table of rooms against the import graph. Each table of the map
// whose first column is "file" or "path" names, in that column, paths relative to its section's
// directory (the first path in the section's heading, else the repository's root): every one
// must exist. A path that is a directory names its Go files in the row's other cells (names or
// globs relative to it). Every Go file of the repository (tests, testdata and hidden directories
// aside) must be named so, and the failure says which file is missing from which row.
func TestRoomsFiles(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	const doc = "docs/architecture.md"
	b, err := os.ReadFile(filepath.Join(root, doc))
	require.NoError(t, err)
	m := parseFileMap(string(b))
	require.NotEmpty(t, m.sections, "%s has no \"## File by file\" tables", doc)

	isDir := func(rel string) bool { fi, err := os.Stat(filepath.Join(root, rel)); return err == nil && fi.IsDir() }
	named := map[string]bool{} // the Go files the map names, by their path in the repository
	type dirRow struct{ section, base, row string }
	dirRows := map[string]dirRow{} // a directory named by a row: where
	sectionOf := map[string]string{}
	for _, s := range m.sections {
		base := ""
		if s.dir != "" && isDir(s.dir) {
			base = s.dir
			sectionOf[base] = s.heading
		}
		for _, r := range s.rows {
			for _, name := range r.names {
				p := path.Join(base, name)
				if _, err := os.Stat(filepath.Join(root, p)); err != nil {
					t.Errorf("%s, %q, row %s: %s does not exist", doc, s.heading, r.first, p)
					continue
				}
				if !isDir(p) {
					if strings.HasSuffix(p, ".go") {
						named[p] = true
					}
					continue
				}
				dirRows[p] = dirRow{s.heading, base, r.first}
				for _, f := range r.rest {
					if !strings.HasSuffix(f, ".go") {
						continue
					}
					matches, err := filepath.Glob(filepath.Join(root, p, f))
					require.NoError(t, err)
					if len(matches) == 0 {
						t.Errorf("%s, %q, row %s: it names %s, which does not exist", doc, s.heading, r.first, path.Join(p, f))
					}
					for _, mt := range matches {
						rel, err := filepath.Rel(root, mt)
						require.NoError(t, err)
						named[filepath.ToSlash(rel)] = true
					}
				}
			}
		}
	}

	require.NoError(t, filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules" || n == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if named[rel] {
			return nil
		}
		dir, file := path.Split(rel)
		dir = strings.TrimSuffix(dir, "/")
		switch r, ok := dirRows[dir]; {
		case ok:
			t.Errorf("%s names no %s: add `%s` to the row %s of %q", doc, rel, file, r.row, r.section)
		case sectionOf[dir] != "":
			t.Errorf("%s names no %s: add a row `%s` to the table of %q", doc, rel, file, sectionOf[dir])
		default:
			// The nearest directory above it that has a section or a row, else "The rest"
			// (the repository's root).
			where, base := `"The rest"`, ""
			for up := path.Dir(dir); dir != "" && up != "."; up = path.Dir(up) {
				if h := sectionOf[up]; h != "" {
					where, base = fmt.Sprintf("the table of %q", h), up
					break
				}
				if r, ok := dirRows[up]; ok {
					where, base = fmt.Sprintf("%q (beside its row %s)", r.section, r.row), r.base
					break
				}
			}
			if dir == "" {
				t.Errorf("%s names no %s: add a row `%s` to %s", doc, rel, file, where)
				break
			}
			t.Errorf("%s names no %s, and no row or section covers %s/: add a row `%s/` naming `%s` to %s",
				doc, rel, dir, strings.TrimPrefix(strings.TrimPrefix(dir, base), "/"), file, where)
		}
		return nil
	}))
}

// fileMap is docs/architecture.md's "File by file": its sections and their file tables' rows.
type fileMap struct {
	sections []fileSection
}

type fileSection struct {
	heading string // the heading's text
	dir     string // the first path in backquotes in the heading, without its trailing slash
	rows    []fileRow
}

type fileRow struct {
	first string   // the first cell, as written
	names []string // the paths in backquotes in the first cell
	rest  []string // the names in backquotes in the other cells
}

// parseFileMap reads the tables under "## File by file" up to the next second-level heading.
// Only tables whose header's first cell is "file" or "path" are file tables.
func parseFileMap(doc string) fileMap {
	quoted := regexp.MustCompile("`([^`]+)`")
	names := func(s string) []string {
		var out []string
		for _, m := range quoted.FindAllStringSubmatch(s, -1) {
			out = append(out, m[1])
		}
		return out
	}
	var fm fileMap
	in, fileTable, header := false, false, false
	for line := range strings.Lines(doc) {
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "## "):
			in = strings.HasPrefix(line, "## File by file")
			continue
		case !in:
			continue
		case strings.HasPrefix(line, "### "):
			s := fileSection{heading: strings.TrimPrefix(line, "### ")}
			if n := names(s.heading); len(n) > 0 {
				s.dir = strings.TrimSuffix(n[0], "/")
			}
			fm.sections = append(fm.sections, s)
			continue
		case !strings.HasPrefix(line, "|"):
			header = false
			continue
		}
		if len(fm.sections) == 0 {
			fm.sections = append(fm.sections, fileSection{heading: "File by file"})
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !header { // a table's first line
			header = true
			first := strings.TrimSpace(cells[0])
			fileTable = first == "file" || first == "path"
			continue
		}
		if !fileTable || strings.HasPrefix(line, "|--") || strings.HasPrefix(line, "|:-") {
			continue
		}
		s := &fm.sections[len(fm.sections)-1]
		s.rows = append(s.rows, fileRow{
			first: strings.TrimSpace(cells[0]),
			names: names(cells[0]),
			rest:  names(strings.Join(cells[1:], "|")),
		})
	}
	return fm
}
