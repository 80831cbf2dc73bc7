package testkit

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/eventhub"
	"github.com/wsproxy/wsproxy/workspace"
)

// Hub is a replica's event hub of store's threads as the rooms' tests run it: where the threads
// stand read every 20 ms, its log discarded. Serve's closers close it.
func Hub(store *workspace.Store) *eventhub.Hub {
	return eventhub.New(store.Versions, 20*time.Millisecond, slog.New(slog.DiscardHandler))
}

// Serve serves h on a real HTTP server until the test ends. Then closers run, in order (a room's
// Close ends the streams it holds, so that the server's Close can finish), and the server closes.
func Serve(t testing.TB, h http.Handler, closers ...func()) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		for _, c := range closers {
			c()
		}
		srv.Close()
	})
	return srv
}

// Announced reports whether a notification of a resource's update comes on lines (a
// subscriptions/listen stream's, MCPListen) within wait, a bound for a failure (the watch's
// hook, mcp.Options.Watching, says when a change will be announced); false as well when the
// stream ends.
func Announced(lines <-chan string, wait time.Duration) bool {
	timeout := time.After(wait)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return false
			}
			if strings.Contains(line, "notifications/resources/updated") {
				return true
			}
		case <-timeout:
			return false
		}
	}
}
