package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	openaigo "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// The differential harness of docs/spec.md §16: every recording of testdata/wire (real servers'
// streams and bodies, see its README) is replayed by a fake upstream and read by the official
// client of its API (openai-go; anthropic-sdk-go for the Messages API, its streams through
// Message.Accumulate) twice — straight from the fake, and through a thread turn of wsproxy — and
// the two readouts must be equal: text, reasoning, tool calls, finish reason, usage, every event
// and output item, errors. Mutants of every recording (null and absent members, unknown members,
// item and event types, keys re-ordered, event lines, CRLF, comments, one byte per write) must be
// read the same way too, and so must FuzzWire's; a recording's client call renamed to a
// workspace tool must be run by the proxy and leave nothing of itself in what the client reads.

// wireEntry is one recording.
type wireEntry struct {
	name     string // provider/file
	api      string // "chat", "responses", "messages" or "gemini"
	streamed bool
	body     []byte
}

// wireCorpus reads testdata/wire.
func wireCorpus(t testing.TB) []wireEntry {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "wire", "*", "*"))
	require.NoError(t, err)
	var out []wireEntry
	for _, p := range paths {
		ext := filepath.Ext(p)
		if ext != ".sse" && ext != ".json" {
			continue
		}
		base := filepath.Base(p)
		api, _, _ := strings.Cut(base, "-")
		if api != "chat" && api != "responses" && api != "messages" && api != "gemini" {
			continue
		}
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out = append(out, wireEntry{name: filepath.Base(filepath.Dir(p)) + "/" + base, api: api, streamed: ext == ".sse", body: b})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// wireUpstream replays scripted bodies: each case (the X-Wire-Case header) has its queue of
// replies, one per request.
type wireUpstream struct {
	mu    sync.Mutex
	cases map[string][]wireReply
}

type wireReply struct {
	streamed bool
	body     []byte
	bytewise bool // one byte per write, each flushed
}

func (u *wireUpstream) script(id string, replies ...wireReply) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cases == nil {
		u.cases = map[string][]wireReply{}
	}
	u.cases[id] = append(u.cases[id], replies...)
}

func (u *wireUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Wire-Case")
	u.mu.Lock()
	q := u.cases[id]
	var rep wireReply
	ok := len(q) > 0
	if ok {
		rep, u.cases[id] = q[0], q[1:]
	}
	u.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":{"message":"unscripted wire case `+id+`"}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if rep.streamed {
		w.Header().Set("Content-Type", "text/event-stream")
	}
	w.WriteHeader(http.StatusOK)
	if !rep.bytewise {
		_, _ = w.Write(rep.body)
		return
	}
	rc := http.NewResponseController(w)
	for i := range rep.body {
		if _, err := w.Write(rep.body[i : i+1]); err != nil {
			return
		}
		_ = rc.Flush()
	}
}

// wireHarness is a fake upstream, reached straight and through a proxy in front of it.
type wireHarness struct {
	up       *wireUpstream
	straight string // the fake upstream's base URL
	env      *env
	n        atomic.Int64
	// client is the clients' one HTTP client: openai-go's default has a transport of its own per
	// client, whose idle connections would outlive it.
	client *http.Client
}

