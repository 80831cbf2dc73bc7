package testkit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/workspace"
)

// EventStream reads an admin event stream (docs/spec.md's /admin/v1/threads/{id}/events/stream).
type EventStream struct {
	t    testing.TB
	Resp *http.Response
	RD   *bufio.Reader // Resp's body
}

// OpenStream opens thread's event stream at base with the admin token, with Last-Event-ID
// lastID and ?after=after when they are not empty.
func OpenStream(t testing.TB, base, thread, lastID, after string) *EventStream {
	t.Helper()
	s, err := DialStream(t, base, thread, lastID, after)
	require.NoError(t, err)
	return s
}

// DialStream is OpenStream for a goroutine other than the test's, which must not call
// t.FailNow: it returns what went wrong. The stream is closed when the test ends.
func DialStream(t testing.TB, base, thread, lastID, after string) (*EventStream, error) {
	u := base + "/admin/v1/threads/" + thread + "/events/stream"
	if after != "" {
		u += "?after=" + after
	}
	req, err := http.NewRequest("GET", u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+AdminToken)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req) // returns with the headers: they come at once
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { resp.Body.Close() })
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		return nil, fmt.Errorf("stream of %s: %s, %s", thread, resp.Status, ct)
	}
	return &EventStream{t: t, Resp: resp, RD: bufio.NewReader(resp.Body)}, nil
}

// Next reads the next event: its id and data. An event that has not come within a minute (at
// once; a minute on a busy machine) fails the test: the stream is closed.
func (s *EventStream) Next() (string, workspace.Event) {
	s.t.Helper()
	id, ev, err := s.Read()
	require.NoError(s.t, err)
	return id, ev
}

// Read is Next for a goroutine other than the test's: it returns what went wrong.
func (s *EventStream) Read() (string, workspace.Event, error) {
	late := time.AfterFunc(time.Minute, func() { s.Resp.Body.Close() })
	defer late.Stop()
	var id string
	for {
		line, err := s.RD.ReadString('\n')
		if err != nil {
			return "", workspace.Event{}, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			var ev workspace.Event
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
				return "", ev, err
			}
			if id != strconv.FormatInt(ev.ID, 10) {
				return "", ev, fmt.Errorf("event %d under the id %q", ev.ID, id)
			}
			return id, ev, nil
		}
	}
}
