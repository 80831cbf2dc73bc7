package admin

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// twoReplicas are two servers on one database whose event streams only their hubs
// wake, following the threads (no heartbeat).
func twoReplicas(t *testing.T) (*env, *env) {
	noHeartbeat := func(o *Options) { o.Heartbeat = time.Hour }
	e := setup(t, noHeartbeat)
	return e, setupWithPool(t, e.pool, noHeartbeat)
}

// TestEventStream: a stream gets each new event as it commits — from this replica or another on
// the same Postgres — resumes after Last-Event-ID without a gap or a repeat, and ends when the
// server closes (as the proxy's shutdown closes it).
func TestEventStream(t *testing.T) {
	t.Parallel()
	e, other := twoReplicas(t)
	e.admin("PUT", "/admin/v1/threads/live/objective", map[string]any{"text": "Before the stream"}, 200, nil)

	s := e.openStream("live", "", "")
	e.admin("POST", "/admin/v1/threads/live/preferences", map[string]any{"title": "One"}, 201, nil)
	id, ev := s.Next()
	require.Equal(t, "2", id, "only what commits after the stream opened")
	require.Equal(t, "preference_added", ev.Kind)
	// A change through the other replica reaches this one's stream (its hub follows the thread).
	other.admin("POST", "/admin/v1/threads/live/preferences", map[string]any{"title": "Two"}, 201, nil)
	id, _ = s.Next()
	require.Equal(t, "3", id)
	s.Resp.Body.Close()

	// Changes while away; a reconnect with Last-Event-ID gets them, in order, once.
	e.admin("POST", "/admin/v1/threads/live/preferences", map[string]any{"title": "Three"}, 201, nil)
	e.admin("PUT", "/admin/v1/threads/live/objective", map[string]any{"text": "After"}, 200, nil)
	s = other.openStream("live", "3", "")
	for _, want := range []string{"4", "5"} {
		id, _ := s.Next()
		require.Equal(t, want, id)
	}
	e.admin("DELETE", "/admin/v1/threads/live/preferences/1", nil, 204, nil)
	id, ev = s.Next()
	require.Equal(t, "6", id)
	require.Equal(t, "preference_removed", ev.Kind)

	// An idle stream gets a comment line at each heartbeat.
	beating := setupWithPool(t, e.pool, func(o *Options) { o.Heartbeat = 20 * time.Millisecond })
	idle := beating.openStream("live", "", "")
	for {
		line, err := idle.RD.ReadString('\n')
		require.NoError(t, err)
		if line == ": heartbeat\n" {
			break
		}
	}

	// Closing the server ends the stream.
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, s.Resp.Body); done <- err }()
	go other.server.Close()
	select {
	case <-done:
	case <-time.After(time.Minute): // at once; a minute on a busy machine
		t.Fatal("the stream did not end when the server closed")
	}
}

// TestEventStreamAfter: a stream opened with ?after= the last event a read saw first gets every
// later event — one committed between the read and the stream's open included — without a
// repeat; Last-Event-ID (a reconnecting EventSource keeps its URL) wins over it; an after that is
// not an event id is a 400.
func TestEventStreamAfter(t *testing.T) {
	t.Parallel()
	e := setup(t, func(o *Options) { o.Heartbeat = time.Hour }) // only the commits wake the stream
	e.admin("PUT", "/admin/v1/threads/gap/objective", map[string]any{"text": "Read by the page"}, 200, nil)
	var page struct{ Data []workspace.Event }
	e.admin("GET", "/admin/v1/threads/gap/events", nil, 200, &page)
	require.NotEmpty(t, page.Data)
	read := page.Data[len(page.Data)-1].ID

	// Committed after the read, before the stream opens.
	e.admin("POST", "/admin/v1/threads/gap/preferences", map[string]any{"title": "Between"}, 201, nil)
	s := e.openStream("gap", "", itoa(read))
	e.admin("POST", "/admin/v1/threads/gap/preferences", map[string]any{"title": "After"}, 201, nil)
	id, ev := s.Next()
	require.Equal(t, itoa(read+1), id, "the change committed between the read and the stream's open")
	require.Equal(t, "preference_added", ev.Kind)
	require.Contains(t, string(ev.After), `"Between"`)
	id, ev = s.Next()
	require.Equal(t, itoa(read+2), id)
	require.Contains(t, string(ev.After), `"After"`)

	// A reconnect carries both: it resumes after Last-Event-ID.
	s = e.openStream("gap", itoa(read+1), itoa(read))
	id, _ = s.Next()
	require.Equal(t, itoa(read+2), id, "after Last-Event-ID, not after ?after=")

	for _, bad := range []string{"x", "-1", "1.5"} {
		var out struct{ Error apierr.Error }
		e.admin("GET", "/admin/v1/threads/gap/events/stream?after="+bad, nil, 400, &out)
		require.Equal(t, "after", out.Error.Param, bad)
	}
}

// TestEventStreamsAcrossABurst: 1,000 events on 100 threads, written through one replica while
// each thread's stream is open on the other and reconnects halfway with Last-Event-ID: every
// stream gets each of its thread's events once, in order, woken only by the other replica's
// commits (no heartbeat) — docs/spec.md §13.
func TestEventStreamsAcrossABurst(t *testing.T) {
	t.Parallel()
	writer, reader := twoReplicas(t)
	const threads, each = 100, 10
	name := func(i int) string { return "burst-" + itoa(int64(i)) }
	for i := range threads {
		writer.admin("PUT", "/admin/v1/threads/"+name(i)+"/objective", map[string]any{"text": "Open"}, 200, nil)
	}
	streams := make([]*testkit.EventStream, threads)
	for i := range threads {
		streams[i] = reader.openStream(name(i), "1", "")
	}

	writes := make(chan int, threads*each)
	for n := range each {
		for i := range threads {
			writes <- i*each + n
		}
	}
	close(writes)
	var wg sync.WaitGroup
	failed := make(chan string, threads*each)
	for range 8 {
		wg.Go(func() {
			for w := range writes {
				i, n := w/each, w%each
				req, _ := http.NewRequest("POST", writer.srv.URL+"/admin/v1/threads/"+name(i)+"/preferences",
					strings.NewReader(`{"title":"Item `+itoa(int64(n))+`"}`))
				req.Header.Set("Authorization", "Bearer "+adminToken)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					failed <- err.Error()
					continue
				}
				if resp.StatusCode != 201 {
					failed <- resp.Status
				}
				resp.Body.Close()
			}
		})
	}

	got := make([][]string, threads)
	var readers sync.WaitGroup
	for i := range threads {
		readers.Go(func() { // t.Error only: FailNow belongs to the test's own goroutine
			s := streams[i]
			for len(got[i]) < each {
				if len(got[i]) == each/2 { // away, then back with the last id it read
					s.Resp.Body.Close()
					var err error
					if s, err = reader.dialStream(name(i), got[i][len(got[i])-1], ""); err != nil {
						t.Error(err)
						return
					}
				}
				id, _, err := s.Read()
				if err != nil {
					t.Errorf("thread %s after %v: %v", name(i), got[i], err)
					return
				}
				got[i] = append(got[i], id)
			}
		})
	}
	wg.Wait()
	close(failed)
	for f := range failed {
		t.Error("a write failed:", f)
	}
	readers.Wait()
	want := make([]string, each)
	for n := range each {
		want[n] = itoa(int64(n + 2))
	}
	for i := range threads {
		require.Equal(t, want, got[i], "thread %s", name(i))
	}
}
