package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
)

// TestGCPercent: the GOGC for a live heap puts Go's heap goal at the floor while the live heap is
// under half of it, and is Go's default above.
func TestGCPercent(t *testing.T) {
	t.Parallel()
	const floor = 16 << 20
	for _, c := range []struct {
		live uint64
		want int
	}{{0, 400}, {1 << 20, 400}, {2 << 20, 400}, {4 << 20, 300}, {6 << 20, 166}, {8 << 20, 100}, {100 << 20, 100}} {
		got := gcPercent(c.live, floor)
		require.Equal(t, c.want, got, "live heap %d", c.live)
		// Go's goal: the larger of live×(1+GOGC/100) and 4 MB×GOGC/100.
		goal := max(c.live*uint64(100+got)/100, uint64(4<<20)*uint64(got)/100)
		if 2*c.live < floor {
			require.InDelta(t, floor, goal, 0.02*floor, "live heap %d", c.live)
		} else {
			require.Equal(t, 2*c.live, goal, "live heap %d", c.live)
		}
	}
}

// TestTuneGCFollowsTheLiveHeap runs the tuner in a process of its own (it sets the process's
// GOGC): after each collection GOGC is the one for the live heap that collection found.
func TestTuneGCFollowsTheLiveHeap(t *testing.T) {
	if os.Getenv("WSPROXY_TUNE_GC_CHILD") == "" {
		t.Parallel()
		cmd := exec.Command(os.Args[0], "-test.run=^TestTuneGCFollowsTheLiveHeap$", "-test.v")
		cmd.Env = append(os.Environ(), "WSPROXY_TUNE_GC_CHILD=1", "GOGC=100") // Go's default, whatever the tests run with
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestTuneGCFollowsTheLiveHeap")
		return
	}
	const floor = 32 << 20
	read := func(name string) uint64 {
		s := []metrics.Sample{{Name: name}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	gogc := func() int { return int(read("/gc/gogc:percent")) }
	// atFloor checks that Go's heap goal is the floor (within the stacks and globals it adds).
	atFloor := func() {
		goal := read("/gc/heap/goal:bytes")
		require.InDelta(t, floor, goal, 0.1*floor, "heap goal %d, GOGC %d, live heap %d", goal, gogc(), liveHeap())
	}
	// collect runs a collection and waits for the tuner's cleanup to have set GOGC for it.
	collect := func() {
		runtime.GC()
		// The tuner sets GOGC for the live heap of the last collection it saw: on a busy machine
		// the runtime may collect again meanwhile, so the live heap is read with GOGC each time.
		// A collection may also find the tuner's object still reachable (the cleanup that made
		// it had just run), and then its cleanup waits for the next one, which nothing here
		// would start: every 100th poll collects again.
		polls := 0
		require.Eventually(t, func() bool {
			if polls++; polls%100 == 0 {
				runtime.GC()
			}
			return gogc() == gcPercent(liveHeap(), floor)
		}, time.Minute, time.Millisecond, "GOGC %d for a live heap of %d", gogc(), liveHeap())
	}
	runtime.GC()
	require.Equal(t, 100, gogc()) // Go's default before the tuner runs
	tuneGC(floor)
	atFloor()
	collect()
	atFloor()
	held := make([][]byte, 24)
	for i := range held {
		held[i] = make([]byte, 1<<20)
	}
	collect() // 24 MB live: above half the floor, Go's default
	require.Equal(t, 100, gogc())
	runtime.KeepAlive(held)
	held = nil
	collect()
	atFloor()
}

// TestHeapFloorInTheBinary: the built proxy starts with the heap floor, unless GOGC is set.
func TestHeapFloorInTheBinary(t *testing.T) {
	t.Parallel()
	bin := wsproxyBinary(t)
	for _, c := range []struct {
		env         []string
		gogc        int
		goalAtLeast float64
	}{{[]string{"GOGC="}, 400, heapFloor}, {[]string{"GOGC=100"}, 100, 0}} { // "GOGC=": unset, whatever the tests run with
		r := startReplica(t, bin, append([]string{"DATABASE_URL=" + dbtest.SchemaURL(t), "UPSTREAM_BASE_URL=http://127.0.0.1:1/v1"}, c.env...)...)
		resp, err := http.Get("http://" + r.addr + "/metrics")
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		m := map[string]float64{}
		for line := range strings.Lines(string(b)) {
			if name, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && !strings.HasPrefix(name, "#") {
				m[name], _ = strconv.ParseFloat(v, 64)
			}
		}
		require.Equal(t, float64(c.gogc), m["go_gc_gogc_percent"], "%v", c.env)
		if c.goalAtLeast > 0 {
			require.GreaterOrEqual(t, m["go_memstats_next_gc_bytes"], c.goalAtLeast)
		} else {
			require.Less(t, m["go_memstats_next_gc_bytes"], float64(heapFloor))
		}
	}
}
