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
