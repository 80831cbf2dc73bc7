package turn

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// DefaultMaxToolRounds is how many tool rounds a turn may make before its last upstream call,
// which goes without the workspace tools.
const DefaultMaxToolRounds = 8

// Bounds of the workspace calls a model makes, far above real use: more in one round, or in one
// turn, are not run (each gets an error envelope).
const (
	DefaultMaxToolCallsPerRound = 100
	DefaultMaxToolCallsPerTurn  = 400
)

// maxRoundText caps the assistant content (and reasoning) a chat round sends back to the
// upstream with its workspace calls, streamed or not, and the text and citations of a streamed
// Messages round: the client gets all of it, and a stream keeps no more than this of it, so
// memory stays flat however long a stream runs. It also bounds the events a Responses stream
// holds behind a call whose owner is not known yet.
const maxRoundText = 1 << 20

// Runner runs the loop of a thread turn (docs/spec.md §6): it calls the upstream, runs the
// workspace tool calls of each reply, feeds the results back, and calls again until the model
// answers. It knows
// nothing of HTTP: the upstream is an interface, and the client is what the turn's dialect makes
// of the last reply (a body, or the events of an Emitter).
type Runner struct {
	// MaxToolRounds bounds the tool rounds of a turn; zero means DefaultMaxToolRounds.
	MaxToolRounds int
	// MaxToolCallsPerRound and MaxToolCallsPerTurn bound the workspace calls run in a round and
	// in a turn; zero means DefaultMaxToolCallsPerRound and DefaultMaxToolCallsPerTurn.
	MaxToolCallsPerRound, MaxToolCallsPerTurn int
	// Metrics, when set, counts tool calls, locked skips, tool rounds and tokens.
	Metrics Metrics
	// Logger, when set, logs tool failures the model sees and retries; nil logs nothing.
	Logger *slog.Logger
	// Retries bounds the retries of a round that follows executed tools; zero means
	// DefaultRetries, negative none.
	Retries int
	// RetryBackoff is the first wait before a retry (doubling after); zero means
	// DefaultRetryBackoff.
	RetryBackoff time.Duration

	// Tracing traces rounds and tool calls; the zero value traces nothing.
	Tracing Tracing
}

// Turn is one request of a thread, ready to run: its dialect's request already carries the
// workspace block.
type Turn struct {
	Workspace *workspace.Workspace
	// Log logs what the client does not see (a round's text sent back truncated); nil logs
	// nothing.
	Log *slog.Logger
	// Start is the turn's start: its number, and the workspace its first round shows the model.
	Start    workspace.TurnStart
	Model    string // the model the request names
	Upstream Upstream
	// Provider is the upstream's gen_ai.provider.name on the rounds' spans: openai, anthropic,
	// gcp.gemini for the providers' own APIs, else the upstream's host.
	Provider string
	// Usage is what the upstream reported for the turn's rounds, set when the turn ends (also
	// when it failed after some rounds).
	Usage workspace.Usage
	// Reading is what the turn's model read, by who wrote it (Request.Reading; docs/spec.md
	// §19), called at its first write; nil: nothing untrusted.
	Reading func() workspace.Reading
	// calls counts the workspace calls run in the turn (MaxToolCallsPerTurn).
	calls int
	// reached: a round's reply came from the upstream, whole or in part (the model was reached).
	reached bool
}

// Reached reports whether a round of the turn had its reply from the upstream: a turn that never
// reached its model (its first round failed) is given back (docs/spec.md §2).
func (t *Turn) Reached() bool { return t.reached }

// metrics are r.Metrics, or none.
func (r *Runner) metrics() Metrics {
	if r.Metrics == nil {
		return noMetrics{}
	}
	return r.Metrics
}

type noMetrics struct{}

func (noMetrics) ToolCall(string, bool, int, string)     {}
func (noMetrics) ToolRounds(int)                         {}
func (noMetrics) ToolRoundsExhausted()                   {}
func (noMetrics) Tokens(string, string, workspace.Usage) {}
func (noMetrics) UpstreamRetry()                         {}

func (r *Runner) maxToolRounds() int {
	if r.MaxToolRounds > 0 {
		return r.MaxToolRounds
	}
	return DefaultMaxToolRounds
}

