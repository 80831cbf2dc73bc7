package proxy

import (
	"bytes"
	"compress/gzip"
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

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"

	"github.com/wsproxy/wsproxy/proxy/internal/sse"
)

// Upstream sends one round of a turn to the model server's endpoint of the turn (such as
// …/chat/completions). It is all the loop knows of the model server, so a fake upstream makes
// the loop testable without HTTP.
type Upstream interface {
	// Post posts body. A non-2xx answer is an *apierr.UpstreamError (its body read and kept); failing
	// to reach the upstream wraps apierr.ErrUpstreamUnreachable or apierr.ErrUpstreamTimeout. The caller
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
// headers (less hop-by-hop ones and those the proxy owns) with the configured key, and gives
// back the upstream's as fromUpstream leaves them.
type clientUpstream struct {
	client  *http.Client
	url     string // …/chat/completions
	header  http.Header
	tracing tracing // the round's trace context goes upstream (traceparent)
	back    fromUpstream
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
		return nil, apierr.Transport(ctx, err)
	}
	u.back.header(resp.Header)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		if err != nil {
			return nil, apierr.Transport(ctx, err)
		}
		return nil, &apierr.UpstreamError{StatusCode: resp.StatusCode, Header: responseHeader(resp.Header), Body: u.back.redact(b)}
	}
	return &UpstreamResponse{Header: resp.Header, Body: resp.Body}, nil
}

// readError classifies a failure to read an upstream's response body: a stream that breaks the
// event format is the upstream's protocol error; the rest is a transport failure.
func readError(ctx context.Context, err error) error {
	if errors.Is(err, sse.ErrInvalid) {
		return fmt.Errorf("%w: %w", apierr.ErrUpstreamProtocol, err)
	}
	return apierr.Transport(ctx, err)
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
// X-Real-IP), its cookies (the panel's session among them: the upstream is no party to them),
// and sets the upstream key when there is one. With client keys it also removes every header
// that may carry a client's credential (clientCredential) and those by which a client could
// pick the operator's organization or project.
func (s *Server) stripHeaders(h http.Header) {
	for k := range h {
		if strings.HasPrefix(k, "X-Forwarded-") || (s.opts.ClientKeys != nil && clientCredential(k)) {
			delete(h, k)
		}
	}
	for _, k := range []string{threadHeader, placementHeader, "Forwarded", "X-Real-Ip", "Cookie"} {
		h.Del(k)
	}
	if s.opts.ClientKeys != nil {
		for _, k := range []string{"Openai-Organization", "Openai-Project"} {
			h.Del(k)
		}
	}
	if s.opts.UpstreamAPIKey != "" {
		h.Set("Authorization", "Bearer "+s.opts.UpstreamAPIKey)
	}
}

// credentialWords are the parts of a header name that mark a credential (Authorization,
// X-Api-Key, Api-Key, Ocp-Apim-Subscription-Key, X-Auth-Token, X-Goog-Api-Key, …).
var credentialWords = []string{"auth", "api-key", "apikey", "api_key", "subscription-key", "access-key", "token", "secret", "password", "credential", "cookie"}

// clientCredential reports a request header that may carry a client's credential: none of them
// goes upstream for clients with keys, who are wsproxy's and whose upstream credential is
// UPSTREAM_API_KEY alone.
func clientCredential(name string) bool {
	n := strings.ToLower(name)
	for _, w := range credentialWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// fromUpstream is what the proxy changes in an upstream's response before a client gets it:
// with client keys, the headers that name the operator's account and the upstream's cookies go
// (identity); the operator's key, should an error body quote it, is redacted (key, when
// UPSTREAM_API_KEY is set).
type fromUpstream struct {
	identity bool
	key      string
}

func (s *Server) fromUpstream() fromUpstream {
	return fromUpstream{identity: s.opts.ClientKeys != nil, key: s.opts.UpstreamAPIKey}
}

// identityHeaders name the operator's account, or are the upstream's cookies.
var identityHeaders = []string{"Openai-Organization", "Openai-Project", "Set-Cookie", "Set-Cookie2"}

func (f fromUpstream) header(h http.Header) {
	if f.identity {
		for _, k := range identityHeaders {
			h.Del(k)
		}
	}
}

// redacted stands where an error body quoted the operator's key.
const redacted = "[redacted]"

func (f fromUpstream) redact(body []byte) []byte {
	if f.key == "" || !bytes.Contains(body, []byte(f.key)) {
		return body
	}
	return bytes.ReplaceAll(body, []byte(f.key), []byte(redacted))
}

// passThroughResponse applies f to a pass-through's response (ReverseProxy.ModifyResponse): an
// error body (not 2xx) is read, up to maxErrorBody, for redaction, and sent as it came but for
// the key (decompressed when it came gzipped: rewritePassThrough asks for nothing else).
func (f fromUpstream) passThroughResponse(resp *http.Response) error {
	f.header(resp.Header)
	if f.key == "" || (resp.StatusCode >= 200 && resp.StatusCode <= 299) {
		return nil
	}
	defer resp.Body.Close()
	var body io.Reader = resp.Body
	if strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return fmt.Errorf("read upstream error body: %w", err)
		}
		body = zr
		resp.Header.Del("Content-Encoding")
	}
	b, err := io.ReadAll(io.LimitReader(body, maxErrorBody))
	if err != nil {
		return fmt.Errorf("read upstream error body: %w", err)
	}
	b = f.redact(b)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.TransferEncoding = nil
	return nil
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

// timeoutTransport bounds how long the upstream may stay silent: the wait for the response
// headers, and each wait for body bytes after them, streamed or not. A silence longer than
// Timeout cancels the request and surfaces as apierr.ErrUpstreamTimeout. It also reports every
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
	timer := time.AfterFunc(t.Timeout, func() { cancel(apierr.ErrUpstreamTimeout) })
	resp, err := t.Base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		timer.Stop()
		if context.Cause(ctx) == apierr.ErrUpstreamTimeout {
			err = fmt.Errorf("%w (no response headers within %s)", apierr.ErrUpstreamTimeout, t.Timeout)
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
	if err != nil && context.Cause(b.ctx) == apierr.ErrUpstreamTimeout {
		return n, fmt.Errorf("%w (silent for %s)", apierr.ErrUpstreamTimeout, b.timeout)
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
