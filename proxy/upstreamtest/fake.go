package upstreamtest

import (
	"testing"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// Fake starts the fake model of package fake, configured by opts, as a Server: replies scripted
// on it answer first, the fake every request after them, and every request is recorded.
func Fake(t testing.TB, opts fake.Options) *Server {
	s := New(t)
	s.Fallback = fake.New(opts).ServeHTTP
	return s
}
