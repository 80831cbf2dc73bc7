package main

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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

// TestRoomsImports: the turn engine, the user path and MCP meet only in tools and Postgres — none
// imports another — and the turn engine knows no Prometheus (docs/architecture.md).
func TestRoomsImports(t *testing.T) {
	t.Parallel()
	deps := func(pkg string) string {
		out, err := exec.Command("go", "list", "-deps", "github.com/wsproxy/wsproxy/"+pkg).Output()
		require.NoError(t, err)
		return string(out)
	}
	turn, admin, mcp := deps("proxy/internal/turn"), deps("proxy/internal/admin"), deps("proxy/internal/mcp")
	require.NotContains(t, turn, "wsproxy/proxy/internal/admin")
	require.NotContains(t, turn, "prometheus")
	require.NotContains(t, admin, "wsproxy/proxy/internal/turn")
	require.NotContains(t, mcp, "wsproxy/proxy/internal/turn")
	require.NotContains(t, mcp, "wsproxy/proxy/internal/admin")
	require.Contains(t, turn, "wsproxy/tools")
	require.Contains(t, admin, "wsproxy/tools")
}
