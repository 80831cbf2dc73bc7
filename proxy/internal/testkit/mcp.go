package testkit

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// The protocol versions the Go SDK's client speaks to /mcp: the SDK's latest (sessionless,
// server/discover, subscriptions/listen) and the last one with an initialize handshake, which
// the TypeScript SDK and Claude Code speak.
const (
	MCPLatest = "2026-07-28"
	MCPLegacy = "2025-11-25"
)

// bearer sends every request with Authorization: Bearer token.
type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// MCPDial connects the Go SDK's client to base's /mcp with token, speaking protocol.
func MCPDial(base, token, protocol string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "wsproxy-test", Version: "1"}, opts)
	transport := &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: bearer(token)},
		MaxRetries: -1, DisableStandaloneSSE: true}
	return client.Connect(context.Background(), transport, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
}

// MCPConnect is MCPDial in the test: the session is closed when the test ends.
func MCPConnect(t testing.TB, base, token, protocol string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := MCPDial(base, token, protocol, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// MCPCall calls a tool and returns its result's text and whether it is a tool error.
func MCPCall(t testing.TB, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err, name)
	require.Len(t, res.Content, 1, name)
	text, ok := res.Content[0].(*mcp.TextContent)
	require.True(t, ok, "%s: %T", name, res.Content[0])
	return text.Text, res.IsError
}

// MCPPost sends a raw initialize request to /mcp with the Authorization header auth ("" none),
// from the address from (X-Forwarded-For, believed from a trusted proxy; "" for none).
func MCPPost(t *testing.T, base, auth, from string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if from != "" {
		req.Header.Set("X-Forwarded-For", from)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// MCPListen opens a raw subscriptions/listen stream (MCP 2026-07-28) of thread's workspace
// resource at base with token, and returns once the server acknowledged it (its first message,
// sent once the stream holds the subscription): the lines after, as they come, closed when the
// stream ends. The stream is closed when the test ends.
func MCPListen(t *testing.T, base, token, thread string) <-chan string {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"subscriptions/listen","params":{`+
		`"notifications":{"resourceSubscriptions":["workspace://`+thread+`"]},`+
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`))
	require.NoError(t, err)
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": MCPLatest, "Mcp-Method": "subscriptions/listen", "Authorization": "Bearer " + token} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, 200, resp.StatusCode)
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		rd := bufio.NewReader(resp.Body)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			lines <- line
		}
	}()
	timeout := time.After(time.Minute) // at once; a minute on a busy machine
	for {
		select {
		case line, ok := <-lines:
			require.True(t, ok, "the listen stream ended unacknowledged")
			if strings.Contains(line, "notifications/subscriptions/acknowledged") {
				return lines
			}
		case <-timeout:
			t.Fatal("the listen stream was not acknowledged")
		}
	}
}
