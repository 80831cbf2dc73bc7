package proxy

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/wsproxy/wsproxy/workspace"
)

// noteCompaction records a thread's compaction request (docs/spec.md §18), which serveTurn has
// just forwarded, in the thread's history: "the client compacted its history". Only an answered
// one is recorded (the client got a 2xx: it has its summary; an upstream's error compacted
// nothing). The record is written in the background, so that neither the answer's last bytes nor
// its end wait for Postgres; Shutdown waits for it as for a turn (s.turns), and once Shutdown has
// begun it is written before the handler returns. A failure costs the entry, never the answer:
// it is logged once, at Warn.
func (s *Server) noteCompaction(w http.ResponseWriter, r *http.Request, ws *workspace.Workspace) {
	if sw, ok := w.(*statusWriter); ok && sw.status()/100 != 2 {
		return
	}
	ctx := context.WithoutCancel(r.Context())
	note := func() {
		if err := ws.NoteCompaction(ctx); err != nil {
			s.log.LogAttrs(ctx, slog.LevelWarn, "a compaction was not recorded in its thread's history",
				slog.String("thread", ws.ThreadID().String()), slog.Any("err", err))
		}
	}
	s.turnsMu.Lock()
	if !s.draining {
		s.turns.Go(note) // under turnsMu: before Shutdown's Wait
		s.turnsMu.Unlock()
		return
	}
	s.turnsMu.Unlock()
	note()
}
