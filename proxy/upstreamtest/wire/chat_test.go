package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestAppendString: every string is escaped as encoding/json escapes it.
func TestAppendString(t *testing.T) {
	all := make([]byte, 128)
	for i := range all {
		all[i] = byte(i)
	}
	for _, s := range []string{"", "plain", string(all), `{"city": "Lisbon"}`, "é — ünïcode", "\u2028", "bad \xff utf-8", "<a&b>"} {
		want, _ := json.Marshal(s)
		if got := appendString([]byte("x"), s); string(got) != "x"+string(want) {
			t.Errorf("appendString(%q) = %s, want %s", s, got[1:], want)
		}
	}
}

// keys are the member names of an object and of the objects in it, depth first, as written.
func keys(t *testing.T, data []byte) []string {
	t.Helper()
	var out []string
	dec := json.NewDecoder(bytes.NewReader(data))
	var inObject []bool // per open container: an object whose next string is a key
	expectKey := false
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				inObject = append(inObject, true)
				expectKey = true
				continue
			case '[':
				inObject = append(inObject, false)
			default:
				inObject = inObject[:len(inObject)-1]
			}
		case string:
			if expectKey {
				out = append(out, v)
				expectKey = false
				continue
			}
		}
		expectKey = len(inObject) > 0 && inObject[len(inObject)-1]
	}
	return out
}

// recorded are the data of the events of a recorded OpenAI stream, without the obfuscation
// member the writer leaves out.
func recorded(t *testing.T, name string) [][]byte {
	t.Helper()
	f, err := os.Open("../../testdata/wire/openai/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && d != "[DONE]" {
			var m map[string]json.RawMessage
			if json.Unmarshal([]byte(d), &m) != nil {
				t.Fatalf("%s: %s", name, d)
			}
			i := strings.Index(d, `,"obfuscation":`)
			out = append(out, []byte(d[:i]+"}"))
		}
	}
	return out
}

// TestChatShape: the chunks of a text answer with usage, and of tool calls, have the members of
// OpenAI's recorded ones in their order (proxy/testdata/wire/openai).
func TestChatShape(t *testing.T) {
	h := ChatHead{ID: "chatcmpl-1", Created: 1, Model: "m", ServiceTier: "default", Fingerprint: "fp_1", StreamUsage: true}
	text := recorded(t, "chat-text-usage.sse")
	for i, c := range []struct{ got, want []byte }{
		{h.Chunk(ChatRoleDelta(false), ""), text[0]},
		{h.Chunk(ChatTextDelta("The"), ""), text[1]},
		{h.Chunk([]byte(`{}`), "stop"), text[len(text)-2]},
	} {
		if g, w := strings.Join(keys(t, c.got), ","), strings.Join(keys(t, c.want), ","); g != w {
			t.Errorf("chunk %d: members %s, want %s", i, g, w)
		}
	}
	// The recorded usage chunk has completion_tokens_details and audio tokens, which the
	// writer leaves out; its members before usage's are OpenAI's.
	if g, w := strings.Join(keys(t, h.UsageChunk(ChatUsage{Prompt: 1, Completion: 2, Cached: 0})), ","), "id,object,created,model,service_tier,system_fingerprint,choices,usage,prompt_tokens,completion_tokens,total_tokens,prompt_tokens_details,cached_tokens"; g != w {
		t.Errorf("usage chunk: members %s, want %s", g, w)
	}
	h.ServiceTier, h.StreamUsage = "", false // as the parallel-tools recording
	tools := recorded(t, "chat-parallel-tools.sse")
	strip := func(ks []string) string { // that recording has usage:null before choices
		var out []string
		for _, k := range ks {
			if k != "usage" && k != "service_tier" {
				out = append(out, k)
			}
		}
		return strings.Join(out, ",")
	}
	for i, c := range []struct{ got, want []byte }{
		{h.Chunk(ChatRoleDelta(true), ""), tools[0]},
		{h.Chunk(ChatCallDelta(0, "call_1", "get_weather"), ""), tools[1]},
		{h.Chunk(ChatArgumentsDelta(0, `{"ci`), ""), tools[2]},
	} {
		if g, w := strip(keys(t, c.got)), strip(keys(t, c.want)); g != w {
			t.Errorf("tool chunk %d: members %s, want %s", i, g, w)
		}
	}
	var whole map[string]any
	body := ChatHead{ID: "chatcmpl-1", Created: 1, Model: "m", ServiceTier: "default", Fingerprint: "fp_1"}.
		Completion("", []ChatCall{{ID: "call_1", Name: "f", Arguments: `{"a":"<b>"}`}}, ChatUsage{Prompt: 3, Completion: 4, Cached: -1})
	if err := json.Unmarshal(body, &whole); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if g, w := strings.Join(keys(t, body), ","), "id,object,created,model,choices,index,message,role,content,refusal,annotations,tool_calls,id,type,function,name,arguments,logprobs,finish_reason,usage,prompt_tokens,completion_tokens,total_tokens,service_tier,system_fingerprint"; g != w {
		t.Errorf("completion: members %s, want %s", g, w)
	}
	msg := whole["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
	if msg["content"] != nil || msg["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)["arguments"] != `{"a":"<b>"}` {
		t.Errorf("completion: %s", body)
	}
	if got, want := string(OpenAIError("bad", "invalid_request_error", "", "x")), `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":"x"}}`; got != want {
		t.Errorf("error: %s, want %s", got, want)
	}
}
