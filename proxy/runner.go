package proxy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
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

// maxRoundText caps the assistant content (and reasoning) a streamed round keeps for the next
// round. The client gets all of it as it arrives; only a round that ends in workspace tool calls
// sends its text back, so memory stays flat however long a stream runs.
const maxRoundText = 1 << 20

// Runner runs the loop of a thread turn (SPEC §6): it calls the upstream, runs the workspace tool
// calls of each reply, feeds the results back, and calls again until the model answers. It knows
// nothing of HTTP: the upstream is an interface, and the client is what the turn's dialect makes
// of the last reply (a body, or the events of an Emitter).
type Runner struct {
	// MaxToolRounds bounds the tool rounds of a turn; zero means DefaultMaxToolRounds.
	MaxToolRounds int
	// MaxToolCallsPerRound and MaxToolCallsPerTurn bound the workspace calls run in a round and
	// in a turn; zero means DefaultMaxToolCallsPerRound and DefaultMaxToolCallsPerTurn.
	MaxToolCallsPerRound, MaxToolCallsPerTurn int
	// Metrics, when set, counts tool calls, locked skips, tool rounds and tokens.
	Metrics *Metrics
	// Logger, when set, logs tool failures the model sees and retries; nil logs nothing.
	Logger *slog.Logger
	// Retries bounds the retries of a round that follows executed tools; zero means
	// DefaultRetries, negative none.
	Retries int
	// RetryBackoff is the first wait before a retry (doubling after); zero means
	// DefaultRetryBackoff.
	RetryBackoff time.Duration

	tracing tracing // set by NewServer; the zero value traces nothing
}

// Turn is one request of a thread, ready to run: its dialect's request already carries the
// workspace block.
type Turn struct {
	Workspace *tools.Workspace
	Number    int    // the thread's turn number
	Model     string // the model the request names
	Upstream  Upstream
	// Usage is what the upstream reported for the turn's rounds, set when the turn ends (also
	// when it failed after some rounds).
	Usage tools.Usage
	// calls counts the workspace calls run in the turn (MaxToolCallsPerTurn).
	calls int
}

func (r *Runner) maxToolRounds() int {
	if r.MaxToolRounds > 0 {
		return r.MaxToolRounds
	}
	return DefaultMaxToolRounds
}

// toolCall is one tool call of a reply.
type toolCall struct {
	ID        string
	Name      string
	Arguments string
	Client    bool            // one of the client's tools: the client runs it
	Raw       json.RawMessage // as the upstream sent it (non-streamed replies)
}

// dialect is one wire format of a turn's rounds: chat completions as JSON (chatJSON) or as
// server-sent events (chatSSE), the Responses API as JSON (responsesJSON) or as typed events
// (responsesSSE). The loop (Runner.run) is the same for every dialect: it asks for the next
// round's request, has the dialect fetch and decode the reply, runs the workspace's calls, has
// the dialect extend the request with them, and has it finish the turn. A new wire format is a
// new dialect, never a new loop.
type dialect interface {
	// request is the upstream body of the next round, with or without the workspace tools.
	request(withWorkspaceTools bool) Payload
	// fetch sends body upstream and decodes the reply into its tool calls, in order (the
	// client's marked), its usage, and what it says of itself (for traces). An error after part
	// of the round reached the client is wrapped in noRetry.
	fetch(ctx context.Context, body Payload) (calls []toolCall, usage json.RawMessage, info roundInfo, err error)
	// pause is called before the loop waits for the workspace's tools: a stream sends what it
	// holds.
	pause() error
	// extend appends the last reply and the results of the workspace's calls to the request.
	extend(calls []toolCall, results []string)
	// finish ends the turn on the last reply: the client gets its calls, if any, or the answer,
	// with the usage of every round.
	finish(clientCalls []toolCall, usage *usageSum, rounds int) error
}

