package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// servePprof serves Go's runtime profiles (/debug/pprof/: CPU, heap, allocations, goroutines,
// an execution trace) on a listener of their own at PPROF_ADDR, never on the proxy's: they are an
// operator's tool (a CPU profile costs a few percent while it runs, and the profiles name the
// code's functions). The command line is not served: a flag may carry a secret
// (-admin-token).
func (m *Main) servePprof() error {
	ln, err := net.Listen("tcp", m.Config.PprofAddr)
	if err != nil {
		return fmt.Errorf("PPROF_ADDR: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	m.pprof = &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = m.pprof.Serve(ln) }()
	m.PprofURL = "http://" + ln.Addr().String() + "/debug/pprof/"
	m.log.Info("profiles served", slog.String("url", m.PprofURL))
	return nil
}
