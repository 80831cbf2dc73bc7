package proxy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genai"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// The Gemini API's part of the differential harness (differential_test.go): its recordings
// (gemini-*) are read by Google's Go SDK, google.golang.org/genai, straight and through a thread
// turn.

// readGemini sends e's Gemini request to base (the upstream's root, or the proxy's with thread)
// and reads the answer as the SDK does: one GenerateContentResponse, or each of a stream's.
func readGemini(t testing.TB, h *wireHarness, e wireEntry, id, base, thread string) readout {
	t.Helper()
	header := http.Header{"X-Wire-Case": {id}}
	if thread != "" {
		header.Set("X-Thread-Id", thread)
	}
	client, err := genai.NewClient(context.Background(), &genai.ClientConfig{APIKey: "AIza-wire", Backend: genai.BackendGeminiAPI,
		HTTPClient: h.client, HTTPOptions: genai.HTTPOptions{BaseURL: base, Headers: header}})
	require.NoError(t, err)
	var config *genai.GenerateContentConfig
	if names := clientToolNames(e.body); len(names) > 0 {
		tool := &genai.Tool{}
		for _, n := range names {
			tool.FunctionDeclarations = append(tool.FunctionDeclarations, &genai.FunctionDeclaration{Name: n,
				Parameters: &genai.Schema{Type: genai.TypeObject}})
		}
		config = &genai.GenerateContentConfig{Tools: []*genai.Tool{tool}}
	}
	ctx := context.Background()
	var r readout
	add := func(resp *genai.GenerateContentResponse) {
		resp.SDKHTTPResponse = nil
		b, err := json.Marshal(resp)
		require.NoError(t, err)
		r.Events = append(r.Events, canonical(t, string(b)))
		if resp.ResponseID != "" {
			r.ID = resp.ResponseID
		}
		if resp.ModelVersion != "" {
			r.Model = resp.ModelVersion
		}
		if resp.UsageMetadata != nil {
			u, _ := json.Marshal(resp.UsageMetadata)
			r.Usage = []string{canonical(t, string(u))}
		}
		if len(resp.Candidates) == 0 {
			return
		}
		c := resp.Candidates[0]
		if c.FinishReason != "" {
			r.Finish = string(c.FinishReason)
		}
		if c.Content == nil {
			return
		}
		for _, p := range c.Content.Parts {
			switch {
			case p.FunctionCall != nil:
				args, _ := json.Marshal(p.FunctionCall.Args)
				r.Calls = append(r.Calls, cmp.Or(p.FunctionCall.ID, "-")+" "+p.FunctionCall.Name+" "+string(args))
			case p.Thought:
				r.Reasoning += p.Text
			default:
				r.Content += p.Text
			}
		}
	}
	if !e.streamed {
		resp, err := client.Models.GenerateContent(ctx, "wire-model", genai.Text("hi"), config)
		r.Err = geminiErrText(err)
		if err == nil {
			add(resp)
			r.Body, r.Events = r.Events[0], nil
		}
		return r
	}
	for resp, err := range client.Models.GenerateContentStream(ctx, "wire-model", genai.Text("hi"), config) {
		if err != nil {
			r.Err = geminiErrText(err)
			break
		}
		add(resp)
	}
	return r
}

// geminiErrText is what the SDK's client sees of an error: its code, status and message, or
// the error's text.
func geminiErrText(err error) string {
	if err == nil {
		return ""
	}
	var apiErr genai.APIError
	if errors.As(err, &apiErr) {
		return strconv.Itoa(apiErr.Code) + " " + apiErr.Status + " " + apiErr.Message
	}
	return err.Error()
}

// geminiCallNames are the names of a decoded payload's functionCall parts' calls (for
// clientToolNames).
func geminiCallName(x map[string]any) string {
	fc, ok := x["functionCall"].(map[string]any)
	if !ok {
		return ""
	}
	name, _ := fc["name"].(string)
	return name
}

// renameGeminiCall renames a functionCall part's call from renamed to name (for
// workspaceVariant).
func renameGeminiCall(o *rawjson.Object, renamed, name string) {
	fc, err := rawjson.Parse(o.Get("functionCall"))
	if err == nil && text(fc.Get("name")) == renamed {
		fc.Set("name", rawjson.String(name))
		o.Set("functionCall", fc.Bytes())
	}
}

// unknownGeminiParts adds what a newer server sends: a part of a kind nobody knows yet (last of
// the first candidate's parts; streamed, in the first chunk) and, streamed, a chunk of a member
// nobody knows.
func unknownGeminiParts(e wireEntry) []byte {
	future := json.RawMessage(`{"xFuturePart":{"payload":{"k":[1]}}}`)
	withPart := func(data []byte) []byte {
		o, err := rawjson.Parse(data)
		if err != nil {
			return data
		}
		cands, err := rawjson.Split(o.Get("candidates"))
		if err != nil || len(cands) == 0 {
			return data
		}
		c, _ := rawjson.Parse(cands[0])
		content, err := rawjson.Parse(c.Get("content"))
		if err != nil {
			return data
		}
		parts, _ := rawjson.Split(content.Get("parts"))
		content.Set("parts", rawjson.AppendArray(nil, append(parts, future)))
		c.Set("content", content.Bytes())
		cands[0] = c.Bytes()
		o.Set("candidates", rawjson.AppendArray(nil, cands))
		return o.Bytes()
	}
	if !e.streamed {
		return withPart(e.body)
	}
	events := splitEvents(e.body)
	out := []sseEventLines{{`data: {"xWsproxyFuture":{"k":1},"modelVersion":"x"}`}}
	for i, ev := range events {
		if i == 0 {
			ev = sseEventLines{"data: " + string(withPart(ev.data()))}
		}
		out = append(out, ev)
	}
	return joinEvents(out)
}

// geminiTextRound is a Gemini round that answers "Done.".
func geminiTextRound(e wireEntry) wireReply {
	done := upstreamtest.GeminiReply{ID: "done", Parts: []upstreamtest.GeminiPart{upstreamtest.GeminiText("Done.")}}
	if e.streamed {
		return wireReply{streamed: true, body: []byte(strings.Join(done.Events(), ""))}
	}
	return wireReply{body: []byte(done.JSON())}
}