func newWireHarness(t testing.TB) *wireHarness {
	h := &wireHarness{up: &wireUpstream{}, client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	srv := httptest.NewServer(h.up)
	t.Cleanup(srv.Close)
	t.Cleanup(h.client.CloseIdleConnections)
	h.straight = srv.URL + "/v1/"
	h.env = setup(t, withGemini(""))
	h.env.up.Fallback = h.up.ServeHTTP
	return h
}

// readout is what a client makes of a response.
type readout struct {
	Err string `json:",omitempty"`
	// Chat: the accumulated completion (streamed) or the body (not).
	ID, Model, SystemFingerprint, Content, Refusal, Reasoning, Finish string   `json:",omitempty"`
	Calls                                                             []string `json:",omitempty"`
	Usage                                                             []string `json:",omitempty"`
	// Events are a stream's events, each as the client decoded it (canonical JSON, without the
	// sequence_number the proxy renumbers); Body the non-streamed body or the terminal event's
	// response.
	Events []string `json:",omitempty"`
	Body   string   `json:",omitempty"`
}

// read sends e's request to base (straight, or through the proxy with thread) and reads the
// answer as openai-go does.
func (h *wireHarness) read(t testing.TB, e wireEntry, id, base, thread string) readout {
	t.Helper()
	if e.api == "messages" {
		return readMessages(t, e, id, strings.TrimSuffix(base, "/v1/"), thread)
	}
	if e.api == "gemini" {
		return readGemini(t, h, e, id, strings.TrimSuffix(base, "/v1/"), thread)
	}
	opts := []option.RequestOption{option.WithBaseURL(base), option.WithAPIKey("sk-wire"), option.WithMaxRetries(0),
		option.WithHeader("X-Wire-Case", id), option.WithHTTPClient(h.client)}
	if thread != "" {
		opts = append(opts, option.WithHeader("X-Thread-Id", thread))
	}
	client := openaigo.NewClient(opts...)
	ctx := context.Background()
	names := clientToolNames(e.body)
	var r readout
	switch {
	case e.api == "chat" && !e.streamed:
		c, err := client.Chat.Completions.New(ctx, chatParams(names))
		r.Err = errText(err)
		if err == nil {
			r.Body = canonical(t, c.RawJSON())
		}
	case e.api == "chat":
		stream := client.Chat.Completions.NewStreaming(ctx, chatParams(names))
		acc := openaigo.ChatCompletionAccumulator{}
		for stream.Next() {
			chunk := stream.Current()
			acc.AddChunk(chunk)
			var raw struct {
				Choices []struct {
					Delta map[string]json.RawMessage `json:"delta"`
				} `json:"choices"`
			}
			_ = json.Unmarshal([]byte(chunk.RawJSON()), &raw)
			for _, c := range raw.Choices {
				for _, k := range []string{"reasoning_content", "reasoning"} {
					r.Reasoning += text(c.Delta[k])
				}
			}
			if u := chunk.Usage.RawJSON(); u != "" && u != "null" {
				r.Usage = append(r.Usage, canonical(t, u))
			}
		}
		r.Err = errText(stream.Err())
		r.ID, r.Model, r.SystemFingerprint = acc.ID, acc.Model, acc.SystemFingerprint
		if len(acc.Choices) > 0 {
			m := acc.Choices[0].Message
			r.Content, r.Refusal, r.Finish = m.Content, m.Refusal, acc.Choices[0].FinishReason
			for _, tc := range m.ToolCalls {
				r.Calls = append(r.Calls, tc.ID+" "+tc.Function.Name+" "+tc.Function.Arguments)
			}
		}
	case !e.streamed:
		resp, err := client.Responses.New(ctx, responsesParams(names))
		r.Err = errText(err)
		if err == nil {
			r.Body = canonical(t, resp.RawJSON())
		}
	default:
		stream := client.Responses.NewStreaming(ctx, responsesParams(names))
		for stream.Next() {
			ev := stream.Current()
			r.Events = append(r.Events, canonical(t, ev.RawJSON(), "sequence_number"))
			switch ev.Type {
			case "response.completed", "response.incomplete", "response.failed":
				r.Body = canonical(t, ev.Response.RawJSON())
			case "response.output_text.delta":
				r.Content += ev.Delta
			case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
				r.Reasoning += ev.Delta
			}
		}
		r.Err = errText(stream.Err())
	}
	return r
}

// readMessages sends e's Messages request to base and reads the answer as anthropic-sdk-go
// does: a body, or a stream accumulated with Message.Accumulate.
func readMessages(t testing.TB, e wireEntry, id, base, thread string) readout {
	t.Helper()
	opts := []anthropicoption.RequestOption{anthropicoption.WithBaseURL(base), anthropicoption.WithAPIKey("sk-ant-wire"),
		anthropicoption.WithMaxRetries(0), anthropicoption.WithHeader("X-Wire-Case", id)}
	if thread != "" {
		opts = append(opts, anthropicoption.WithHeader("X-Thread-Id", thread))
	}
	client := anthropic.NewClient(opts...)
	params := anthropic.MessageNewParams{Model: "wire-model", MaxTokens: 1024,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
	for _, n := range clientToolNames(e.body) {
		params.Tools = append(params.Tools, anthropic.ToolUnionParamOfTool(anthropic.ToolInputSchemaParam{}, n))
	}
	var r readout
	var m anthropic.Message
	ctx := context.Background()
	if !e.streamed {
		got, err := client.Messages.New(ctx, params)
		r.Err = anthropicErrText(err)
		if err != nil {
			return r
		}
		m = *got
	} else {
		stream := client.Messages.NewStreaming(ctx, params)
		for stream.Next() {
			ev := stream.Current()
			r.Events = append(r.Events, canonical(t, ev.RawJSON()))
			if err := m.Accumulate(ev); err != nil && r.Err == "" {
				r.Err = "accumulate: " + err.Error()
			}
		}
		if err := stream.Err(); err != nil && r.Err == "" {
			r.Err = anthropicErrText(err)
		}
	}
	r.Body = canonical(t, m.RawJSON())
	r.ID, r.Model, r.Finish = m.ID, m.Model, string(m.StopReason)
	if u := m.Usage.RawJSON(); u != "" {
		r.Usage = []string{canonical(t, u)}
	}
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			r.Content += b.Text
		case "thinking":
			r.Reasoning += b.Thinking
		case "tool_use":
			r.Calls = append(r.Calls, b.ID+" "+b.Name+" "+string(b.Input))
		}
	}
	return r
}

