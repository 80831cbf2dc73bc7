package proxy

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mathrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"

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

// maxRoundText caps the assistant content (and reasoning) a chat round sends back to the
// upstream with its workspace calls, streamed or not: the client gets all of it, and a stream
// keeps no more than this of it, so memory stays flat however long a stream runs.
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
	// Start is the turn's start: its number, and the workspace its first round shows the model.
	Start    tools.TurnStart
	Model    string // the model the request names
	Upstream Upstream
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
	Raw       json.RawMessage // as the upstream sent it (non-streamed replies), or as the proxy made it
	// shown: a streamed client call whose deltas the client already got.
	shown bool
	// Parts are the workspace calls of a parallel wrapper run as one call (its result lists
	// theirs), for wire formats that send one output per call the model made.
	Parts []toolCall
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
	// ran counts the rounds that ran workspace calls, for wsproxy_tool_rounds: the tool rounds,
	// and a last round that ran them beside the client's calls (no tool round, docs/spec.md §6,
	// but no turn the model answered at once either, which the metric's 0 is for, §9).
	ran := 0
	defer func() {
		r.Metrics.observeToolRounds(ran)
		t.Usage = usage.tokens
	}()
	// The list the model was shown, which the indices of each round's calls name (docs/spec.md
	// §5): the block of the turn's start, then the list as each round's calls left it.
	view := tools.NewView(t.Start)
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
		results, err := r.runTools(ctx, t, n, view, mine)
		if err != nil {
			return n, err
		}
		ran++
		view.NextRound()
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
		var ue *apierr.UpstreamError
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
	var ue *apierr.UpstreamError
	if errors.As(err, &ue) {
		switch ue.StatusCode {
		case 429, 500, 502, 503, 504, 529:
			return true
		}
		return false
	}
	var se *apierr.StreamError
	return errors.As(err, &se) || errors.Is(err, apierr.ErrUpstreamUnreachable) || errors.Is(err, errStreamEnded)
}

// notRun is the envelope of a workspace call over a bound, which is not run.
func notRun(msg string) string {
	b, _ := rawjson.Marshal(tools.Envelope{Error: "not run: " + msg})
	return string(b)
}

// runTools runs the workspace's calls in order, their indices naming view, and returns their
// tool-message contents. Only a failure of the store ends the turn; a call the tool refuses is
// an error envelope for the model, and so is a call past MaxToolCallsPerRound or
// MaxToolCallsPerTurn, which is not run (a parallel wrapper counts as one call). Once started,
// the calls run to their end whether or not the client stays (a round is never left half done:
// "remove #1" without the "add" of its new wording); each is bounded by the store's timeout.
func (r *Runner) runTools(ctx context.Context, t *Turn, n int, view *tools.View, calls []toolCall) ([]string, error) {
	ctx = context.WithoutCancel(ctx)
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
		out[i] = res.Content
	}
	return out, nil
}

// runTool runs one workspace call.
func (r *Runner) runTool(ctx context.Context, t *Turn, n int, view *tools.View, call toolCall) (tools.Result, error) {
	tctx, span := r.tracing.toolSpan(ctx, call)
	res, err := t.Workspace.Run(tctx, tools.Call{Turn: t.Start.Number, Round: n, ID: call.ID, Name: call.Name, Arguments: call.Arguments, View: view})
	r.tracing.endTool(span, res, err)
	if err != nil {
		return res, err
	}
	r.Metrics.toolCall(call.Name, res.OK, res.LockedSkips)
	if !res.OK && r.Logger != nil {
		r.Logger.LogAttrs(ctx, slog.LevelDebug, "tool call refused", slog.String("thread", t.Workspace.ThreadID().String()),
			slog.String("tool", call.Name), slog.String("result", res.Content))
	}
	return res, nil
}

// runParts runs the workspace calls of a parallel wrapper and returns the wrapper's output: the
// list of its calls' results, [{"recipient_name":"functions.<name>","output":<envelope>}, …].
func (r *Runner) runParts(ctx context.Context, t *Turn, n int, view *tools.View, parts []toolCall) (string, error) {
	items := make([]json.RawMessage, len(parts))
	for i, p := range parts {
		res, err := r.runTool(ctx, t, n, view, p)
		if err != nil {
			return "", err
		}
		o := rawjson.Object{}
		o.Set("recipient_name", rawjson.String("functions."+p.Name))
		o.Set("output", json.RawMessage(res.Content))
		items[i] = o.Bytes()
	}
	return string(rawjson.AppendArray(nil, items)), nil
}

