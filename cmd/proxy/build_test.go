package main

import (
	"debug/elf"
	"os"
	"os/exec"
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
		"proxy/internal/eventhub", "proxy/internal/rawjson", "proxy/internal/sse"}},
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
	"proxy/internal/rawjson":  {},
	"proxy/internal/sse":      {},
	// The demo model, the test upstream and the fake model know nothing of wsproxy's insides.
	"proxy/demo":              {},
	"proxy/upstreamtest":      {may: []string{"proxy/demo", "proxy/upstreamtest/fake"}},
	"proxy/upstreamtest/fake": {may: []string{"proxy/demo"}},
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