// anthropicErrText is what anthropic-sdk-go's client sees of an error: its status and body, or
// the stream's message.
func anthropicErrText(err error) string {
	if err == nil {
		return ""
	}
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		return strconv.Itoa(apiErr.StatusCode) + " " + apiErr.RawJSON()
	}
	return err.Error()
}

func chatParams(tools []string) openaigo.ChatCompletionNewParams {
	p := openaigo.ChatCompletionNewParams{
		Model:         "wire-model",
		Messages:      []openaigo.ChatCompletionMessageParamUnion{openaigo.UserMessage("hi")},
		StreamOptions: openaigo.ChatCompletionStreamOptionsParam{IncludeUsage: openaigo.Bool(true)},
	}
	for _, n := range tools {
		p.Tools = append(p.Tools, openaigo.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{Name: n, Parameters: shared.FunctionParameters{"type": "object"}}))
	}
	return p
}

func responsesParams(tools []string) responses.ResponseNewParams {
	p := responses.ResponseNewParams{Model: "wire-model", Input: responses.ResponseNewParamsInputUnion{OfString: openaigo.String("hi")}}
	for _, n := range tools {
		p.Tools = append(p.Tools, responses.ToolUnionParam{OfFunction: &responses.FunctionToolParam{Name: n, Strict: openaigo.Bool(false),
			Parameters: map[string]any{"type": "object"}}})
	}
	return p
}

// errText is what a client sees of an error: its status and body, or the stream's message.
func errText(err error) string {
	if err == nil {
		return ""
	}
	var apiErr *openaigo.Error
	if errors.As(err, &apiErr) {
		return strconv.Itoa(apiErr.StatusCode) + " " + apiErr.RawJSON()
	}
	return err.Error()
}

// canonical is a JSON text with its objects' members sorted (and the members drop removed from
// the top level), for comparing what two JSON texts mean.
func canonical(t testing.TB, s string, drop ...string) string {
	t.Helper()
	if s == "" {
		return ""
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "not JSON: " + s
	}
	if m, ok := v.(map[string]any); ok {
		for _, k := range drop {
			delete(m, k)
		}
	}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// clientToolNames are the function names a recording's calls use: the client's tools of the
// request that replays it.
func clientToolNames(body []byte) []string {
	seen := map[string]bool{}
	var names []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			name, _ := x["name"].(string)
			if fn, ok := x["function"].(map[string]any); ok {
				name, _ = fn["name"].(string)
			} else if x["type"] != "function_call" && x["type"] != "tool_use" {
				name = ""
			}
			if n := geminiCallName(x); n != "" {
				name = n
			}
			if name != "" && !seen[name] && !tools.IsTool(name) && name != "multi_tool_use.parallel" && name != "parallel" {
				seen[name] = true
				names = append(names, name)
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	for _, data := range payloads(body) {
		var v any
		if json.Unmarshal(data, &v) == nil {
			walk(v)
		}
	}
	sort.Strings(names)
	return names
}

// payloads are the JSON texts of a recording: the data of each event of a stream, or the body.
func payloads(body []byte) [][]byte {
	if json.Valid(body) {
		return [][]byte{body}
	}
	var out [][]byte
	for _, ev := range splitEvents(body) {
		if d := ev.data(); d != nil {
			out = append(out, d)
		}
	}
	return out
}

// sseEventLines is one event of a recorded stream: its lines as they came (without their ends).
type sseEventLines []string

// splitEvents splits a recorded stream into its events (blank-line separated; \r\n or \n).
func splitEvents(body []byte) []sseEventLines {
	text := strings.ReplaceAll(string(body), "\r\n", "\n")
	var out []sseEventLines
	for _, block := range strings.Split(text, "\n\n") {
		if strings.TrimSpace(block) == "" {
			continue
		}
		out = append(out, strings.Split(strings.Trim(block, "\n"), "\n"))
	}
	return out
}

// data is the event's data (its data lines joined), nil for none.
func (ev sseEventLines) data() []byte {
	var d []string
	for _, l := range ev {
		if v, ok := strings.CutPrefix(l, "data:"); ok {
			d = append(d, strings.TrimPrefix(v, " "))
		}
	}
	if d == nil {
		return nil
	}
	return []byte(strings.Join(d, "\n"))
}

// compare replays body as e's response straight and through the proxy, and requires the two
// readouts to be equal.
func (h *wireHarness) compare(t testing.TB, e wireEntry, body []byte, bytewise bool) {
	t.Helper()
	id := strconv.FormatInt(h.n.Add(1), 10)
	rep := wireReply{streamed: e.streamed, body: body, bytewise: bytewise}
	h.up.script("s"+id, rep)
	h.up.script("t"+id, rep)
	want := h.read(t, e, "s"+id, h.straight, "")
	got := h.read(t, e, "t"+id, h.env.srv.URL+"/v1/", "wire-"+id)
	if equalReadouts(want, readout{}) {
		t.Fatalf("%s: the client read nothing straight from the upstream", e.name)
	}
	declared := clientToolNames(body)
	for _, c := range want.Calls {
		if f := strings.Split(c, " "); !slices.Contains(declared, f[1]) {
			// A call of a tool that is neither the client's nor the workspace's (a mutant's
			// nameless call) is answered by the proxy with an error envelope, by design: not
			// comparable.
			return
		}
	}
	if !equalReadouts(want, got) {
		t.Fatalf("%s: straight and through wsproxy differ:\n%s\nrecording:\n%s", e.name, readoutDiff(want, got), workspace.Truncate(string(body), 3000))
	}
}

// readoutDiff names the fields of two readouts that differ, and the first event that does.
func readoutDiff(a, b readout) string {
	var out []string
	x, y := map[string]any{}, map[string]any{}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	_ = json.Unmarshal(ja, &x)
	_ = json.Unmarshal(jb, &y)
	for _, k := range []string{"Err", "ID", "Model", "SystemFingerprint", "Content", "Refusal", "Reasoning", "Finish", "Calls", "Usage", "Body"} {
		if fmt.Sprint(x[k]) != fmt.Sprint(y[k]) {
			out = append(out, fmt.Sprintf("%s:\n  straight: %v\n  through:  %v", k, x[k], y[k]))
		}
	}
	for i := 0; i < max(len(a.Events), len(b.Events)); i++ {
		var ea, eb string
		if i < len(a.Events) {
			ea = a.Events[i]
		}
		if i < len(b.Events) {
			eb = b.Events[i]
		}
		if ea != eb {
			out = append(out, fmt.Sprintf("event %d of %d/%d:\n  straight: %s\n  through:  %s", i, len(a.Events), len(b.Events), ea, eb))
			break
		}
	}
	return strings.Join(out, "\n")
}

func equalReadouts(a, b readout) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestWireCorpus: the corpus is what docs/spec.md §16 promises to cover.
func TestWireCorpus(t *testing.T) {
	t.Parallel()
	entries := wireCorpus(t)
	providers := map[string]bool{}
	for _, e := range entries {
		providers[strings.Split(e.name, "/")[0]] = true
	}
	require.GreaterOrEqual(t, len(entries), 40, "recordings")
	require.GreaterOrEqual(t, len(providers), 10, "providers")
}

// TestWireDifferential replays every recording straight and through a thread turn.
func TestWireDifferential(t *testing.T) {
	t.Parallel()
	h := newWireHarness(t)
	for _, e := range wireCorpus(t) {
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			h.compare(t, e, e.body, false)
		})
	}
}

