package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
)

// fakeUpstream answers chat completions as fast as it can, from pre-encoded bytes.
type fakeUpstream struct {
	toolRound bool
	answer    []byte
	toolCall  []byte
	stream    []byte
	big       []byte // a long stream, for memory measurements
}

func newFakeUpstream(toolRound bool, chunks int) *fakeUpstream {
	f := &fakeUpstream{toolRound: toolRound}
	f.answer = []byte(`{"id":"chatcmpl-load","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"Here is a short answer about soil carbon."},"finish_reason":"stop"}],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}`)
	f.toolCall = []byte(`{"id":"chatcmpl-load","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"update_preferences","arguments":"{\"updates\":[{\"index\":1,\"subtitle\":\"measured\"}],\"action_and_reasoning\":\"load\"}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}`)
	f.stream = streamOf(chunks, " word")
	f.big = streamOf(10<<20/120, strings.Repeat("x", 64)) // about 10 MB of events
	return f
}

func streamOf(chunks int, piece string) []byte {
	var b bytes.Buffer
	p, _ := json.Marshal(piece)
	fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-load\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n")
	for range chunks {
		fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-load\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%s},\"finish_reason\":null}]}\n\n", p)
	}
	fmt.Fprintf(&b, "data: {\"id\":\"chatcmpl-load\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"bench\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	return b.Bytes()
}

func (f *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream   bool `json:"stream"`
		Big      bool `json:"big_stream"`
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		body := f.stream
		if req.Big {
			body = f.big
		}
		rc := http.NewResponseController(w)
		// Write event by event in a few large writes, as a fast server would.
		for len(body) > 0 {
			n := min(len(body), 4096)
			_, _ = w.Write(body[:n])
			_ = rc.Flush()
			body = body[n:]
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	last := ""
	if n := len(req.Messages); n > 0 {
		last = req.Messages[n-1].Role
	}
	if f.toolRound && last != "tool" {
		_, _ = w.Write(f.toolCall)
		return
	}
	_, _ = w.Write(f.answer)
}

func listenAndServe(addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	return http.Serve(ln, h)
}

func upstreamCmd(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	toolRound := fs.Bool("tool-round", false, "answer a turn's first call with a workspace tool call")
	chunks := fs.Int("chunks", 20, "content chunks of a streamed answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return listenAndServe(*addr, newFakeUpstream(*toolRound, *chunks))
}

// bareProxy is the baseline: httputil.ReverseProxy with nothing added.
func bareProxy(target *url.URL) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		FlushInterval: -1,
		Transport:     &http.Transport{MaxIdleConnsPerHost: 256},
	}
}

func bareProxyCmd(args []string) error {
	fs := flag.NewFlagSet("bareproxy", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	target := fs.String("target", "", "upstream base URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("-target: %q is not a URL", *target)
	}
	return serveCounted(*addr, bareProxy(u))
}
