package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/turn"
	"github.com/wsproxy/wsproxy/workspace"
)

// maxErrorBody caps how much of an upstream's error body is kept.
const maxErrorBody = 1 << 20

// clientUpstream is the HTTP upstream bound to one client request: it forwards the client's
// headers (less hop-by-hop ones and those the proxy owns) with the configured key, and gives
// back the upstream's as fromUpstream leaves them.
type clientUpstream struct {
	// transport takes the round's request as it is, with no http.Client around it: no redirect
	// is followed (an upstream's 3xx is its answer, as for a pass-through), and nothing is
	// copied for one.
	transport http.RoundTripper
	url       string // …/chat/completions, …/responses, …/v1/messages(/count_tokens), …
	header    http.Header
	tracing   tracing // the round's trace context goes upstream (traceparent)
	back      fromUpstream
	// provider is the upstream's gen_ai.provider.name (Turn.Provider).
	provider string
	// keyless names the setting of the operator's key when its requests go with no credential
	// (client keys are set, the operator's key is not): the upstream's 401 is then the
	// operator's to fix, a 502 naming it.
	keyless string
}

func (u *clientUpstream) Post(ctx context.Context, body turn.Payload) (*turn.UpstreamResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.url, body.Reader())
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	req.ContentLength = int64(body.Len())
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.Reader()), nil }
	req.Header = u.header // read, never written, by the transport: every round may share it
	if u.tracing.on {
		req.Header = u.header.Clone() // a round's own span: a traceparent of its own
		u.tracing.inject(ctx, req.Header)
	}
	resp, err := u.transport.RoundTrip(req)
	if err != nil {
		return nil, apierr.Transport(ctx, err)
	}
	u.back.header(resp.Header)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if err != nil {
			return nil, apierr.Transport(ctx, err)
		}
		b = u.back.redact(b)
		if resp.StatusCode == http.StatusUnauthorized && u.keyless != "" {
			return nil, &apierr.Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_key_missing",
				Message: "the upstream refused a request that carried no key (401): clients' keys stay with wsproxy; set " + u.keyless,
				Err:     errors.New(workspace.Truncate(string(b), 200))}
		}
		return nil, &apierr.UpstreamError{StatusCode: resp.StatusCode, Header: responseHeader(resp.Header), Body: b}
	}
	return &turn.UpstreamResponse{Header: resp.Header, Body: u.back.body(resp.Body)}, nil
}