// A mutation makes a variant of a recording that a client reads the same as the recording.
type mutation struct {
	name string
	// apply returns the variant of a recording, nil when the mutation does not apply to it.
	apply    func(e wireEntry) []byte
	bytewise bool // served one byte per write
}

// Members that servers send as null or leave out, by API: nulled, then dropped, by the
// mutations.
var optionalMembers = map[string][]string{
	"chat": {"role", "content", "refusal", "reasoning_content", "reasoning", "tool_calls", "logprobs", "function_call", "audio",
		"annotations", "system_fingerprint", "service_tier", "usage", "prompt_tokens_details", "completion_tokens_details"},
	"responses": {"logprobs", "annotations", "obfuscation", "input_tokens_details", "output_tokens_details", "metadata",
		"instructions", "incomplete_details", "user", "prompt_cache_key", "safety_identifier", "top_logprobs", "service_tier"},
	"messages": {"stop_reason", "stop_sequence", "cache_creation_input_tokens", "cache_read_input_tokens", "cache_creation",
		"service_tier", "citations", "server_tool_use", "container", "stop_details", "request_id"},
	"gemini": {"role", "finishReason", "finishMessage", "index", "safetyRatings", "usageMetadata", "promptTokensDetails",
		"thoughtsTokenCount", "candidatesTokenCount", "modelVersion", "responseId", "text"},
}