// Run is the loop of a turn (docs/spec.md §6), whatever its dialect. It returns the rounds the
// turn made (a retried round counts once).
func (r *Runner) Run(ctx context.Context, t *Turn, d Dialect) (int, error) {
	var sum usageSum
	toolRounds := 0
	// ran counts the rounds that ran workspace calls, for Metrics.ToolRounds: the tool rounds,
	// and a last round that ran them beside the client's calls (no tool round, docs/spec.md §6,
	// but no turn the model answered at once either, which a count of 0 is for, §9).
	ran := 0
	defer func() {
		r.metrics().ToolRounds(ran)
		t.Usage = sum.tokens
	}()
	// The list the model was shown, which the indices of each round's calls name (docs/spec.md
	// §5): the block of the turn's start, then the list as each round's calls left it.
	view := tools.NewView(t.Start)
	if t.Reading != nil {
		view.SetReading(t.Reading)
	}
	for n := 1; ; n++ {
		final := toolRounds >= r.maxToolRounds()
		if final {
			r.metrics().ToolRoundsExhausted()
		}
		body := d.request(!final)
		var calls []toolCall
		var roundUsage usage
		var info roundInfo
		rctx, span := r.Tracing.roundSpan(ctx, t, n)
		attempts := 0
		err := r.retry(rctx, n, func() (err error) {
			attempts++
			calls, roundUsage, info, err = d.fetch(rctx, body)
			return err
		})
		endRound(span, info, roundUsage.tokens, attempts-1, err)
		var partial noRetry
		if t.reached = t.reached || err == nil || errors.As(err, &partial); err != nil {
			return n, err // partial: the client had part of the round, which the model answered
		}
		sum.add(roundUsage)
		for _, p := range info.untrusted {
			view.Taint(p) // docs/spec.md §19: from this round on
		}
		r.metrics().Tokens(t.Model, t.Workspace.ThreadID().Client, roundUsage.tokens)
		var mine, theirs []toolCall
		for _, c := range calls {
			if c.Client {
				theirs = append(theirs, c)
			} else {
				mine = append(mine, c)
			}
		}
		if final || len(mine) == 0 {
			// In the last round a call to a workspace tool, not offered there, does not count.
			return n, d.finish(theirs, &sum, n)
		}
		if err := d.pause(); err != nil {
			return n, err
		}
		results, err := r.runTools(ctx, t, n, view, mine)
		if err != nil {
			return n, err
		}
		ran++
		view.NextRound()
		if len(theirs) > 0 {
			return n, d.finish(theirs, &sum, n)
		}
		d.extend(mine, results)
		toolRounds++
	}
}

// Retries of a round that follows executed tools.
const (
	DefaultRetries      = 3
	DefaultRetryBackoff = 250 * time.Millisecond
	maxRetryAfter       = 10 * time.Second
)

// retry runs call, and runs it again after a failure that may pass (the upstream overloaded,
// unreachable, or cut off) when the round follows executed tools (n > 1): the turn's writes are
// done, so the proxy retries rather than make the client re-run the turn. Waits double from
// RetryBackoff, with jitter, or follow the upstream's Retry-After up to 10 s.
func (r *Runner) retry(ctx context.Context, n int, call func() error) error {
	retries := r.Retries
	if retries == 0 {
		retries = DefaultRetries
	}
	base := r.RetryBackoff
	if base <= 0 {
		base = DefaultRetryBackoff
	}
	for attempt := 0; ; attempt++ {
		err := call()
		if err == nil || n == 1 || attempt >= retries || !retryable(err) {
			return err
		}
		wait := time.Duration(float64(base<<attempt) * (0.8 + 0.4*mathrand.Float64()))
		if ue := (*apierr.UpstreamError)(nil); errors.As(err, &ue) {
			wait = max(wait, min(ue.RetryAfter(), maxRetryAfter))
		}
		r.metrics().UpstreamRetry()
		if r.Logger != nil {
			r.Logger.LogAttrs(ctx, slog.LevelWarn, "retrying an upstream round after tools ran", slog.Int("round", n),
				slog.Int("attempt", attempt+1), slog.Duration("wait", wait), slog.Any("err", err))
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return err
		case <-timer.C:
		}
	}
}

// noRetry marks an error the runner must not retry (a stream that already sent part of a round).
type noRetry struct{ error }

func (e noRetry) Unwrap() error { return e.error }

// retryable reports failures that a second try may not meet: an overloaded or failing upstream
// (429, 5xx), one that could not be reached or cut the response off. A timeout is not retried
// (it already waited UPSTREAM_TIMEOUT), nor anything the client or the proxy caused.
func retryable(err error) bool {
	var nr noRetry
	if errors.As(err, &nr) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if ue := (*apierr.UpstreamError)(nil); errors.As(err, &ue) {
		return ue.Temporary()
	}
	var se *apierr.StreamError
	return errors.As(err, &se) || errors.Is(err, apierr.ErrUpstreamUnreachable) || errors.Is(err, errStreamEnded)
}

// notRun is the result of a workspace call over a bound, which is not run.
func notRun(msg string) tools.Result {
	b, _ := rawjson.Marshal(tools.Envelope{Error: "not run: " + msg})
	return tools.Result{Content: string(b)}
}

