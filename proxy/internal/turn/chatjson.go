package turn

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// chatJSON is the dialect of a non-streamed chat completions turn: each round's reply is one
// JSON body, and the client gets one body at the end.
type chatJSON struct {
	req    *ChatRequest
	up     Upstream
	log    *slog.Logger // nil logs nothing
	thread string
	last   *completion // the last round's reply
	jsonAnswer
}

func (d *chatJSON) request(withWorkspaceTools bool) Payload { return d.req.Body(withWorkspaceTools) }

func (d *chatJSON) fetch(ctx context.Context, body Payload) ([]toolCall, usage, roundInfo, error) {
	raw, err := d.post(ctx, d.up, body)
	if err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	c, err := parseCompletion(raw, d.req.IsClientTool)
	if err != nil {
		return nil, usage{}, roundInfo{}, err
	}
	d.last = c
	info := roundInfo{model: text(c.top.Get("model")), id: text(c.top.Get("id"))}
	if fr := text(c.choice.Get("finish_reason")); fr != "" {
		info.finishReasons = []string{fr}
	}
	return c.calls, chatTokens(c.top.Get("usage")), info, nil
}

func (d *chatJSON) extend(calls []toolCall, results []tools.Result) {
	content, cut := capText(d.last.message.Get("content"))
	reasoning := d.last.reasoning()
	for i, v := range reasoning.Vals {
		var c bool
		reasoning.Vals[i], c = capText(v)
		cut = cut || c
	}
	if cut && d.log != nil {
		d.log.Warn("round text over the cap sent back truncated", slog.String("thread", d.thread), slog.Int("cap", maxRoundText))
	}
	d.req.appendRound(content, reasoning, calls, results)
}

// capText is a raw JSON string cut to its first maxRoundText bytes of text (at a character's
// boundary) when it is longer; cut reports that it was.
func capText(raw json.RawMessage) (_ json.RawMessage, cut bool) {
	if len(raw) <= maxRoundText+2 || raw[0] != '"' {
		return raw, false
	}
	s := text(raw)
	if len(s) <= maxRoundText {
		return raw, false
	}
	return rawjson.String(strings.ToValidUTF8(s[:maxRoundText], "")), true
}

// finish answers with the last reply: untouched when the turn was one round without workspace
// calls (the proxy is invisible), else with the workspace's calls cut out and the usage summed.
func (d *chatJSON) finish(clientCalls []toolCall, usage *usageSum, rounds int) error {
	if rounds == 1 && !d.last.changed(clientCalls) {
		d.body = d.raw
		return nil
	}
	d.body = d.last.answer(clientCalls, rounds > 1, usage)
	return nil
}

// completion is a parsed non-streamed response.
type completion struct {
	top     rawjson.Object
	choices []json.RawMessage
	choice  rawjson.Object // choices[0]
	message rawjson.Object
	calls   []toolCall
	// sent is how many tool calls the message holds, as the upstream sent them; unwrapped is
	// set when a parallel wrapper among them was replaced by its calls.
	sent      int
	unwrapped bool
}

// reasoning is the message's reasoning members (reasoning_content, reasoning), as they came.
func (c *completion) reasoning() rawjson.Object {
	var r rawjson.Object
	for _, k := range reasoningKeys {
		if v := c.message.Get(k); !isNull(v) {
			r.Set(k, v)
		}
	}
	return r
}

// parseCompletion reads a non-streamed response. Only its tool calls are the proxy's to
// understand: a body without choices or message holds no call, and a tool call that is not an
// object is the client's, as it came.
func parseCompletion(raw []byte, client func(string) bool) (*completion, error) {
	c := &completion{}
	var err error
	if c.top, err = rawjson.Parse(raw); err != nil {
		return nil, fmt.Errorf("%w: the body is not a JSON object", apierr.ErrUpstreamProtocol)
	}
	if v := c.top.Get("choices"); !isNull(v) {
		c.choices, _ = rawjson.Split(v)
	}
	if len(c.choices) == 0 {
		return c, nil
	}
	if c.choice, err = rawjson.Parse(c.choices[0]); err != nil {
		return c, nil
	}
	if c.message, err = rawjson.Parse(c.choice.Get("message")); err != nil {
		return c, nil
	}
	tcs := c.message.Get("tool_calls")
	if isNull(tcs) {
		return c, nil
	}
	raws, err := rawjson.Split(tcs)
	if err != nil {
		return c, nil
	}
	c.sent = len(raws)
	calls := make([]toolCall, 0, len(raws))
	for _, tc := range raws {
		d, _, ok := readChatCall(tc)
		call := toolCall{ID: d.id, Name: d.name, Arguments: d.args, Raw: tc, Client: !ok || client(d.name)}
		if call.ID == "" && !call.Client {
			call.ID = newCallID() // the round sent back needs one
		}
		calls = append(calls, call)
	}
	c.calls, c.unwrapped = unwrapParallel(calls, client)
	return c, nil
}

// changed reports whether the client's answer differs from the upstream's message: some of its
// calls were the workspace's, or a parallel wrapper was unwrapped.
func (c *completion) changed(clientCalls []toolCall) bool {
	return c.unwrapped || len(clientCalls) != c.sent
}

// answer is the response the client gets when the turn ends with this completion: the
// message's tool calls cut down to the client's (finish_reason "tool_calls" when any remain,
// else "stop" if the model had only called workspace tools), and the usage summed over rounds.
func (c *completion) answer(clientCalls []toolCall, sumUsage bool, usage *usageSum) []byte {
	if c.changed(clientCalls) {
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