var mutations = []mutation{
	{name: "NullOptional", apply: func(e wireEntry) []byte {
		keys := optionalMembers[e.api]
		return eachPayload(e, func(o *rawjson.Object, _ int) {
			for _, k := range keys {
				if o.Index(k) >= 0 {
					o.Set(k, json.RawMessage("null"))
				}
			}
		})
	}},
	{name: "DropNulls", apply: func(e wireEntry) []byte {
		return eachPayload(e, func(o *rawjson.Object, _ int) {
			for i := len(o.Keys) - 1; i >= 0; i-- {
				if string(o.Vals[i]) == "null" {
					o.Del(o.Keys[i])
				}
			}
		})
	}},
	{name: "UnknownMembers", apply: func(e wireEntry) []byte {
		return eachPayload(e, func(o *rawjson.Object, depth int) {
			if depth <= 3 {
				o.Set("x_wsproxy_future", json.RawMessage(`{"a":[1,null,"b"],"n":{"deep":true}}`))
			}
		})
	}},
	{name: "ReorderedKeys", apply: func(e wireEntry) []byte {
		return eachPayload(e, func(o *rawjson.Object, _ int) {
			for i, j := 0, len(o.Keys)-1; i < j; i, j = i+1, j-1 {
				o.Keys[i], o.Keys[j] = o.Keys[j], o.Keys[i]
				o.Vals[i], o.Vals[j] = o.Vals[j], o.Vals[i]
			}
		})
	}},
	{name: "UnknownEventsAndItems", apply: unknownEventsAndItems},
	{name: "EventLines", apply: func(e wireEntry) []byte {
		if !e.streamed {
			return nil
		}
		if e.api == "messages" {
			// Anthropic's SDKs read only named events: the name goes after the data instead.
			return mapEvents(e.body, func(ev sseEventLines) sseEventLines {
				var name, out sseEventLines
				for _, l := range ev {
					if strings.HasPrefix(l, "event:") {
						name = append(name, l)
						continue
					}
					out = append(out, l)
				}
				return append(out, name...)
			})
		}
		return mapEvents(e.body, func(ev sseEventLines) sseEventLines {
			var out sseEventLines
			hasName := false
			for _, l := range ev {
				if strings.HasPrefix(l, "event:") {
					hasName = true
					continue // a server that sends no event lines
				}
				out = append(out, l)
			}
			if !hasName && e.api == "chat" {
				out = append(sseEventLines{"event: message"}, out...) // a server that names every event
			}
			return out
		})
	}},
	{name: "CRLF", apply: func(e wireEntry) []byte {
		if !e.streamed {
			return nil
		}
		return bytes.ReplaceAll(bytes.ReplaceAll(e.body, []byte("\r\n"), []byte("\n")), []byte("\n"), []byte("\r\n"))
	}},
	{name: "Comments", apply: func(e wireEntry) []byte {
		if !e.streamed || e.api == "gemini" { // no Gemini server sends comments, and Google's SDKs fail on them
			return nil
		}
		return append([]byte(": OPENROUTER PROCESSING\n\n"), mapEvents(e.body, func(ev sseEventLines) sseEventLines {
			return append(sseEventLines{": keepalive", ""}, ev...)
		})...)
	}},
	{name: "Indented", apply: func(e wireEntry) []byte {
		if e.streamed {
			return nil
		}
		var b bytes.Buffer
		if json.Indent(&b, e.body, "", "    ") != nil {
			return nil
		}
		return b.Bytes()
	}},
	{name: "OneBytePerRead", apply: func(e wireEntry) []byte { return e.body }, bytewise: true},
}

// eachPayload applies f to every object of every JSON payload of a recording (depth 0 for a
// payload itself), keeping the rest of the recording as it is.
func eachPayload(e wireEntry, f func(o *rawjson.Object, depth int)) []byte {
	if !e.streamed {
		if !json.Valid(e.body) {
			return nil
		}
		return walkObjects(e.body, 0, f)
	}
	return mapEvents(e.body, func(ev sseEventLines) sseEventLines {
		d := ev.data()
		if d == nil || !json.Valid(d) {
			return ev
		}
		var out sseEventLines
		for _, l := range ev {
			if !strings.HasPrefix(l, "data:") {
				out = append(out, l)
			}
		}
		return append(out, "data: "+string(walkObjects(d, 0, f)))
	})
}

// walkObjects rewrites every object of a JSON value with f, innermost first.
func walkObjects(raw []byte, depth int, f func(o *rawjson.Object, depth int)) []byte {
	switch raw[0] {
	case '{':
		o, err := rawjson.Parse(raw)
		if err != nil {
			return raw
		}
		for i, v := range o.Vals {
			o.Vals[i] = walkObjects(v, depth+1, f)
		}
		f(&o, depth)
		return o.Bytes()
	case '[':
		items, err := rawjson.Split(raw)
		if err != nil {
			return raw
		}
		for i, v := range items {
			items[i] = walkObjects(v, depth+1, f)
		}
		return rawjson.AppendArray(nil, items)
	}
	return raw
}

// mapEvents rewrites each event of a recorded stream with f; a stream's lines end in \n.
func mapEvents(body []byte, f func(sseEventLines) sseEventLines) []byte {
	var b bytes.Buffer
	for _, ev := range splitEvents(body) {
		for _, l := range f(ev) {
			b.WriteString(l + "\n")
		}
		b.WriteString("\n")
	}
	return b.Bytes()
}

