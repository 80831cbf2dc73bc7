package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// DefaultMaxToolRounds is how many tool rounds a turn may make before its last upstream call,
// which goes without the workspace tools.
const DefaultMaxToolRounds = 8

// maxResponseBody caps a non-streamed upstream response.
const maxResponseBody = 64 << 20

// maxRoundText caps the assistant content (and reasoning) a streamed round keeps for the next
// round. The client gets all of it as it arrives; only a round that ends in workspace tool calls
// sends its text back, so memory stays flat however long a stream runs.
const maxRoundText = 1 << 20

// Runner runs the loop of a thread turn (SPEC §6): it calls the upstream, runs the workspace tool
// calls of each reply, feeds the results back, and calls again until the model answers. It knows
// nothing of HTTP: the upstream is an interface and the client is a return value (Run) or an
// emit function (Stream).
type Runner struct {
	// MaxToolRounds bounds the tool rounds of a turn; zero means DefaultMaxToolRounds.
	MaxToolRounds int
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
}

// Turn is one chat request of a thread, ready to run: its request already carries the
// workspace block.
type Turn struct {
	Request   *ChatRequest
	Workspace *tools.Workspace
	Number    int // the thread's turn number
	Upstream  Upstream
}

// Reply is the answer of a non-streamed turn.
type Reply struct {
	Body   []byte
	Header http.Header // the last upstream response's
	Rounds int         // upstream calls made
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
	Raw       json.RawMessage // as the upstream sent it (non-streamed replies)
}

// round is what the loop keeps of one upstream reply.
type round struct {
	content   json.RawMessage // the assistant's content (a JSON string or null)
	reasoning json.RawMessage // reasoning_content, when the upstream sent one
	calls     []toolCall
}

// Run runs a non-streamed turn.
func (r *Runner) Run(ctx context.Context, t *Turn) (*Reply, error) {
	var usage usageSum
	toolRounds := 0
	defer func() { r.Metrics.observeToolRounds(toolRounds) }()
	for n := 1; ; n++ {
		final := toolRounds >= r.maxToolRounds()
		body := t.Request.Body(!final)
		var raw []byte
		var header http.Header
		err := r.retry(ctx, n, func() (err error) {
			raw, header, err = fetch(ctx, t.Upstream, body)
			return err
		})
		if err != nil {
			return nil, err
		}
		c, err := parseCompletion(raw)
		if err != nil {
			return nil, err
		}
		usage.add(c.top.Get("usage"))
		r.Metrics.addTokens(c.top.Get("usage"))

		var mine, theirs []toolCall
		for _, call := range c.round.calls {
			if t.Request.IsClientTool(call.Name) {
				theirs = append(theirs, call)
			} else {
				mine = append(mine, call)
			}
		}
		reply := &Reply{Header: header, Rounds: n}
		if len(mine) == 0 && n == 1 {
			reply.Body = raw // untouched: the proxy is invisible
			return reply, nil
		}
		if len(mine) == 0 || final {
			// In the last round a call to a workspace tool, not offered there, does not count.
			reply.Body = c.answer(theirs, n > 1, &usage)
			return reply, nil
		}
		results, err := r.runTools(ctx, t, n, mine)
		if err != nil {
			return nil, err
		}
		if len(theirs) > 0 {
			reply.Body = c.answer(theirs, n > 1, &usage)
			return reply, nil
		}
		c.round.calls = mine
		t.Request.Append(c.round.messages(results)...)
		toolRounds++
	}
}

// fetch makes one non-streamed upstream call and reads its body.
func fetch(ctx context.Context, up Upstream, body []byte) ([]byte, http.Header, error) {
	resp, err := up.ChatCompletion(ctx, body)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return nil, nil, classifyTransportError(ctx, err)
	}
	if len(raw) > maxResponseBody {
		return nil, nil, fmt.Errorf("%w: response over %d bytes", ErrUpstreamProtocol, maxResponseBody)
	}
	return raw, resp.Header, nil
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

// runTools runs the workspace's calls in order and returns their tool-message contents. Only a
// failure of the store ends the turn; a call the tool refuses is an error envelope for the model.
func (r *Runner) runTools(ctx context.Context, t *Turn, n int, calls []toolCall) ([]string, error) {
	out := make([]string, len(calls))
	for i, call := range calls {
		res, err := t.Workspace.Run(ctx, tools.Call{Turn: t.Number, Round: n, Name: call.Name, Arguments: call.Arguments})
		if err != nil {
			return nil, err
		}
		r.Metrics.toolCall(call.Name, res.OK, res.LockedSkips)
		if !res.OK && r.Logger != nil {
			r.Logger.LogAttrs(ctx, slog.LevelDebug, "tool call refused", slog.String("thread", t.Workspace.ThreadID()),
				slog.String("tool", call.Name), slog.String("result", res.Content))
		}
		out[i] = res.Content
	}
	return out, nil
}

