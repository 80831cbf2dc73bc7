package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// testVersion is the VERSION of the repository copies: what `make build` stamps in them.
const testVersion = "v0.0.0-test"

// repoCopy is a clone as a user has it: the repository's files (tracked and untracked, not
// ignored) in a fresh temporary folder, committed there, its VERSION testVersion. When the test
// ends, the PostgreSQL cluster of its .data is stopped (and, as root, removed from
// /var/lib/wsproxy).
func repoCopy(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "wsproxy")
	files, err := exec.Command("git", "-C", root, "ls-files", "-co", "--exclude-standard").Output()
	require.NoError(t, err, "git ls-files")
	for _, f := range strings.Split(strings.TrimSpace(string(files)), "\n") {
		src, dst := filepath.Join(root, f), filepath.Join(dir, f)
		info, err := os.Stat(src)
		if err != nil {
			continue // deleted in the work tree
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst, b, info.Mode()))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "VERSION"), []byte(testVersion+"\n"), 0o644))
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A"},
		{"-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q", "-m", "copy"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
	}
	t.Cleanup(func() {
		stop := exec.Command("bash", "-c", `[ -d .data ] || exit 0
			scripts/pg.sh stop .data
			if [ "$(id -u)" = 0 ]; then rm -rf "/var/lib/wsproxy/$(cd .data && printf '%s' "$PWD" | cksum | cut -d' ' -f1)"; fi`)
		stop.Dir = dir
		if out, err := stop.CombinedOutput(); err != nil {
			t.Logf("stop the cluster of %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// freeAddr is a loopback address with a free port, for a process that binds it seconds later
// (make run builds and starts Postgres first). The port is below Linux's ephemeral range
// (32768–60999 by default): a port from that range, as 127.0.0.1:0 gives, could meanwhile become
// the source port of any outgoing connection of the parallel tests ("address already in use").
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 20000+rand.IntN(12000)))
		if err != nil {
			continue // taken: another
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	t.Fatal("no free port in 20000–31999 after 100 tries")
	return ""
}

// makeRun is one `make run` a test started.
type makeRun struct {
	t    *testing.T
	addr string
	cmd  *exec.Cmd
	out  *syncBuffer // written by the command's goroutines while the test reads it
	done chan struct{}
	err  error // the command's result, once done is closed
}

// startMakeRun starts `make run` in dir on addr, with nothing else of wsproxy's configured but
// env; it is killed when the test ends, if still running.
func startMakeRun(t *testing.T, dir, addr string, env ...string) *makeRun {
	t.Helper()
	r := &makeRun{t: t, addr: addr, cmd: exec.Command("make", "run"), out: &syncBuffer{}, done: make(chan struct{})}
	r.cmd.Dir = dir
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "DATABASE_URL", "TEST_DATABASE_URL", "UPSTREAM_BASE_URL", "UPSTREAM_API_KEY", "OPENAI_API_KEY", "CLIENT_KEYS",
			"ADMIN_TOKEN", "LISTEN_ADDR":
			continue
		}
		r.cmd.Env = append(r.cmd.Env, kv)
	}
	r.cmd.Env = append(r.cmd.Env, append(env, "LISTEN_ADDR="+addr)...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, r.cmd.Start())
	go func() { r.err = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
	})
	return r
}

