package turn

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/tools"
)

// decodeNumbers decodes JSON keeping numbers as written.
func decodeNumbers(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

// FuzzRewrite: whatever the body, the rewrite either refuses it with a 400 or produces valid
// JSON in which every field the proxy does not own is unchanged.
func FuzzRewrite(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"top_k":4}`))
	f.Add([]byte(`{"messages":[{"role":"developer","content":[{"type":"text","text":"a"}]}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto"}`))
	f.Add([]byte(`{"messages":[],"n":1,"stream":true,"stream_options":{"include_usage":true},"x":{"y":[1,2,{"z":null}]}}`))
	f.Add([]byte(`{"messages":[{"role":"system","content":null}],"\u006dodel":"\ud83d\ude00","a":"\u0000"}`))
	f.Add([]byte(`{"messages":[{"role":"system","content":"bad \xff utf8"}],"k":1e400}`))
	f.Add([]byte(`{"messages":[1,"x",null,[]],"tools":[null,1,{"function":{"name":7}}]}`))
	f.Add([]byte(`{"a":1,"a":2,"messages":[]}`))
	f.Add([]byte(` [ ] `))
	f.Fuzz(func(t *testing.T, body []byte) {
		placement := PlaceTail
		if len(body)%2 == 0 {
			placement = PlaceSystem
		}
		req, err := ParseChatRequest(body)
		if err != nil {
			var e *apierr.Error
			if !asError(err, &e) || e.Status != 400 {
				t.Fatalf("refusal is not a 400: %v", err)
			}
			return
		}
		if req.Legacy {
			return
		}
		req.InjectWorkspace("INSTR\n\n<workspace>\nObjective: (none yet)\nPreferences: (none yet)\n</workspace>", placement)
		for _, with := range []bool{true, false} {
			out := req.Body(with).joined()
			if !json.Valid(out) {
				t.Fatalf("rewritten body is not JSON: %q", out)
			}
			orig, err1 := rawjson.Parse(body)
			got, err2 := rawjson.Parse(out)
			if err1 != nil || err2 != nil {
				t.Fatalf("parse: %v %v", err1, err2)
			}
			for i, k := range orig.Keys {
				switch k {
				case "messages", "tools", "tool_choice", "parallel_tool_calls":
					continue
				}
				a, _ := decodeNumbers(orig.Vals[i])
				b, _ := decodeNumbers(got.Get(k))
				if !reflect.DeepEqual(a, b) {
					t.Fatalf("field %s changed: %s -> %s", k, orig.Vals[i], got.Get(k))
				}
			}
			var msgs []json.RawMessage
			if err := json.Unmarshal(got.Get("messages"), &msgs); err != nil || len(msgs) < req.n || len(msgs) > req.n+1 {
				t.Fatalf("messages: %v: %d, the client sent %d", err, len(msgs), req.n)
			}
		}
	})
}

func asError(err error, target **apierr.Error) bool {
	e, ok := err.(*apierr.Error)
	*target = e
	return ok
}

// FuzzSSE: any upstream stream is read to its end without a panic, and whatever chunk it holds
// either is refused or becomes valid JSON for the client.
func FuzzSSE(f *testing.F) {
	f.Add("data: " + upstreamtest.Chunk("c", `{"role":"assistant","content":"hi"}`, "") + "\n\ndata: [DONE]\n\n")
	f.Add("data: " + upstreamtest.Chunk("c", `{"tool_calls":[{"index":0,"id":"x","function":{"name":"get_weather","arguments":"{"}}]}`, "") + "\n\n")
	f.Add("data: " + upstreamtest.Chunk("c", `{"tool_calls":[{"function":{"name":"set_objective","arguments":"{}"}}]}`, "tool_calls") + "\n\n")
	f.Add(": comment\r\ndata: {\"choices\":[]}\r\n\r\ndata:{\"error\":{}}\n\n")
	f.Add("data: a\ndata: b\n\nevent: x\n\ndata: {\"choices\":null,\"usage\":{\"prompt_tokens\":1}}")
	f.Fuzz(func(t *testing.T, stream string) {
		req, _ := ParseChatRequest([]byte(`{"messages":[],"tools":[{"type":"function","function":{"name":"get_weather"}}]}`))
		upstream := map[string]bool{} // what the upstream sent: what is not JSON goes on as it came
		s := newChatSSE(req, nil, nil, "", 1<<20, emitFunc(func(c []byte) error {
			if !json.Valid(c) && !upstream[string(c)] {
				t.Fatalf("emitted chunk is not JSON: %q", c)
			}
			return nil
		}))
		r := sse.NewReader(strings.NewReader(stream))
		for range 10000 {
			data, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return
			}
			if string(data) == "[DONE]" {
				break
			}
			upstream[string(data)] = true
			if err := s.chunk(data); err != nil {
				return
			}
		}
		_ = s.finish(nil, &usageSum{}, 1)
	})
}

// FuzzResponsesSSE: any upstream Responses stream is read to its end without a panic, every
// event the client gets is valid JSON, and no event of a workspace call reaches it.
func FuzzResponsesSSE(f *testing.F) {
	spec := upstreamtest.ResponseSpec{ID: "r", Items: []upstreamtest.Item{upstreamtest.Reasoning("rs", "hm"), upstreamtest.Message("m", "hi"),
		upstreamtest.FunctionCall("f1", "c1", "add_preferences", `{"items":[]}`), upstreamtest.FunctionCall("f2", "c2", "get_weather", `{}`)}}
	f.Add(strings.Join(spec.Events(), ""))
	f.Add(strings.Join(upstreamtest.ResponseSpec{ID: "r", Flavor: upstreamtest.VLLM, Items: spec.Items[:2]}.Events(), ""))
	f.Add("data: {\"type\":\"response.output_text.delta\",\"output_index\":\"x\"}\n\ndata: {\"type\":\"error\"}\n\n")
	f.Add("data: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"type\":\"function_call\",\"name\":\"set_objective\"}]}}\n\n")
	f.Fuzz(func(t *testing.T, stream string) {
		req, _ := ParseResponsesRequest([]byte(`{"input":"x","tools":[{"type":"function","name":"get_weather"}]}`))
		s := newResponsesSSE(req, nil, emitFunc(func(ev []byte) error {
			if !json.Valid(ev) {
				t.Fatalf("emitted event is not JSON: %q", ev)
			}
			var e struct {
				Item *struct{ Type, Name string }
			}
			if json.Unmarshal(ev, &e) == nil && e.Item != nil && e.Item.Type == "function_call" && tools.IsTool(e.Item.Name) {
				t.Fatalf("a workspace call reached the client: %s", ev)
			}
			return nil
		}))
		s.newRound()
		r := sse.NewReader(strings.NewReader(stream))
		for range 10000 {
			data, err := r.Next()
			if err != nil || s.last != nil {
				break
			}
			if err := s.event(data); err != nil {
				if _, failure := s.Failure(err); !json.Valid(failure) {
					t.Fatalf("the failure event is not JSON: %q", failure)
				}
				return
			}
		}
		if s.last != nil {
			_ = s.finish(nil, &usageSum{}, 1)
		}
	})
}