// messages are the assistant message of a round and one tool message per call.
func (rd *round) messages(results []string) []json.RawMessage {
	msg := rawjson.Object{}
	msg.Set("role", rawjson.String("assistant"))
	content := rd.content
	if len(content) == 0 {
		content = json.RawMessage("null")
	}
	msg.Set("content", content)
	calls := make([]json.RawMessage, len(rd.calls))
	for i, c := range rd.calls {
		fn := rawjson.Object{}
		fn.Set("name", rawjson.String(c.Name))
		fn.Set("arguments", rawjson.String(c.Arguments))
		tc := rawjson.Object{}
		tc.Set("id", rawjson.String(c.ID))
		tc.Set("type", rawjson.String("function"))
		tc.Set("function", fn.Bytes())
		calls[i] = tc.Bytes()
	}
	msg.Set("tool_calls", rawjson.AppendArray(nil, calls))
	if len(rd.reasoning) > 0 {
		// Servers that return reasoning_content (DeepSeek, vLLM) expect it back within a turn.
		msg.Set("reasoning_content", rd.reasoning)
	}
	out := []json.RawMessage{msg.Bytes()}
	for i, c := range rd.calls {
		tm := rawjson.Object{}
		tm.Set("role", rawjson.String("tool"))
		tm.Set("tool_call_id", rawjson.String(c.ID))
		tm.Set("content", rawjson.String(results[i]))
		out = append(out, tm.Bytes())
	}
	return out
}

// completion is a parsed non-streamed response.
type completion struct {
	top     rawjson.Object
	choices []json.RawMessage
	choice  rawjson.Object // choices[0]
	message rawjson.Object
	round   round
}

func parseCompletion(raw []byte) (*completion, error) {
	bad := func(what string) error { return fmt.Errorf("%w: %s", ErrUpstreamProtocol, what) }
	c := &completion{}
	var err error
	if c.top, err = rawjson.Parse(raw); err != nil {
		return nil, bad("the body is not a JSON object")
	}
	if c.choices, err = rawjson.Split(c.top.Get("choices")); err != nil || len(c.choices) == 0 {
		return nil, bad("no choices")
	}
	if c.choice, err = rawjson.Parse(c.choices[0]); err != nil {
		return nil, bad("a choice is not an object")
	}
	if c.message, err = rawjson.Parse(c.choice.Get("message")); err != nil {
		return nil, bad("a choice has no message")
	}
	c.round.content = c.message.Get("content")
	if c.message.Has("reasoning_content") {
		c.round.reasoning = c.message.Get("reasoning_content")
	}
	if tcs := c.message.Get("tool_calls"); tcs != nil && string(tcs) != "null" {
		raws, err := rawjson.Split(tcs)
		if err != nil {
			return nil, bad("tool_calls is not an array")
		}
		for _, tc := range raws {
			var d struct {
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			}
			if err := json.Unmarshal(tc, &d); err != nil {
				return nil, bad("a tool call is not understood")
			}
			if d.ID == "" {
				d.ID = newCallID()
			}
			c.round.calls = append(c.round.calls, toolCall{ID: d.ID, Name: d.Function.Name, Arguments: d.Function.Arguments, Raw: tc})
		}
	}
	return c, nil
}

// answer is the response the client gets when the turn ends with this completion: the
// message's tool calls cut down to the client's (finish_reason "tool_calls" when any remain,
// else "stop" if the model had only called workspace tools), and the usage summed over rounds.
func (c *completion) answer(clientCalls []toolCall, sumUsage bool, usage *usageSum) []byte {
	if len(c.round.calls) != len(clientCalls) {
		if len(clientCalls) == 0 {
			c.message.Del("tool_calls")
			c.choice.Set("finish_reason", rawjson.String("stop"))
		} else {
			raws := make([]json.RawMessage, len(clientCalls))
			for i, tc := range clientCalls {
				raws[i] = tc.Raw
			}
			c.message.Set("tool_calls", rawjson.AppendArray(nil, raws))
			c.choice.Set("finish_reason", rawjson.String("tool_calls"))
		}
		c.choice.Set("message", c.message.Bytes())
		choices := append([]json.RawMessage{c.choice.Bytes()}, c.choices[1:]...)
		c.top.Set("choices", rawjson.AppendArray(nil, choices))
	}
	if sumUsage && !usage.empty() {
		c.top.Set("usage", usage.json())
	}
	return c.top.Bytes()
}

// usageSum adds up the usage objects of a turn's rounds: every number, nested ones
// (prompt_tokens_details, …) included; anything else keeps its last value. It keeps the raw
// objects and sums them only when asked, so a turn of one round decodes nothing.
type usageSum struct{ raws []json.RawMessage }

// add keeps a round's usage; raw must stay unchanged until json is called.
func (u *usageSum) add(raw json.RawMessage) {
	if len(raw) > 0 && string(raw) != "null" {
		u.raws = append(u.raws, raw)
	}
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