// runTools runs the workspace's calls in order, their indices naming view, and returns their
// results. Only a failure of the store ends the turn; a call the tool refuses is
// an error envelope for the model, and so is a call past MaxToolCallsPerRound or
// MaxToolCallsPerTurn, which is not run (a parallel wrapper counts as one call). Once started,
// the calls run to their end whether or not the client stays (a round is never left half done:
// "remove #1" without the "add" of its new wording); each is bounded by the store's timeout.
func (r *Runner) runTools(ctx context.Context, t *Turn, n int, view *tools.View, calls []toolCall) ([]tools.Result, error) {
	ctx = context.WithoutCancel(ctx)
	out := make([]tools.Result, len(calls))
	perRound, perTurn := cmp.Or(r.MaxToolCallsPerRound, DefaultMaxToolCallsPerRound), cmp.Or(r.MaxToolCallsPerTurn, DefaultMaxToolCallsPerTurn)
	if over := len(calls) - min(perRound, max(perTurn-t.calls, 0)); over > 0 && r.Logger != nil {
		r.Logger.LogAttrs(ctx, slog.LevelWarn, "workspace calls over their bound not run", slog.String("thread", t.Workspace.ThreadID().String()),
			slog.Int("round", n), slog.Int("calls", len(calls)), slog.Int("not_run", over))
	}
	for i, call := range calls {
		switch {
		case i >= perRound:
			out[i] = notRun(fmt.Sprintf("a round runs at most %d workspace calls; make fewer calls with more items each", perRound))
		case t.calls >= perTurn:
			out[i] = notRun(fmt.Sprintf("a turn runs at most %d workspace calls; answer the user", perTurn))
		}
		if out[i].Content != "" {
			r.metrics().ToolCall(call.Name, false, 0, "")
			continue
		}
		t.calls++
		if len(call.Parts) > 0 {
			res, err := r.runParts(ctx, t, n, view, call.Parts)
			if err != nil {
				return nil, err
			}
			out[i] = res
			continue
		}
		res, err := r.runTool(ctx, t, n, view, call)
		if err != nil {
			return nil, err
		}
		out[i] = res
	}
	return out, nil
}

// runTool runs one workspace call.
func (r *Runner) runTool(ctx context.Context, t *Turn, n int, view *tools.View, call toolCall) (tools.Result, error) {
	tctx, span := r.Tracing.toolSpan(ctx, call)
	res, err := tools.Run(tctx, t.Workspace, tools.Call{Turn: t.Start.Number, Round: n, ID: call.ID, Name: call.Name, Arguments: call.Arguments,
		Length: call.Length, View: view})
	r.Tracing.endTool(span, res, err)
	if err != nil {
		return res, err
	}
	r.metrics().ToolCall(call.Name, res.OK, res.LockedSkips, res.Untrusted)
	if !res.OK && r.Logger != nil {
		r.Logger.LogAttrs(ctx, slog.LevelDebug, "tool call refused", slog.String("thread", t.Workspace.ThreadID().String()),
			slog.String("tool", call.Name), slog.String("result", res.Content))
	}
	return res, nil
}

// runParts runs the workspace calls of a parallel wrapper and returns the wrapper's result: the
// list of its calls' results, [{"recipient_name":"functions.<name>","output":<envelope>}, …],
// OK when each of them is.
func (r *Runner) runParts(ctx context.Context, t *Turn, n int, view *tools.View, parts []toolCall) (tools.Result, error) {
	items := make([]json.RawMessage, len(parts))
	ok := true
	for i, p := range parts {
		res, err := r.runTool(ctx, t, n, view, p)
		if err != nil {
			return tools.Result{}, err
		}
		ok = ok && res.OK
		o := rawjson.Object{}
		o.Set("recipient_name", rawjson.String("functions."+p.Name))
		o.Set("output", json.RawMessage(res.Content))
		items[i] = o.Bytes()
	}
	return tools.Result{OK: ok, Content: string(rawjson.AppendArray(nil, items))}, nil
}

var errStreamEnded = errors.New("the upstream's stream ended before its reply was complete")

// errStreamCut is a stream that ended before its reply was complete: a protocol failure, retried.
var errStreamCut = fmt.Errorf("%w: %w", apierr.ErrUpstreamProtocol, errStreamEnded)

// notJSON is the failure of a stream event whose data is not JSON (nil for JSON): any event may
// carry a workspace call, which the proxy could neither run nor hide, so the turn ends as when a
// body is not JSON (docs/spec.md §16). JSON of a shape the proxy does not know is read leniently.
func notJSON(data []byte) error {
	if rawjson.Valid(data) {
		return nil
	}
	return fmt.Errorf("%w: an event's data is not JSON", apierr.ErrUpstreamProtocol)
}