// unknownEventsAndItems adds what a newer server sends: an event type and an output item type
// nobody knows yet (Responses), a chunk without choices carrying a member nobody knows (chat).
func unknownEventsAndItems(e wireEntry) []byte {
	future := json.RawMessage(`{"type":"x_future_item","id":"xfi_1","status":"completed","payload":{"k":[1]}}`)
	withItem := func(resp json.RawMessage) (json.RawMessage, int) {
		o, err := rawjson.Parse(resp)
		if err != nil {
			return resp, 0
		}
		items, _ := rawjson.Split(o.Get("output"))
		o.Set("output", rawjson.AppendArray(nil, append(items, future)))
		return o.Bytes(), len(items)
	}
	switch {
	case e.api == "messages":
		return unknownMessagesEventsAndBlocks(e)
	case e.api == "gemini":
		return unknownGeminiParts(e)
	case e.api == "responses" && !e.streamed:
		b, _ := withItem(e.body)
		return b
	case e.api == "responses":
		var out []sseEventLines
		for i, ev := range splitEvents(e.body) {
			o, err := rawjson.Parse(ev.data())
			typ := text(o.Get("type"))
			if err == nil && (typ == "response.completed" || typ == "response.incomplete" || typ == "response.failed") {
				resp, n := withItem(o.Get("response"))
				o.Set("response", resp)
				index := "" // as the server numbers its items, or not (llama.cpp)
				if bytes.Contains(e.body, []byte(`"output_index"`)) {
					index = fmt.Sprintf(`,"output_index":%d`, n)
				}
				for _, t := range []string{"response.output_item.added", "response.output_item.done"} {
					out = append(out, sseEventLines{"event: " + t, fmt.Sprintf(`data: {"type":%q,"sequence_number":900%s,"item":%s}`, t, index, future)})
				}
				ev = sseEventLines{"event: " + typ, "data: " + string(o.Bytes())}
			}
			out = append(out, ev)
			if i == 0 {
				out = append(out, sseEventLines{"event: response.x_future_event",
					`data: {"type":"response.x_future_event","sequence_number":901,"payload":{"k":1}}`})
			}
		}
		return mapEvents(joinEvents(out), func(ev sseEventLines) sseEventLines { return ev })
	case e.streamed:
		events := splitEvents(e.body)
		first, err := rawjson.Parse(events[0].data())
		if err != nil {
			return nil
		}
		extra := rawjson.Object{}
		for _, k := range []string{"id", "object", "created", "model"} {
			if v := first.Get(k); v != nil {
				extra.Set(k, v)
			}
		}
		extra.Set("choices", json.RawMessage("[]"))
		extra.Set("x_wsproxy_future", json.RawMessage(`{"k":1}`))
		return joinEvents(append([]sseEventLines{{"data: " + string(extra.Bytes())}}, events...))
	}
	return nil
}

// unknownMessagesEventsAndBlocks adds to a Messages recording what a newer server sends: a content
// block of a type nobody knows yet (last of the content; streamed, its start and stop before
// message_delta) and, streamed, an event type nobody knows after message_start.
func unknownMessagesEventsAndBlocks(e wireEntry) []byte {
	future := json.RawMessage(`{"type":"x_future_block","id":"xfb_1","payload":{"k":[1]}}`)
	if !e.streamed {
		o, err := rawjson.Parse(e.body)
		if err != nil {
			return nil
		}
		blocks, _ := rawjson.Split(o.Get("content"))
		o.Set("content", rawjson.AppendArray(nil, append(blocks, future)))
		return o.Bytes()
	}
	var out []sseEventLines
	blocks := 0
	for i, ev := range splitEvents(e.body) {
		o, _ := rawjson.Parse(ev.data())
		switch text(o.Get("type")) {
		case "content_block_start":
			blocks++
		case "message_delta":
			out = append(out,
				sseEventLines{"event: content_block_start", fmt.Sprintf(`data: {"type":"content_block_start","index":%d,"content_block":%s}`, blocks, future)},
				sseEventLines{"event: content_block_stop", fmt.Sprintf(`data: {"type":"content_block_stop","index":%d}`, blocks)})
		}
		out = append(out, ev)
		if i == 0 {
			out = append(out, sseEventLines{"event: x_future_event", `data: {"type":"x_future_event","payload":{"k":1}}`})
		}
	}
	return joinEvents(out)
}

func joinEvents(events []sseEventLines) []byte {
	var b bytes.Buffer
	for _, ev := range events {
		b.WriteString(strings.Join(ev, "\n") + "\n\n")
	}
	return b.Bytes()
}

// TestWireMutations: every mutant of every recording is read the same straight and through.
func TestWireMutations(t *testing.T) {
	t.Parallel()
	h := newWireHarness(t)
	for _, e := range wireCorpus(t) {
		for _, m := range mutations {
			body := m.apply(e)
			if body == nil {
				continue
			}
			t.Run(e.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				h.compare(t, e, body, m.bytewise)
			})
		}
	}
}

