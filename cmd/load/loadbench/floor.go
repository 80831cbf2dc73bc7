package loadbench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Floor is the least a Go proxy in front of Postgres can do for a thread turn, the reference
// wsproxy's figures are compared with as a pass-through's are with BareProxy (BENCHMARKS.md):
// per request, one statement that counts the turn on the thread's row (X-Thread-Id) with
// synchronous_commit off, as a turn's start commits, then the request's body posted to target
// as it came and the answer returned. With toolRound, a tool round's least on top: a durable
// one-row write (the call, with the body's first bytes as its arguments) and the same body
// posted again, whose answer is returned. Nothing is parsed, rewritten, planned or recorded,
// and turn starts are not batched. Its tables (FloorSchema) are in the first schema of pool's
// search path.
func Floor(target *url.URL, pool *pgxpool.Pool, toolRound bool) http.Handler {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 0, math.MaxInt // as wsproxy's transport
	post := func(r *http.Request, body []byte) (*http.Response, []byte, error) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, target.String(), bytes.NewReader(body))
		if err != nil {
			return nil, nil, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := t.RoundTrip(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		thread := r.Header.Get("X-Thread-Id")
		if _, err := pool.Exec(r.Context(), floorTurnStart, thread); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		resp, out, err := post(r, body)
		if err == nil && toolRound {
			if _, err = pool.Exec(r.Context(), floorToolCall, thread, strings.ToValidUTF8(string(body[:min(len(body), 64)]), "")); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			resp, out, err = post(r, body)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(out)
	})
}

const (
	floorTurnStart = `WITH c AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO load_floor_threads AS t (id, turns) SELECT $1, 1 FROM c
ON CONFLICT (id) DO UPDATE SET turns = t.turns + 1`
	floorToolCall = `INSERT INTO load_floor_calls AS c (thread_id, n, arguments) VALUES ($1, 1, $2)
ON CONFLICT (thread_id) DO UPDATE SET n = c.n + 1, arguments = excluded.arguments`
)

// FloorSchema creates Floor's tables, if they are not there.
func FloorSchema(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS load_floor_threads (id text PRIMARY KEY, turns bigint NOT NULL);
CREATE TABLE IF NOT EXISTS load_floor_calls (thread_id text PRIMARY KEY, n bigint NOT NULL, arguments text NOT NULL)`)
	if err != nil {
		return fmt.Errorf("floor schema: %w", err)
	}
	return nil
}
