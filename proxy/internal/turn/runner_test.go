package turn

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/db/dbtest"
	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// emitFunc is an Emitter that hands each chunk to a function and flushes nothing.
type emitFunc func(chunk []byte) error

func (f emitFunc) Emit(_ string, chunk []byte) error { return f(chunk) }
func (f emitFunc) Flush() error                      { return nil }

// fakeUpstream is an Upstream without HTTP: each call returns the next scripted body and records
// the request body's size.
type fakeUpstream struct {
	mu     sync.Mutex
	bodies []func() io.Reader
	sizes  []int
}

func (f *fakeUpstream) Post(_ context.Context, body Payload) (*UpstreamResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sizes = append(f.sizes, body.Len())
	next := f.bodies[0]
	f.bodies = f.bodies[1:]
	return &UpstreamResponse{Body: io.NopCloser(next())}, nil
}

// longStream is an SSE stream of n content chunks of size bytes, each with logprobs, then the
// given tail chunks.
func longStream(n, size int, tail ...string) func() io.Reader {
	piece := strings.Repeat("x", size)
	chunk := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + piece +
		`"},"logprobs":{"content":[{"token":"x","logprob":-0.5,"bytes":[120],"top_logprobs":[]}]},"finish_reason":null}]}` + "\n\n"
	return func() io.Reader {
		readers := make([]io.Reader, 0, n+1)
		for range n {
			readers = append(readers, strings.NewReader(chunk))
		}
		var t bytes.Buffer
		for _, c := range tail {
			t.WriteString("data: " + c + "\n\n")
		}
		t.WriteString("data: [DONE]\n\n")
		return io.MultiReader(append(readers, &t)...)
	}
}