// workspaceVariant is a recording with its first client function (by name) renamed to the
// workspace's list_preferences, and the arguments of its calls re-cut; ok is false for a
// recording without a client call.
func workspaceVariant(e wireEntry) (body []byte, renamed string, ok bool) {
	names := clientToolNames(e.body)
	if len(names) == 0 {
		return nil, "", false
	}
	renamed = names[0]
	rename := func(o *rawjson.Object, _ int) {
		if fn, err := rawjson.Parse(o.Get("function")); err == nil && text(fn.Get("name")) == renamed {
			fn.Set("name", rawjson.String(tools.ListPreferences))
			o.Set("function", fn.Bytes())
		}
		if typ := text(o.Get("type")); (typ == "function_call" || typ == "tool_use") && text(o.Get("name")) == renamed {
			o.Set("name", rawjson.String(tools.ListPreferences))
		}
		renameGeminiCall(o, renamed, tools.ListPreferences)
	}
	body = eachPayload(e, rename)
	if e.streamed && e.api != "messages" && e.api != "gemini" {
		body = recutArguments(wireEntry{api: e.api, streamed: true, body: body})
	}
	return body, renamed, true
}

// recutArguments moves one character of each argument piece of the workspace's calls to the
// piece before it: the same arguments, cut elsewhere.
func recutArguments(e wireEntry) []byte {
	type piece struct {
		event int
		set   func(string) []byte
		text  string
	}
	events := splitEvents(e.body)
	byCall := map[string][]*piece{} // the pieces of each workspace call, in order
	var order []string
	owner := map[string]string{} // chat: index (or "open") → call key; Responses: item id → call key
	for i, ev := range events {
		data := ev.data()
		o, err := rawjson.Parse(data)
		if err != nil {
			continue
		}
		add := func(key, args string, set func(string) []byte) {
			if _, seen := byCall[key]; !seen {
				order = append(order, key)
			}
			byCall[key] = append(byCall[key], &piece{event: i, set: set, text: args})
		}
		if e.api == "responses" {
			if item, err := rawjson.Parse(o.Get("item")); err == nil && text(item.Get("name")) == tools.ListPreferences {
				owner[text(item.Get("id"))] = text(item.Get("id"))
			}
			if key, ok := owner[text(o.Get("item_id"))]; ok && text(o.Get("type")) == "response.function_call_arguments.delta" {
				add(key, text(o.Get("delta")), func(s string) []byte { o.Set("delta", rawjson.String(s)); return o.Bytes() })
			}
			continue
		}
		choices, _ := rawjson.Split(o.Get("choices"))
		if len(choices) == 0 {
			continue
		}
		choice, _ := rawjson.Parse(choices[0])
		delta, _ := rawjson.Parse(choice.Get("delta"))
		items, err := rawjson.Split(delta.Get("tool_calls"))
		if err != nil {
			continue
		}
		for j, it := range items {
			entry, err := rawjson.Parse(it)
			if err != nil {
				continue
			}
			fn, _ := rawjson.Parse(entry.Get("function"))
			name, args := text(fn.Get("name")), text(fn.Get("arguments"))
			slot := "open"
			if index := entry.Get("index"); index != nil && string(index) != "null" {
				slot = string(index)
			}
			if name != "" {
				owner[slot] = ""
				if name == tools.ListPreferences {
					owner[slot] = fmt.Sprintf("%d/%d", i, j)
				}
			}
			key := owner[slot]
			if key == "" || args == "" {
				continue
			}
			add(key, args, func(s string) []byte {
				fn, _ := rawjson.Parse(entry.Get("function"))
				fn.Set("arguments", rawjson.String(s))
				entry.Set("function", fn.Bytes())
				items[j] = entry.Bytes()
				delta.Set("tool_calls", rawjson.AppendArray(nil, items))
				choice.Set("delta", delta.Bytes())
				choices[0] = choice.Bytes()
				o.Set("choices", rawjson.AppendArray(nil, choices))
				return o.Bytes()
			})
		}
	}
	for _, key := range order {
		ps := byCall[key]
		for k := 1; k < len(ps); k++ {
			if r := []rune(ps[k].text); len(r) > 1 {
				ps[k-1].text += string(r[0])
				ps[k].text = string(r[1:])
			}
		}
		for _, p := range ps {
			data := p.set(p.text)
			var ev sseEventLines
			for _, l := range events[p.event] {
				if !strings.HasPrefix(l, "data:") {
					ev = append(ev, l)
				}
			}
			events[p.event] = append(ev, "data: "+string(data))
		}
	}
	return joinEvents(events)
}

// textRound is a round that answers "Done." in e's wire format.
func textRound(e wireEntry) wireReply {
	switch {
	case e.api == "gemini":
		return geminiTextRound(e)
	case e.api == "messages":
		done := upstreamtest.MessageReply{ID: "msg_done", Blocks: []upstreamtest.Block{upstreamtest.TextBlock("Done.")}}
		if e.streamed {
			return wireReply{streamed: true, body: []byte(strings.Join(done.Events(), ""))}
		}
		return wireReply{body: []byte(done.JSON())}
	case e.api == "chat" && e.streamed:
		return wireReply{streamed: true, body: []byte(strings.Join(upstreamtest.Events(upstreamtest.ContentChunks("chatcmpl-done", "Done.")...), "") + "data: [DONE]\n\n")}
	case e.api == "chat":
		return wireReply{body: []byte(upstreamtest.Completion("Done."))}
	}
	spec := upstreamtest.ResponseSpec{ID: "resp_done", Flavor: upstreamtest.VLLM, Items: []upstreamtest.Item{upstreamtest.Message("msg_done", "Done.")}}
	if e.streamed {
		return wireReply{streamed: true, body: []byte(strings.Join(spec.Events(), ""))}
	}
	return wireReply{body: []byte(spec.JSON())}
}

