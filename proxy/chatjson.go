package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// maxResponseBody caps a non-streamed upstream response.
const maxResponseBody = 64 << 20

// chatJSON is the dialect of a non-streamed chat completions turn: each round's reply is one
// JSON body, and the client gets one body at the end.
type chatJSON struct {
	req  *ChatRequest
	up   Upstream
	last *completion // the last round's reply
	// body and header are the client's answer, set by finish.
	body   []byte
	header http.Header
	raw    []byte // the last round's body, as it came
}

func (d *chatJSON) request(withWorkspaceTools bool) Payload { return d.req.Body(withWorkspaceTools) }

// postJSON sends a round's body upstream and reads its non-streamed answer, up to
// maxResponseBody.
func postJSON(ctx context.Context, up Upstream, body Payload) ([]byte, http.Header, error) {
	resp, err := up.Post(ctx, body)
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

func (d *chatJSON) fetch(ctx context.Context, body Payload) ([]toolCall, json.RawMessage, roundInfo, error) {
	raw, header, err := postJSON(ctx, d.up, body)
	if err != nil {
		return nil, nil, roundInfo{}, err
	}
	c, err := parseCompletion(raw)
	if err != nil {
		return nil, nil, roundInfo{}, err
	}
	for i := range c.calls {
		c.calls[i].Client = d.req.IsClientTool(c.calls[i].Name)
	}
	d.last, d.raw, d.header = c, raw, header
	info := roundInfo{}
	info.model, _ = rawjson.Unquote(c.top.Get("model"))
	info.id, _ = rawjson.Unquote(c.top.Get("id"))
	if fr, ok := rawjson.Unquote(c.choice.Get("finish_reason")); ok {
		info.finishReasons = []string{fr}
	}
	return c.calls, c.top.Get("usage"), info, nil
}

func (d *chatJSON) pause() error { return nil }

func (d *chatJSON) extend(calls []toolCall, results []string) {
	d.req.appendRound(d.last.message.Get("content"), d.last.reasoning(), calls, results)
}

// finish answers with the last reply: untouched when the turn was one round without workspace
// calls (the proxy is invisible), else with the workspace's calls cut out and the usage summed.
func (d *chatJSON) finish(clientCalls []toolCall, usage *usageSum, rounds int) error {
	if rounds == 1 && len(d.last.calls) == len(clientCalls) {
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
}

// reasoning is the message's reasoning_content, nil when it has none.
func (c *completion) reasoning() json.RawMessage {
	if c.message.Has("reasoning_content") {
		return c.message.Get("reasoning_content")
	}
	return nil
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
			c.calls = append(c.calls, toolCall{ID: d.ID, Name: d.Function.Name, Arguments: d.Function.Arguments, Raw: tc})
		}
	}
	return c, nil
}

// answer is the response the client gets when the turn ends with this completion: the
// message's tool calls cut down to the client's (finish_reason "tool_calls" when any remain,
// else "stop" if the model had only called workspace tools), and the usage summed over rounds.
func (c *completion) answer(clientCalls []toolCall, sumUsage bool, usage *usageSum) []byte {
	if len(c.calls) != len(clientCalls) {
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
