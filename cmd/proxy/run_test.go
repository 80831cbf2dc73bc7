package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMakeRunFromAnyFolder is the README's first command as a newcomer types it: `make run` in
// a copy of the repository in a fresh temporary folder (which, as root, the postgres user cannot
// enter), with nothing configured. It serves /readyz 200 on the demo model, and Ctrl-C stops it
// and its cluster.
func TestMakeRunFromAnyFolder(t *testing.T) {
	t.Parallel()
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()

	cmd := exec.Command("make", "run")
	cmd.Dir = dir
	var env []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "DATABASE_URL", "TEST_DATABASE_URL", "UPSTREAM_BASE_URL", "OPENAI_API_KEY", "ADMIN_TOKEN", "LISTEN_ADDR":
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "LISTEN_ADDR="+addr)
	out := &syncBuffer{} // written by the command's goroutines while the test reads it
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		// As root, the cluster lived outside the folder: remove it too.
		if m := regexp.MustCompile(`keeping its PostgreSQL cluster in (\S+)/pg`).FindStringSubmatch(out.String()); m != nil {
			_ = os.RemoveAll(m[1])
		}
	})

	ready := func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}
	deadline := time.Now().Add(3 * time.Minute)
	for !ready() {
		select {
		case err := <-done:
			stopped = true
			t.Fatalf("make run exited (%v):\n%s", err, out.String())
		case <-time.After(200 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "not ready after 3 minutes:\n%s", out.String())
	}
	if os.Geteuid() == 0 {
		require.Contains(t, out.String(), "keeping its PostgreSQL cluster in /var/lib/wsproxy/", "as root, the cluster lives where postgres can reach it")
	}

	require.NoError(t, syscall.Kill(-cmd.Process.Pid, syscall.SIGINT), "Ctrl-C")
	select {
	case <-done:
		stopped = true
	case <-time.After(time.Minute):
		t.Fatalf("make run did not stop on Ctrl-C:\n%s", out.String())
	}
	require.False(t, ready(), "the proxy stopped")
}