// TestWireWorkspaceVariants: in every recording with a client call, that call renamed to a
// workspace tool is run by the proxy; the client reads one valid answer with nothing of the
// workspace call in it: the recording's other calls, or — when none is left — the next round's
// text after the recording's.
func TestWireWorkspaceVariants(t *testing.T) {
	t.Parallel()
	h := newWireHarness(t)
	for _, e := range wireCorpus(t) {
		body, renamed, ok := workspaceVariant(e)
		if !ok {
			continue
		}
		t.Run(e.name, func(t *testing.T) {
			t.Parallel()
			id := strconv.FormatInt(h.n.Add(1), 10)
			h.up.script("s"+id, wireReply{streamed: e.streamed, body: e.body})
			want := h.read(t, e, "s"+id, h.straight, "")
			require.Empty(t, want.Err, "the recording reads without error")
			var others []string
			for _, c := range want.Calls {
				if f := strings.Fields(c); len(f) < 2 || f[1] != renamed {
					others = append(others, c)
				}
			}
			h.up.script("t"+id, wireReply{streamed: e.streamed, body: body}, textRound(e))
			thread := "variant-" + id
			got := h.read(t, e, "t"+id, h.env.srv.URL+"/v1/", thread)
			require.Empty(t, got.Err)
			all, _ := json.Marshal(got)
			require.NotContains(t, string(all), tools.ListPreferences, "nothing of the workspace call reaches the client")
			calls := h.env.toolCalls(thread)
			require.NotEmpty(t, calls)
			require.Equal(t, tools.ListPreferences, calls[0].Tool)
			if e.api == "chat" && e.streamed {
				require.Equal(t, others, got.Calls, "the client's other calls")
				if len(others) == 0 {
					require.Equal(t, want.Content+"Done.", got.Content)
					require.Equal(t, "stop", got.Finish)
				} else {
					require.Equal(t, want.Content, got.Content)
					require.Equal(t, "tool_calls", got.Finish)
				}
			}
			if e.api == "responses" && len(others) == 0 {
				require.Contains(t, got.Body, `"Done."`)
			}
			if e.api == "gemini" {
				require.Equal(t, others, got.Calls, "the client's other calls")
				if len(others) == 0 {
					require.Equal(t, want.Content+"Done.", got.Content)
					require.Equal(t, want.Reasoning, got.Reasoning)
				}
			}
			if e.api == "messages" {
				require.Equal(t, others, got.Calls, "the client's other calls")
				require.Equal(t, want.ID, got.ID, "the first round's id")
				if len(others) == 0 {
					require.Equal(t, want.Content+"Done.", got.Content)
					require.Equal(t, "end_turn", got.Finish)
				} else {
					require.Equal(t, "tool_use", got.Finish)
				}
			}
		})
	}
}

// FuzzWire: any combination of the mutations, and members nulled, dropped or added at random,
// over any recording, is read the same straight and through wsproxy (the property is the
// differential equality, not only the absence of a panic).
func FuzzWire(f *testing.F) {
	entries := wireCorpus(f)
	for i := range entries {
		f.Add(uint8(i), uint16(0), int64(i))
		f.Add(uint8(i), uint16(1)<<(i%len(mutations)), int64(i+1))
	}
	h := newWireHarness(f)
	f.Fuzz(func(t *testing.T, pick uint8, mask uint16, seed int64) {
		e := entries[int(pick)%len(entries)]
		bytewise := false
		for i, m := range mutations {
			if mask&(1<<i) == 0 {
				continue
			}
			if b := m.apply(e); b != nil {
				e.body = b
				bytewise = bytewise || m.bytewise
			}
		}
		rng := mathrand.New(mathrand.NewPCG(uint64(seed), uint64(mask)))
		keys := optionalMembers[e.api]
		if b := eachPayload(e, func(o *rawjson.Object, depth int) {
			switch rng.IntN(8) {
			case 0:
				if k := keys[rng.IntN(len(keys))]; o.Index(k) >= 0 {
					o.Set(k, json.RawMessage("null"))
				}
			case 1:
				for i, v := range o.Vals {
					if string(v) == "null" {
						o.Del(o.Keys[i])
						break
					}
				}
			case 2:
				o.Set("x_fuzz_"+strconv.Itoa(depth), json.RawMessage(`[{"k":null}]`))
			}
		}); b != nil {
			e.body = b
		}
		h.compare(t, e, e.body, bytewise)
	})
}

// text is the text of a raw JSON string; "" for anything else.
func text(v json.RawMessage) string {
	s, _ := rawjson.Unquote(v)
	return s
}
