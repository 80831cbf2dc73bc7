package admin

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/workspace"
)

// Export and import of a workspace (docs/spec.md §8).

const (
	// maxImportBytes bounds an import's body: a full list of the longest items fits many times.
	maxImportBytes = 1 << 20
	// maxExportEvents bounds the history an export carries (?history=1); history_truncated says
	// when the thread has more.
	maxExportEvents = 10000
)

// exportDoc is an export as the admin REST writes it: the workspace's document, and with
// ?history=1 its events, oldest first. An import reads the same document and ignores the history
// (the imported thread's history is its own: the import's events).
type exportDoc struct {
	workspace.Exported
	History          []workspace.Event `json:"history,omitempty"`
	HistoryTruncated bool              `json:"history_truncated,omitempty"`
}

// importDoc is what an import reads: an export, whose history is accepted and not used.
type importDoc struct {
	workspace.Exported
	History          json.RawMessage `json:"history"`
	HistoryTruncated bool            `json:"history_truncated"`
}

var errImportTooLong = &apierr.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "import_too_large",
	Message: "an import's document is at most 1 MiB (export without ?history=1: an import does not read the history)"}

var errNotEmpty = &apierr.Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "thread_not_empty",
	Message: "the thread already holds an objective or preferences: import into a new or empty thread, or with ?replace=1 to replace them"}

// flag reads a boolean query parameter: absent, "0" or "false" is false; "1" or "true" true.
func flag(r *http.Request, name string) (bool, error) {
	switch r.URL.Query().Get(name) {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, apierr.BadRequest("invalid_value", name, "%s must be 1 or 0", name)
}

// adminExport writes the thread's workspace as a document an import reads: GET …/export
// (?history=1 adds its events).
func (s *Server) adminExport(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	history, err := flag(r, "history")
	if err != nil {
		return err
	}
	d, err := ws.Get(r.Context())
	if err != nil {
		return err
	}
	out := exportDoc{Exported: workspace.Export(d)}
	if history {
		out.History = []workspace.Event{}
		q := workspace.EventQuery{Limit: maxPageSize}
		for len(out.History) < maxExportEvents {
			evs, err := ws.Events(r.Context(), q)
			if err != nil {
				return err
			}
			out.History = append(out.History, evs...)
			if len(evs) < q.Limit {
				break
			}
			q.After = evs[len(evs)-1].ID
		}
		if len(out.History) > maxExportEvents {
			out.History, out.HistoryTruncated = out.History[:maxExportEvents], true
		} else if len(out.History) == maxExportEvents {
			more, err := ws.Events(r.Context(), workspace.EventQuery{After: out.History[len(out.History)-1].ID, Limit: 1})
			if err != nil {
				return err
			}
			out.HistoryTruncated = len(more) > 0
		}
	}
	return writeJSON(w, http.StatusOK, out)
}

// adminImport writes a document into the thread: POST …/import (?replace=1 replaces what a
// thread that is not empty holds). It answers with the thread's export, 201 when the import
// created the thread.
func (s *Server) adminImport(w http.ResponseWriter, r *http.Request) error {
	ws, err := s.workspaceOf(r)
	if err != nil {
		return err
	}
	replace, err := flag(r, "replace")
	if err != nil {
		return err
	}
	var in importDoc
	if err := s.decodeBounded(w, r, &in, maxImportBytes, errImportTooLong); err != nil {
		return err
	}
	if in.Format == "" {
		return apierr.BadRequest("missing_required_parameter", "format", "format is required (%q: the document an export writes)", workspace.ExportFormat)
	}
	if len(in.Parents) > workspace.MaxAncestors {
		return workspace.ErrTooManyParents
	}
	if len(in.Parents) > 0 && principalFrom(r.Context()).thread != "" {
		return errLinkScope
	}
	parents := make([]workspace.ThreadID, len(in.Parents))
	for i, name := range in.Parents {
		if parents[i], err = threadNamed(ws.ThreadID(), name, "parents"); err != nil {
			return err
		}
	}
	status := http.StatusOK
	if _, err := ws.Summary(r.Context()); errors.Is(err, workspace.ErrNotFound) {
		status = http.StatusCreated
	} else if err != nil {
		return err
	}
	if err := ws.Import(r.Context(), in.Exported, parents, replace); err != nil {
		if errors.Is(err, workspace.ErrNotEmpty) {
			return errNotEmpty
		}
		return err
	}
	d, err := ws.Get(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, status, exportDoc{Exported: workspace.Export(d)})
}
