package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
)

// upstreamURL joins the upstream base URL (…/v1) and the part of the path after the client's
// /v1, as the client escaped it.
func upstreamURL(base *url.URL, rest, rawQuery string) *url.URL {
	u := *base
	raw := strings.TrimSuffix(base.EscapedPath(), "/") + "/" + strings.TrimPrefix(rest, "/")
	u.Path, _ = url.PathUnescape(raw) // checked by pathAllowed
	u.RawPath = raw
	u.RawQuery = rawQuery
	return &u
}

// timeoutTransport bounds how long the upstream may stay silent: the wait for the response
// headers, and each wait for body bytes after them, streamed or not. A silence longer than
// Timeout cancels the request and surfaces as apierr.ErrUpstreamTimeout. It also reports every
// exchange to observe (when set) with its status code label and duration. A failure to reach
// the upstream names the request's host (apierr.HostError): each upstream its own.
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
		return nil, &apierr.HostError{Host: req.URL.Host, Err: err}
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
