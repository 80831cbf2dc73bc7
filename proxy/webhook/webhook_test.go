package webhook

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/workspace"
)

// TestPostsEachProposal: one JSON POST a proposal, in order, with no credentials.
func TestPostsEachProposal(t *testing.T) {
	t.Parallel()
	got := make(chan *http.Request, 2)
	bodies := make(chan Body, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b Body
		raw, _ := io.ReadAll(r.Body)
		require.NoError(t, json.Unmarshal(raw, &b))
		got <- r
		bodies <- b
	}))
	defer srv.Close()
	s := New(srv.URL, slog.New(slog.DiscardHandler))
	defer s.Close()
	s.Notify([]workspace.ProposalNotice{{Thread: "alice~t1", Proposal: 7, Title: "Short answers"}, {Thread: "alice~t1", Proposal: 8, Title: "Fix the login"}})
	for _, want := range []Body{{"proposal", "alice~t1", 7, "Short answers"}, {"proposal", "alice~t1", 8, "Fix the login"}} {
		r := <-got
		require.Equal(t, want, <-bodies)
		require.Equal(t, "POST", r.Method)
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		require.Empty(t, r.Header.Get("Authorization"))
	}
}

// TestNeverWaits: while the webhook does not answer, Notify returns at once; past QueueSize
// waiting proposals, the rest are dropped and counted; once it answers, the queued ones go out.
func TestNeverWaits(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}, QueueSize+1), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
	}))
	defer srv.Close()
	s := New(srv.URL, slog.New(slog.DiscardHandler))
	s.Notify([]workspace.ProposalNotice{{Thread: "t", Proposal: 1}})
	<-arrived // the sender is held in its first POST, the queue empty
	more := make([]workspace.ProposalNotice, QueueSize+5)
	for i := range more {
		more[i] = workspace.ProposalNotice{Thread: "t", Proposal: int64(i + 2)}
	}
	s.Notify(more)
	require.Equal(t, int64(5), s.Dropped.Load())
	close(release)
	for range QueueSize {
		<-arrived
	}
	s.Close() // the last POST may be cut: it was received, but counts as failed
	require.Equal(t, int64(QueueSize+1), s.Sent.Load()+s.Failed.Load())
	require.GreaterOrEqual(t, s.Sent.Load(), int64(QueueSize))
}