// usageSum adds up the usage objects of a turn's rounds (docs/spec.md §16): one round's goes
// to the client as the upstream sent it; several are merged member by member in the last
// round's order (members only earlier rounds had after them): numbers summed (integers
// saturating at the int64 bounds), objects merged alike, null the same as absent, anything else
// the last round's. It keeps the raw objects and merges them only when asked, so a turn of one
// round decodes nothing; the token counts it sums as it goes.
type usageSum struct {
	raws   []json.RawMessage
	tokens tools.Usage
}

// add keeps a round's usage and its token counts (tokenCounts(raw)); raw must stay unchanged
// until json is called.
func (u *usageSum) add(raw json.RawMessage, tokens tools.Usage) {
	if !isNull(raw) {
		u.raws = append(u.raws, raw)
		u.tokens.Add(tokens)
	}
}

// tokenCounts reads the token counts of one usage object: chat completions' prompt_tokens,
// prompt_tokens_details.cached_tokens and completion_tokens, or the Responses API's
// input_tokens, input_tokens_details.cached_tokens and output_tokens. Counts that are not
// non-negative integers count 0; those past the int64 bounds count as its largest.
func tokenCounts(raw json.RawMessage) tools.Usage {
	var u tools.Usage
	o, err := rawjson.Parse(raw)
	if err != nil {
		return u
	}
	count := func(o rawjson.Object, key string) int64 {
		n, _ := strconv.ParseInt(string(o.Get(key)), 10, 64) // past the bounds: the largest
		return max(n, 0)
	}
	cached := func(details string) int64 {
		d, err := rawjson.Parse(o.Get(details))
		if err != nil {
			return 0
		}
		return count(d, "cached_tokens")
	}
	u.Add(tools.Usage{PromptTokens: count(o, "prompt_tokens"), CompletionTokens: count(o, "completion_tokens"),
		CachedPromptTokens: cached("prompt_tokens_details")})
	u.Add(tools.Usage{PromptTokens: count(o, "input_tokens"), CompletionTokens: count(o, "output_tokens"),
		CachedPromptTokens: cached("input_tokens_details")})
	return u
}

func (u *usageSum) empty() bool { return len(u.raws) == 0 }

func (u *usageSum) json() json.RawMessage {
	if len(u.raws) == 0 {
		return nil
	}
	sum := u.raws[0]
	for _, raw := range u.raws[1:] {
		sum = mergeUsage(sum, raw)
	}
	return sum
}

// mergeUsage merges usage object b, the later, into a (see usageSum).
func mergeUsage(a, b json.RawMessage) json.RawMessage {
	bo, err := rawjson.Parse(b)
	if err != nil {
		return a
	}
	ao, err := rawjson.Parse(a)
	if err != nil {
		return b
	}
	out := rawjson.Object{}
	for i, k := range bo.Keys {
		out.Set(k, mergeValue(ao.Get(k), bo.Vals[i]))
	}
	for i, k := range ao.Keys {
		if out.Index(k) < 0 {
			out.Set(k, ao.Vals[i])
		}
	}
	return out.Bytes()
}

func mergeValue(a, b json.RawMessage) json.RawMessage {
	switch {
	case isNull(a):
		return b
	case isNull(b):
		return a
	case a[0] == '{' && b[0] == '{':
		return mergeUsage(a, b)
	case isNumber(a) && isNumber(b):
		return addNumbers(a, b)
	}
	return b
}

func isNumber(v json.RawMessage) bool { return v[0] == '-' || (v[0] >= '0' && v[0] <= '9') }

// addNumbers adds two JSON numbers: integers exactly, saturating at the int64 bounds; others as
// float64.
func addNumbers(a, b json.RawMessage) json.RawMessage {
	x, errX := strconv.ParseInt(string(a), 10, 64)
	y, errY := strconv.ParseInt(string(b), 10, 64)
	if errX == nil && errY == nil {
		return json.RawMessage(strconv.FormatInt(tools.AddTokens(x, y), 10))
	}
	f, _ := strconv.ParseFloat(string(a), 64)
	g, _ := strconv.ParseFloat(string(b), 64)
	sum := f + g
	if math.IsInf(sum, 0) || math.IsNaN(sum) {
		sum = math.Copysign(math.MaxFloat64, sum)
	}
	format := byte('f')
	if math.Abs(sum) >= 1e21 {
		format = 'g'
	}
	return json.RawMessage(strconv.FormatFloat(sum, format, -1, 64))
}

func newCallID() string { return "call_" + randomHex(12) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var errStreamEnded = errors.New("the upstream's stream ended before its reply was complete")
