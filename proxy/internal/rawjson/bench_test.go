package rawjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/go-json-experiment/json/jsontext"
)

// chatRequest is a chat completion request of about size bytes.
func chatRequest(size int) []byte {
	var msgs []string
	msgs = append(msgs, `{"role":"system","content":"You are a careful assistant."}`)
	line := "Tell me more about soil carbon and how it is measured in the field. \"Quoted\" and é."
	for total := 200; total < size; total += len(line) + 32 {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, line))
	}
	return []byte(`{"model":"gpt-4o","temperature":0.2,"messages":[` + strings.Join(msgs, ",") + `],"top_k":4}`)
}

// chunk is one streamed content chunk.
var chunk = []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)

// BenchmarkValid compares the package's scanner with jsontext (go-json-experiment/json, the
// future encoding/json/v2) and encoding/json on the inputs the proxy checks: a chunk and whole
// requests.
func BenchmarkValid(b *testing.B) {
	inputs := []struct {
		name string
		data []byte
	}{{"chunk", chunk}, {"1KB", chatRequest(1 << 10)}, {"100KB", chatRequest(100 << 10)}}
	for _, in := range inputs {
		if !Valid(in.data) || !jsontext.Value(in.data).IsValid() {
			b.Fatalf("%s is not valid", in.name)
		}
		b.Run(in.name+"/rawjson", func(b *testing.B) {
			b.SetBytes(int64(len(in.data)))
			b.ReportAllocs()
			for b.Loop() {
				Valid(in.data)
			}
		})
		b.Run(in.name+"/jsontext", func(b *testing.B) {
			b.SetBytes(int64(len(in.data)))
			b.ReportAllocs()
			for b.Loop() {
				jsontext.Value(in.data).IsValid()
			}
		})
		b.Run(in.name+"/encoding_json", func(b *testing.B) {
			b.SetBytes(int64(len(in.data)))
			b.ReportAllocs()
			for b.Loop() {
				json.Valid(in.data)
			}
		})
	}
}

// BenchmarkMembers compares splitting an object into its members, checked, with the package
// and with a jsontext.Decoder reading top-level tokens and raw values.
func BenchmarkMembers(b *testing.B) {
	inputs := []struct {
		name string
		data []byte
	}{{"chunk", chunk}, {"1KB", chatRequest(1 << 10)}, {"100KB", chatRequest(100 << 10)}}
	for _, in := range inputs {
		b.Run(in.name+"/rawjson", func(b *testing.B) {
			b.SetBytes(int64(len(in.data)))
			b.ReportAllocs()
			var o Object
			for b.Loop() {
				var err error
				if o, err = ParseInto(o, in.data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(in.name+"/jsontext", func(b *testing.B) {
			b.SetBytes(int64(len(in.data)))
			b.ReportAllocs()
			dec := jsontext.NewDecoder(bytes.NewReader(nil))
			var o Object
			for b.Loop() {
				dec.Reset(bytes.NewReader(in.data))
				o.Keys, o.Vals = o.Keys[:0], o.Vals[:0]
				if _, err := dec.ReadToken(); err != nil {
					b.Fatal(err)
				}
				for dec.PeekKind() != '}' {
					k, err := dec.ReadToken()
					if err != nil {
						b.Fatal(err)
					}
					o.Keys = append(o.Keys, k.String())
					v, err := dec.ReadValue()
					if err != nil {
						b.Fatal(err)
					}
					o.Vals = append(o.Vals, json.RawMessage(v))
				}
			}
		})
	}
}

// BenchmarkParseWide: an object of 10,000 and 100,000 members (a hostile body's top level): the
// cost is linear in the members, so that a body of MAX_REQUEST_BYTES parses in milliseconds.
func BenchmarkParseWide(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		var sb strings.Builder
		sb.WriteString("{")
		for i := range n {
			if i > 0 {
				sb.WriteString(",")
			}
			fmt.Fprintf(&sb, `"k%d":%d`, i, i)
		}
		sb.WriteString(`,"k0":"last"}`)
		body := []byte(sb.String())
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				o, err := Parse(body)
				if err != nil || len(o.Keys) != n || string(o.Get("k0")) != `"last"` {
					b.Fatal(err, len(o.Keys))
				}
			}
		})
	}
}