// run is the loop of a turn (SPEC §6), whatever its dialect. It returns the upstream calls made.
func (r *Runner) run(ctx context.Context, t *Turn, d dialect) (int, error) {
	var usage usageSum
	toolRounds := 0
	defer func() {
		r.Metrics.observeToolRounds(toolRounds)
		t.Usage = usage.tokens
	}()
	for n := 1; ; n++ {
		final := toolRounds >= r.maxToolRounds()
		body := d.request(!final)
		var calls []toolCall
		var roundUsage json.RawMessage
		var info roundInfo
		rctx, span := r.tracing.roundSpan(ctx, t, n)
		attempts := 0
		err := r.retry(rctx, n, func() (err error) {
			attempts++
			calls, roundUsage, info, err = d.fetch(rctx, body)
			return err
		})
		tokens := tokenCounts(roundUsage)
		endRound(span, info, tokens, attempts-1, err)
		if err != nil {
			return n, err
		}
		usage.add(roundUsage, tokens)
		r.Metrics.addTokens(tokens)
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
			return n, d.finish(theirs, &usage, n)
		}
		if err := d.pause(); err != nil {
			return n, err
		}
		results, err := r.runTools(ctx, t, n, mine)
		if err != nil {
			return n, err
		}
		if len(theirs) > 0 {
			return n, d.finish(theirs, &usage, n)
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
		var ue *UpstreamError
		if errors.As(err, &ue) {
			if secs, perr := strconv.Atoi(ue.Header.Get("Retry-After")); perr == nil && secs > 0 {
				wait = max(wait, min(time.Duration(secs)*time.Second, maxRetryAfter))
			}
		}
		r.Metrics.upstreamRetry()
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
	var ue *UpstreamError
	if errors.As(err, &ue) {
		switch ue.StatusCode {
		case 429, 500, 502, 503, 504, 529:
			return true
		}
		return false
	}
	var se *StreamError
	return errors.As(err, &se) || errors.Is(err, ErrUpstreamUnreachable) || errors.Is(err, errStreamEnded)
}

// notRun is the envelope of a workspace call over a bound, which is not run.
func notRun(msg string) string {
	b, _ := rawjson.Marshal(tools.Envelope{Error: "not run: " + msg})
	return string(b)
}

// runTools runs the workspace's calls in order and returns their tool-message contents. Only a
// failure of the store ends the turn; a call the tool refuses is an error envelope for the model,
// and so is a call past MaxToolCallsPerRound or MaxToolCallsPerTurn, which is not run.
func (r *Runner) runTools(ctx context.Context, t *Turn, n int, calls []toolCall) ([]string, error) {
	out := make([]string, len(calls))
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
		if out[i] != "" {
			r.Metrics.toolCall(call.Name, false, 0)
			continue
		}
		t.calls++
		tctx, span := r.tracing.toolSpan(ctx, call)
		res, err := t.Workspace.Run(tctx, tools.Call{Turn: t.Number, Round: n, ID: call.ID, Name: call.Name, Arguments: call.Arguments})
		r.tracing.endTool(span, res, err)
		if err != nil {
			return nil, err
		}
		r.Metrics.toolCall(call.Name, res.OK, res.LockedSkips)
		if !res.OK && r.Logger != nil {
			r.Logger.LogAttrs(ctx, slog.LevelDebug, "tool call refused", slog.String("thread", t.Workspace.ThreadID().String()),
				slog.String("tool", call.Name), slog.String("result", res.Content))
		}
		out[i] = res.Content
	}
	return out, nil
}

// usageSum adds up the usage objects of a turn's rounds: every number, nested ones
// (prompt_tokens_details, …) included; anything else keeps its last value. It keeps the raw
// objects and sums them only when asked, so a turn of one round decodes nothing; the token
// counts it sums as it goes.
type usageSum struct {
	raws   []json.RawMessage
	tokens tools.Usage
}

// add keeps a round's usage and its token counts (tokenCounts(raw)); raw must stay unchanged
// until json is called.
func (u *usageSum) add(raw json.RawMessage, tokens tools.Usage) {
	if len(raw) > 0 && string(raw) != "null" {
		u.raws = append(u.raws, raw)
		u.tokens.Add(tokens)
	}
}

// tokenCounts reads the token counts of one usage object: chat completions' prompt_tokens,
// prompt_tokens_details.cached_tokens and completion_tokens, or the Responses API's
// input_tokens, input_tokens_details.cached_tokens and output_tokens.
func tokenCounts(raw json.RawMessage) tools.Usage {
	var u tools.Usage
	o, err := rawjson.Parse(raw)
	if err != nil {
		return u
	}
	count := func(o rawjson.Object, key string) int64 {
		n, _ := strconv.ParseInt(string(o.Get(key)), 10, 64)
		return max(n, 0)
	}
	cached := func(details string) int64 {
		d, err := rawjson.Parse(o.Get(details))
		if err != nil {
			return 0
		}
		return count(d, "cached_tokens")
	}
	u.PromptTokens = count(o, "prompt_tokens") + count(o, "input_tokens")
	u.CompletionTokens = count(o, "completion_tokens") + count(o, "output_tokens")
	u.CachedPromptTokens = cached("prompt_tokens_details") + cached("input_tokens_details")
	return u
}

func (u *usageSum) empty() bool { return len(u.raws) == 0 }

func (u *usageSum) json() json.RawMessage {
	sum := map[string]any{}
	for _, raw := range u.raws {
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if dec.Decode(&m) == nil {
			sumInto(sum, m)
		}
	}
	b, _ := rawjson.Marshal(sum)
	return b
}

func sumInto(dst, src map[string]any) {
	for k, v := range src {
		switch sv := v.(type) {
		case json.Number:
			if dv, ok := dst[k].(json.Number); ok {
				dst[k] = addNumbers(dv, sv)
				continue
			}
		case map[string]any:
			if dv, ok := dst[k].(map[string]any); ok {
				sumInto(dv, sv)
				continue
			}
		}
		dst[k] = v
	}
}

func addNumbers(a, b json.Number) json.Number {
	if x, err := a.Int64(); err == nil {
		if y, err := b.Int64(); err == nil {
			return json.Number(strconv.FormatInt(x+y, 10))
		}
	}
	x, _ := a.Float64()
	y, _ := b.Float64()
	return json.Number(strconv.FormatFloat(x+y, 'f', -1, 64))
}

func newCallID() string { return "call_" + randomHex(12) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var errStreamEnded = errors.New("the upstream's stream ended before its reply was complete")
