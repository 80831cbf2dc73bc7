package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// TestHostileBodiesMemory measures the built binary (without -race), as a client would meet it:
// one 8 MiB thread turn of each hostile shape raises a fresh process's peak RSS by at most 4×
// the body, and four at once keep it under 256 MiB.
func TestHostileBodiesMemory(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "wsproxy")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, upstreamtest.Completion("ok"))
	}))
	defer up.Close()
	const size = 8 << 20
	start := func(t *testing.T) (string, int) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		ln.Close()
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+dbtest.SchemaURL(t), "UPSTREAM_BASE_URL="+up.URL+"/v1", "ADMIN_TOKEN=test-admin-token-0123456789",
			"LISTEN_ADDR="+addr, "LOG_LEVEL=error")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		require.Eventually(t, func() bool {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		}, 30*time.Second, 50*time.Millisecond)
		// A warm-up turn: the baseline includes what every turn allocates once.
		turn(t, addr, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		return addr, cmd.Process.Pid
	}
	for _, hb := range upstreamtest.HostileBodies(size) {
		t.Run(hb.Name, func(t *testing.T) {
			addr, pid := start(t)
			before := peakRSS(t, pid)
			status := turn(t, addr, hb.Body)
			growth := peakRSS(t, pid) - before
			t.Logf("%s: status %d, peak RSS +%.1f MiB for a %.1f MiB body (%.2fx)", hb.Name, status,
				float64(growth)/(1<<20), float64(len(hb.Body))/(1<<20), float64(growth)/float64(len(hb.Body)))
			require.LessOrEqual(t, growth, int64(4*len(hb.Body)))
		})
	}
	t.Run("FourAtOnce", func(t *testing.T) {
		addr, pid := start(t)
		var wg sync.WaitGroup
		for _, hb := range upstreamtest.HostileBodies(size)[2:6] {
			wg.Go(func() { turn(t, addr, hb.Body) })
		}
		wg.Wait()
		peak := peakRSS(t, pid)
		t.Logf("four 8 MiB turns at once: peak RSS %.1f MiB", float64(peak)/(1<<20))
		require.Less(t, peak, int64(256<<20))
	})
}

// turn posts body as a thread turn and returns the status.
func turn(t *testing.T, addr string, body []byte) int {
	req, err := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("X-Thread-Id", "hostile")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	require.Contains(t, []int{200, 400}, resp.StatusCode)
	return resp.StatusCode
}

// peakRSS is a process's peak resident set size (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}
