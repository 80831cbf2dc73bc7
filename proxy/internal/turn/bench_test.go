package turn

import (
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/wsproxy/wsproxy/proxy/internal/sse"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
	"github.com/wsproxy/wsproxy/workspace"
)

func BenchmarkRewrite(b *testing.B) {
	block := workspace.TailInstructions + "\n\n" + workspace.RenderBlock("Write a review", []workspace.Preference{{Title: "Formal", Kind: "hard"}, {Title: "Short", Kind: "soft"}}, nil)
	for _, size := range []int{1 << 10, 100 << 10} {
		body := upstreamtest.ChatBody(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.Logf("request body: %d bytes", len(body))
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req, err := ParseChatRequest(body)
				if err != nil {
					b.Fatal(err)
				}
				req.InjectWorkspace(block, PlaceTail)
				_ = req.Body(true)
			}
		})
	}
}

// BenchmarkSSEDecode: one upstream content chunk read, decoded and re-encoded for the client.
func BenchmarkSSEDecode(b *testing.B) {
	chunk := "data: " + upstreamtest.Chunk("chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", `{"content":" the"}`, "") + "\n\n"
	req, _ := ParseChatRequest([]byte(`{"messages":[]}`))
	stream := strings.NewReader(strings.Repeat(chunk, 1024))
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	var out []byte
	s := newChatSSE(req, nil, nil, "", 1<<20, emitFunc(func(c []byte) error { out = sse.AppendEvent(out[:0], c); return nil }))
	r := sse.NewReader(stream)
	for b.Loop() {
		data, err := r.Next()
		if err == io.EOF {
			stream.Reset(strings.Repeat(chunk, 1024))
			r = sse.NewReader(stream)
			s.cur = newChatRound(1 << 20)
			continue
		}
		if err := s.chunk(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSSEEncode: one chunk written as an event.
func BenchmarkSSEEncode(b *testing.B) {
	chunk := []byte(upstreamtest.Chunk("chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", `{"content":" the"}`, ""))
	b.ReportAllocs()
	var out []byte
	for b.Loop() {
		out = sse.AppendEvent(out[:0], chunk)
	}
}

// BenchmarkHostileBodies: the rewrite of 8 MiB bodies of the hostile shapes (a security probe's),
// as a thread turn does it: parse, inject, the upstream body. B/op over the body's size is the
// memory a shape costs; a refused shape costs its parse.
func BenchmarkHostileBodies(b *testing.B) {
	block := workspace.TailInstructions + "\n\n" + workspace.RenderBlock("", nil, nil)
	for _, hb := range upstreamtest.HostileBodies(8 << 20) {
		b.Run(hb.Name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(hb.Body)))
			var allocated uint64
			for b.Loop() {
				req, err := ParseChatRequest(hb.Body)
				if err != nil {
					continue // refused: a 400 naming the index
				}
				req.InjectWorkspace(block, PlaceTail)
				allocated += uint64(req.Body(true).Len())
				_ = req.IsClientTool("get_weather")
			}
		})
	}
}

// taintedConversation is a chat conversation of 20 rounds of a client's tool: the user's ask, then
// each round the model's call and the tool's result of about 2 KB (docs/spec.md §19's tainted
// turn, as a coding agent sends it).
func taintedConversation() []byte {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"system","content":"You are a coding agent."},{"role":"user","content":"Tidy the repository, please."}`)
	result := strings.Repeat("package main // a line of a file the agent read\n", 40)
	for i := range 20 {
		fmt.Fprintf(&b, `,{"role":"assistant","content":null,"tool_calls":[{"id":"call_%d","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"f%d.go\"}"}}]}`, i, i)
		fmt.Fprintf(&b, `,{"role":"tool","tool_call_id":"call_%d","content":%q}`, i, result)
	}
	b.WriteString(`,{"role":"user","content":"Now use tabs everywhere."}],"tools":[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]}`)
	return []byte(b.String())
}

// BenchmarkReading: a thread turn's rewrite of a tainted conversation of 20 tool results, without
// and with what every thread turn now asks before its start (Request.Tainted: read up to the first
// untrusted part), and with the whole classification a turn's first write asks (Request.Reading,
// once a turn): run in one go, their ratios are the classification's cost.
func BenchmarkReading(b *testing.B) {
	block := workspace.TailInstructions + "\n\n" + workspace.RenderBlock("Tidy the repository", []workspace.Preference{{Title: "Tabs", Kind: "hard"}}, nil)
	body := taintedConversation()
	for _, classify := range []string{"none", "tainted", "reading"} {
		b.Run("classify="+classify, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				req, err := ParseChatRequest(body)
				if err != nil {
					b.Fatal(err)
				}
				switch classify {
				case "tainted":
					if tainted, _ := req.Tainted(); !tainted {
						b.Fatal("not tainted")
					}
				case "reading":
					if !req.Reading().Tainted {
						b.Fatal("not tainted")
					}
				}
				req.InjectWorkspace(block, PlaceTail)
				_ = req.Body(true)
			}
		})
	}
}