// ready reports whether /readyz at addr answers 200.
func ready(addr string) bool {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// patience is how long a wait on make run may last: until shortly before the test binary's own
// deadline (go test -timeout). make run builds wsproxy first, which on a machine busy with other
// builds takes minutes; a fixed bound failed there while nothing was wrong.
func patience(t *testing.T) <-chan time.Time {
	deadline, ok := t.Deadline()
	if !ok {
		return nil // no deadline: wait for make run itself
	}
	return time.After(time.Until(deadline) - 30*time.Second)
}

// waitReady waits for /readyz to answer 200 and the banner to show, failing when make run exits
// first.
func (r *makeRun) waitReady() {
	r.t.Helper()
	giveUp := patience(r.t)
	for !ready(r.addr) || !strings.Contains(r.out.String(), "Try it:") {
		select {
		case <-r.done:
			r.t.Fatalf("make run exited (%v):\n%s", r.err, r.out.String())
		case <-giveUp:
			r.t.Fatalf("not ready by the test's deadline:\n%s", r.out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// wait waits for make run to exit by itself and returns its result.
func (r *makeRun) wait() error {
	r.t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-patience(r.t):
		r.t.Fatalf("make run still running at the test's deadline:\n%s", r.out.String())
		return nil
	}
}

// interrupt is Ctrl-C in make run's terminal; it waits for make run to exit.
func (r *makeRun) interrupt() {
	r.t.Helper()
	require.NoError(r.t, syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT), "Ctrl-C")
	select {
	case <-r.done:
	case <-time.After(time.Minute):
		r.t.Fatalf("make run did not stop on Ctrl-C:\n%s", r.out.String())
	}
	require.False(r.t, ready(r.addr), "the proxy stopped")
}

// TestMakeRunFromAnyFolder is the README's first command as a newcomer types it: `make run` in
// a clone in a fresh temporary folder (which, as root, the postgres user cannot enter), with
// nothing configured. It serves /readyz 200 on the demo model, says so only once it does, with
// the version git describes; the admin token it writes is readable by its owner only; Ctrl-C
// stops it and the cluster it started.
func TestMakeRunFromAnyFolder(t *testing.T) {
	t.Parallel()
	dir := repoCopy(t)
	r := startMakeRun(t, dir, freeAddr(t))
	r.waitReady()
	out := r.out.String()
	if os.Geteuid() == 0 {
		require.Contains(t, out, "keeping its PostgreSQL cluster in /var/lib/wsproxy/", "as root, the cluster lives where postgres can reach it")
	}
	require.Contains(t, out, "version="+testVersion, "the start line names the version make stamped")
	serving, banner := strings.Index(out, `msg="wsproxy serving"`), strings.Index(out, "Try it:")
	require.True(t, serving >= 0 && banner > serving, "the banner comes once the proxy serves:\n%s", out)
	info, err := os.Stat(filepath.Join(dir, ".data", "admin-token"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the admin token is a secret")

	r.interrupt()
	status := exec.Command("scripts/pg.sh", "running", ".data")
	status.Dir = dir
	require.Error(t, status.Run(), "the cluster this make run started is stopped")
}

// TestMakeRunTwiceInOneFolder: a second `make run` in the same folder never breaks the first.
// On the first one's port it refuses, saying why; on another port it uses the running cluster
// and leaves it running when it stops; and the first, stopped while another still uses the
// cluster it started, leaves it running too.
func TestMakeRunTwiceInOneFolder(t *testing.T) {
	t.Parallel()
	dir := repoCopy(t)
	// An admin token as an earlier make run left it, readable by all.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, ".data"), 0o755))
	token := filepath.Join(dir, ".data", "admin-token")
	require.NoError(t, os.WriteFile(token, []byte("wsp_earlier_0123456789abcdef"), 0o644))

	first := startMakeRun(t, dir, freeAddr(t))
	first.waitReady()
	info, err := os.Stat(token)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "an admin token left readable by all is made private")
	require.Contains(t, first.out.String(), "wsp_earlier_0123456789abcdef", "the token kept from the earlier run")

	busy := startMakeRun(t, dir, first.addr)
	require.Error(t, busy.wait(), "a make run that cannot listen fails")
	require.Contains(t, busy.out.String(), "in use")
	require.NotContains(t, busy.out.String(), "Try it:")
	require.True(t, ready(first.addr), "the first make run still answers:\n%s", busy.out.String())

	second := startMakeRun(t, dir, freeAddr(t))
	second.waitReady()
	require.Contains(t, second.out.String(), "using the PostgreSQL cluster already running")
	second.interrupt()
	require.True(t, ready(first.addr), "the first make run still answers once the second stopped:\n%s", second.out.String())

	third := startMakeRun(t, dir, freeAddr(t))
	third.waitReady()
	first.interrupt()
	require.True(t, ready(third.addr), "a make run still answers once the one that started the cluster stopped:\n%s", first.out.String())
	third.interrupt()
}

// TestMakeRunWithClientKeys: with CLIENT_KEYS set, the banner's examples carry a client's key
// (from KEY, named by its client, never printed) and read that client's thread; run as printed,
// with KEY set, they work.
func TestMakeRunWithClientKeys(t *testing.T) {
	t.Parallel()
	const key = "sk-alice-0123456789abcdef0123456789"
	r := startMakeRun(t, repoCopy(t), freeAddr(t), "DATABASE_URL="+dbtest.SchemaURL(t), "CLIENT_KEYS=alice="+key+",bob=sk-bob-0123456789abcdef0123456789")
	r.waitReady()
	out := r.out.String()
	require.NotContains(t, out, key, "the banner never prints a client's key")
	_, examples, _ := strings.Cut(out, "Try it:\n")
	examples, _, _ = strings.Cut(examples, "\n\n")
	require.Contains(t, examples, "# CLIENT_KEYS is set: each /v1 request needs a client's key. First: KEY=<alice's key>\n")
	require.Contains(t, examples, `-H "Authorization: Bearer $KEY"`)
	require.Contains(t, examples, "/admin/v1/threads/alice~demo ")

	run := exec.Command("bash", "-c", "set -e\n"+strings.ReplaceAll(examples, "curl -s", "curl -s --fail-with-body"))
	run.Env = append(os.Environ(), "KEY="+key)
	got, err := run.CombinedOutput()
	require.NoError(t, err, "the examples as printed:\n%s\nprint:\n%s", examples, got)
	require.Contains(t, string(got), "objective set: Plan a trip to Lisbon")
	require.Contains(t, string(got), `"id":"alice~demo"`)
	r.interrupt()
}

// TestMakeRunFailedStart: when the proxy cannot start, make run fails, says why, and shows no
// banner.
func TestMakeRunFailedStart(t *testing.T) {
	t.Parallel()
	dir := repoCopy(t)
	t.Run("BadDatabaseURL", func(t *testing.T) {
		r := startMakeRun(t, dir, freeAddr(t), "DATABASE_URL=postgres://nobody@127.0.0.1:1/none?connect_timeout=2", "DATABASE_WAIT=1s")
		err := r.wait()
		require.Error(t, err, "make run fails:\n%s", r.out.String())
		require.Contains(t, r.out.String(), "wsproxy: DATABASE_URL: Postgres did not answer within DATABASE_WAIT (1s):")
		require.NotContains(t, r.out.String(), "Try it:")
	})
	t.Run("BusyPort", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		r := startMakeRun(t, dir, ln.Addr().String(), "DATABASE_URL="+dbtest.SchemaURL(t))
		require.Error(t, r.wait(), "make run fails:\n%s", r.out.String())
		require.Contains(t, r.out.String(), "in use")
		require.NotContains(t, r.out.String(), "Try it:")
	})
}
