package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/sse"
)

// Upstream sends one round of a turn to the model server's endpoint of the turn (such as
// …/chat/completions). It is all the loop knows of the model server, so a fake upstream makes
// the loop testable without HTTP.
type Upstream interface {
	// Post posts body. A non-2xx answer is an *UpstreamError (its body read and kept); failing
	// to reach the upstream wraps ErrUpstreamUnreachable or ErrUpstreamTimeout. The caller
	// closes the response body.
	Post(ctx context.Context, body Payload) (*UpstreamResponse, error)
}

// UpstreamResponse is a 2xx answer of the upstream.
type UpstreamResponse struct {
	Header http.Header
	Body   io.ReadCloser
}

// maxErrorBody caps how much of an upstream's error body is kept.
const maxErrorBody = 1 << 20

// clientUpstream is the HTTP upstream bound to one client request: it forwards the client's
// headers (less hop-by-hop ones and those the proxy owns) with the configured key.
type clientUpstream struct {
	client  *http.Client
	url     string // …/chat/completions
	header  http.Header
	tracing tracing // the round's trace context goes upstream (traceparent)
}

func (u *clientUpstream) Post(ctx context.Context, body Payload) (*UpstreamResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.url, body.Reader())
	if err != nil {
		return nil, fmt.Errorf("build upstream request: %w", err)
	}
	req.ContentLength = int64(body.Len())
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(body.Reader()), nil }
	req.Header = u.header.Clone()
	req.Header.Set("Content-Type", "application/json")
	u.tracing.inject(ctx, req.Header)
	resp, err := u.client.Do(req)
	if err != nil {
		return nil, classifyTransportError(ctx, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if err != nil {
			return nil, classifyTransportError(ctx, err)
		}
		return nil, &UpstreamError{StatusCode: resp.StatusCode, Header: responseHeader(resp.Header), Body: b}
	}
	return &UpstreamResponse{Header: resp.Header, Body: resp.Body}, nil
}

// classifyTransportError wraps a failure to talk to the upstream in ErrUpstreamTimeout or
// ErrUpstreamUnreachable; a cancelled client context stays context.Canceled.
func classifyTransportError(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrUpstreamTimeout) || errors.Is(err, ErrUpstreamUnreachable):
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("upstream: %w", context.Cause(ctx))
	}
	return fmt.Errorf("%w: %w", ErrUpstreamUnreachable, err)
}

// readError classifies a failure to read an upstream's response body: a stream that breaks the
// event format is the upstream's protocol error; the rest is a transport failure.
func readError(ctx context.Context, err error) error {
	if errors.Is(err, sse.ErrInvalid) {
		return fmt.Errorf("%w: %w", ErrUpstreamProtocol, err)
	}
	return classifyTransportError(ctx, err)
}

// upstreamURL joins the upstream base URL (…/v1) and the part of the path after the client's
// /v1, as the client escaped it.
func upstreamURL(base *url.URL, rest, rawQuery string) *url.URL {
	u := *base
	raw := strings.TrimSuffix(base.EscapedPath(), "/") + "/" + strings.TrimPrefix(rest, "/")
	u.Path, _ = url.PathUnescape(raw) // checked by passThroughAllowed
	u.RawPath = raw
	u.RawQuery = rawQuery
	return &u
}

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (the list net/http/httputil strips),
// never forwarded by a proxy.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// outboundHeader is the header of a rewritten upstream request: the client's, less hop-by-hop
// headers, those that described the original body and those stripHeaders removes.
func (s *Server) outboundHeader(in http.Header) http.Header {
	h := in.Clone()
	removeHopHeaders(h)
	for _, k := range []string{"Content-Length", "Accept-Encoding", "Host"} {
		h.Del(k)
	}
	s.stripHeaders(h)
	return h
}

// stripHeaders removes, from a request to the upstream (a thread turn's or a pass-through),
// the proxy's own headers, those that tell of the client's network (Forwarded, X-Forwarded-*,
// X-Real-IP), and sets the upstream key when there is one. With client keys it also removes
// the headers by which a client could pick the operator's organization or project.
func (s *Server) stripHeaders(h http.Header) {
	for k := range h {
		if strings.HasPrefix(k, "X-Forwarded-") {
			delete(h, k)
		}
	}
	for _, k := range []string{threadHeader, placementHeader, "Forwarded", "X-Real-Ip"} {
		h.Del(k)
	}
	if s.opts.ClientKeys != nil {
		for _, k := range []string{"Openai-Organization", "Openai-Project", "Api-Key"} {
			h.Del(k)
		}
	}
	if s.opts.UpstreamAPIKey != "" {
		h.Set("Authorization", "Bearer "+s.opts.UpstreamAPIKey)
	}
}

func removeHopHeaders(h http.Header) {
	// Headers named in Connection are hop-by-hop too (RFC 9110 §7.6.1).
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// responseHeader is what the client gets of an upstream response's header when the proxy writes
// the body itself.
func responseHeader(in http.Header) http.Header {
	h := in.Clone()
	removeHopHeaders(h)
	h.Del("Content-Length")
	h.Del("Content-Encoding")
	return h
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append(dst[k][:0:0], vs...)
	}
}

// timeoutTransport bounds how long the upstream may stay silent: the wait for the response
// headers, and each wait for body bytes after them, streamed or not. A silence longer than
// Timeout cancels the request and surfaces as ErrUpstreamTimeout. It also reports every
// exchange to observe (when set) with its status code label and duration.
type timeoutTransport struct {
	Base    http.RoundTripper
	Timeout time.Duration
	// Observe, when set, is called once per exchange with the request's context, the status
	// ("error" when no response came) and the time from sending to the end of the body.
	Observe func(ctx context.Context, code string, d time.Duration)
}

func (t *timeoutTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	ctx, cancel := context.WithCancelCause(req.Context())
	timer := time.AfterFunc(t.Timeout, func() { cancel(ErrUpstreamTimeout) })
	resp, err := t.Base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		if context.Cause(ctx) == ErrUpstreamTimeout {
			err = fmt.Errorf("%w (no response headers within %s)", ErrUpstreamTimeout, t.Timeout)
		}
		cancel(nil)
		t.observe(req.Context(), "error", start)
		return nil, err
	}
	timer.Reset(t.Timeout)
	resp.Body = &idleBody{ReadCloser: resp.Body, ctx: ctx, timer: timer, timeout: t.Timeout, done: func() {
		cancel(nil)
		t.observe(req.Context(), strconv.Itoa(resp.StatusCode), start)
	}}
	return resp, nil
}

func (t *timeoutTransport) observe(ctx context.Context, code string, start time.Time) {
	if t.Observe != nil {
		t.Observe(ctx, code, time.Since(start))
	}
}

// idleBody restarts the silence timer on every read.
type idleBody struct {
	io.ReadCloser
	ctx     context.Context
	timer   *time.Timer
	timeout time.Duration
	once    sync.Once
	done    func()
}

func (b *idleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && context.Cause(b.ctx) == ErrUpstreamTimeout {
		return n, fmt.Errorf("%w (silent for %s)", ErrUpstreamTimeout, b.timeout)
	}
	if n > 0 {
		b.timer.Reset(b.timeout)
	}
	return n, err
}

func (b *idleBody) Close() error {
	b.timer.Stop()
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}
