package turn

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/workspace"
)

// script is an Upstream without HTTP: each round gets the next of its replies (a body, or an
// error), and it keeps the bodies it was sent.
type script struct {
	mu      sync.Mutex
	replies []scripted
	sent    [][]byte
	// read is how much of the body being answered the proxy has read.
	read *countingReader
}

// scripted is one reply of a script: body, or err when set.
type scripted struct {
	body string
	err  error
}

func (s *script) Post(_ context.Context, body Payload) (*UpstreamResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, body.joined())
	next := s.replies[0]
	s.replies = s.replies[1:]
	if next.err != nil {
		return nil, next.err
	}
	s.read = &countingReader{r: strings.NewReader(next.body)}
	return &UpstreamResponse{Header: map[string][]string{}, Body: io.NopCloser(s.read)}, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// bodies are the replies of a script, one body each.
func bodies(bs ...string) []scripted {
	out := make([]scripted, len(bs))
	for i, b := range bs {
		out[i] = scripted{body: b}
	}
	return out
}

// event is one event a streamed turn emitted.
type event struct {
	name string
	data []byte
}

// recorder is an Emitter that keeps every event; onEmit, when set, sees each as it comes.
type recorder struct {
	events []event
	onEmit func(event)
}

func (r *recorder) Emit(name string, data []byte) error {
	e := event{name: name, data: append([]byte(nil), data...)}
	r.events = append(r.events, e)
	if r.onEmit != nil {
		r.onEmit(e)
	}
	return nil
}

func (r *recorder) Flush() error { return nil }

// decoded is each event's data decoded.
func (r *recorder) decoded(t *testing.T) []map[string]any {
	t.Helper()
	out := make([]map[string]any, len(r.events))
	for i, e := range r.events {
		require.NoError(t, json.Unmarshal(e.data, &out[i]), string(e.data))
	}
	return out
}

// newTurn is a turn of a new thread of a store with limits, toward up.
func newTurn(t *testing.T, limits workspace.Limits, up Upstream) *Turn {
	t.Helper()
	ws := workspace.NewStore(dbtest.NewPool(t, nil), workspace.Options{Limits: limits}).Workspace(workspace.ThreadID{Name: t.Name()})
	start, err := ws.StartTurn(context.Background(), workspace.TurnOptions{})
	require.NoError(t, err)
	return &Turn{Workspace: ws, Start: start, Model: "m", Upstream: up}
}

// sseEvents is the SSE text of data events, each under its name when it has one ("name\ndata").
func sseEvents(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		if name, data, ok := strings.Cut(e, "\n"); ok {
			b.WriteString("event: " + name + "\ndata: " + data + "\n\n")
			continue
		}
		b.WriteString("data: " + e + "\n\n")
	}
	return b.String()
}