// TestRunnerKeepsOnlyWhatTheNextRoundNeeds streams 16 MiB of content with logprobs, followed by
// a workspace tool call: the client gets every byte, and the next round carries at most
// maxRoundText of it.
func TestRunnerKeepsOnlyWhatTheNextRoundNeeds(t *testing.T) {
	t.Parallel()
	store := workspace.NewStore(dbtest.NewPool(t, nil), workspace.Options{})
	ws := store.Workspace(workspace.ThreadID{Name: "long"})
	turn, err := ws.StartTurn(context.Background(), workspace.TurnOptions{})
	require.NoError(t, err)
	const n, size = 4096, 4096
	up := &fakeUpstream{bodies: []func() io.Reader{
		longStream(n, size, upstreamtest.ToolCallChunks("c", 100, call{ID: "a", Name: "list_preferences", Arguments: "{}"})[1:]...),
		longStream(1, 5),
	}}
	req, err := ParseChatRequest([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"go"}]}`))
	require.NoError(t, err)
	var got int
	var chunks int
	rounds, err := (&Runner{}).Run(context.Background(), &Turn{Workspace: ws, Start: turn, Upstream: up},
		newChatSSE(req, up, nil, "", 1<<20, emitFunc(func(chunk []byte) error {
			chunks++
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal(chunk, &c))
			if len(c.Choices) > 0 {
				got += len(c.Choices[0].Delta.Content)
			}
			return nil
		})))
	require.NoError(t, err)
	require.Equal(t, 2, rounds)
	require.Equal(t, n*size+5, got, "the client got every byte")
	require.Less(t, up.sizes[1], up.sizes[0]+maxRoundText+4096, "round 2 carries at most the cap of round 1's text")
	require.Greater(t, up.sizes[1], up.sizes[0]+maxRoundText/2)
}

// TestRunnerLoopWithoutHTTP drives the one loop through both chat dialects with a fake upstream
// (no HTTP): a workspace call, then the answer. Both run the tool once, send its result back in
// round 2, and answer with the usage of both rounds.
func TestRunnerLoopWithoutHTTP(t *testing.T) {
	t.Parallel()
	store := workspace.NewStore(dbtest.NewPool(t, nil), workspace.Options{})
	call := call{ID: "c1", Name: "set_objective", Arguments: `{"text":"Test the loop","action_and_reasoning":"goal"}`}
	stream := func(chunks ...string) func() io.Reader {
		return func() io.Reader {
			return strings.NewReader(strings.Join(upstreamtest.Events(append(chunks, "[DONE]")...), ""))
		}
	}
	body := func(s string) func() io.Reader { return func() io.Reader { return strings.NewReader(s) } }
	for _, streamed := range []bool{false, true} {
		t.Run(fmt.Sprint("streamed=", streamed), func(t *testing.T) {
			t.Parallel()
			ws := store.Workspace(workspace.ThreadID{Name: fmt.Sprint("loop-", streamed)})
			turn, err := ws.StartTurn(context.Background(), workspace.TurnOptions{})
			require.NoError(t, err)
			up := &fakeUpstream{bodies: []func() io.Reader{body(cmpl("", call)), body(cmpl("Done."))}}
			if streamed {
				up.bodies = []func() io.Reader{
					stream(append(upstreamtest.ToolCallChunks("s", 7, call), upstreamtest.UsageChunk("s", 10, 5))...),
					stream(append(upstreamtest.ContentChunks("s", "Do", "ne."), upstreamtest.UsageChunk("s", 10, 5))...),
				}
			}
			req, err := ParseChatRequest([]byte(fmt.Sprintf(`{"model":"m","stream":%t,"stream_options":{"include_usage":%t},"messages":[{"role":"user","content":"go"}]}`, streamed, streamed)))
			require.NoError(t, err)
			tt := &Turn{Workspace: ws, Start: turn, Upstream: up}
			var answer string
			var usage map[string]any
			if streamed {
				rounds, err := (&Runner{}).Run(context.Background(), tt, newChatSSE(req, up, nil, "", 1<<20, emitFunc(func(chunk []byte) error {
					var c struct {
						Choices []struct {
							Delta struct{ Content string } `json:"delta"`
						} `json:"choices"`
						Usage map[string]any `json:"usage"`
					}
					require.NoError(t, json.Unmarshal(chunk, &c))
					if len(c.Choices) > 0 {
						answer += c.Choices[0].Delta.Content
					}
					if c.Usage != nil {
						usage = c.Usage
					}
					return nil
				})))
				require.NoError(t, err)
				require.Equal(t, 2, rounds)
			} else {
				d := &chatJSON{req: req, up: up}
				rounds, err := (&Runner{}).Run(context.Background(), tt, d)
				require.NoError(t, err)
				require.Equal(t, 2, rounds)
				var c struct {
					Choices []struct {
						Message struct{ Content string } `json:"message"`
					} `json:"choices"`
					Usage map[string]any `json:"usage"`
				}
				require.NoError(t, json.Unmarshal(d.body, &c))
				answer, usage = c.Choices[0].Message.Content, c.Usage
			}
			require.Equal(t, "Done.", answer)
			require.EqualValues(t, 20, usage["prompt_tokens"], "usage is the sum of both rounds")
			d, err := ws.Get(context.Background())
			require.NoError(t, err)
			require.Equal(t, "Test the loop", d.Objective.Text)
			require.Len(t, up.sizes, 2)
			require.Greater(t, up.sizes[1], up.sizes[0], "round 2 carries round 1's call and its result")
		})
	}
}

type call = upstreamtest.Call

var cmpl = upstreamtest.Completion

// retryLog is a slog.Handler that keeps the wait of each retry the runner logs, and cancels the
// turn at the first (the test need not wait for it).
type retryLog struct {
	waits  *[]time.Duration
	cancel context.CancelFunc
}

func (h retryLog) Enabled(context.Context, slog.Level) bool { return true }
func (h retryLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h retryLog) WithGroup(string) slog.Handler            { return h }
func (h retryLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "wait" {
			*h.waits = append(*h.waits, a.Value.Duration())
			h.cancel()
		}
		return true
	})
	return nil
}

// TestRetryAfter: a round after the turn's tools answered 503 waits as the upstream's
// Retry-After says, in seconds or as an HTTP date (RFC 9110 §10.2.3), up to 10 s.
func TestRetryAfter(t *testing.T) {
	t.Parallel()
	objective := `{"text":"Wait","action_and_reasoning":"goal"}`
	for name, tc := range map[string]struct {
		value string
		want  time.Duration
	}{
		"Seconds":      {"3", 3 * time.Second},
		"HTTPDate":     {time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), maxRetryAfter},
		"HTTPDatePast": {time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat), 0},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			overloaded := &apierr.UpstreamError{StatusCode: 503, Header: http.Header{"Retry-After": {tc.value}}, Body: []byte(`{"error":{}}`)}
			up := &script{replies: []scripted{{body: cmpl("", call{ID: "a", Name: tools.SetObjective, Arguments: objective})}, {err: overloaded}}}
			req, err := ParseChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":"go"}]}`))
			require.NoError(t, err)
			tt := newTurn(t, workspace.Limits{}, up)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var waits []time.Duration
			_, err = (&Runner{RetryBackoff: time.Millisecond, Logger: slog.New(retryLog{&waits, cancel})}).Run(ctx, tt, req.JSON(tt))
			require.ErrorAs(t, err, &overloaded)
			require.Len(t, waits, 1)
			if tc.want == 0 {
				require.Less(t, waits[0], 10*time.Millisecond, "the backoff's")
				return
			}
			require.Equal(t, tc.want, waits[0])
		})
	}
}
