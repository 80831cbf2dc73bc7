package turn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
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

// readError classifies a failure to read an upstream's response body: a stream that breaks the
// event format is the upstream's protocol error; the rest is a transport failure.
func readError(ctx context.Context, err error) error {
	if errors.Is(err, sse.ErrInvalid) {
		return fmt.Errorf("%w: %w", apierr.ErrUpstreamProtocol, err)
	}
	return apierr.Transport(ctx, err)
}

// maxResponseBody caps a non-streamed upstream response.
const maxResponseBody = 64 << 20

// postJSON sends a round's body upstream and reads its non-streamed answer, up to
// maxResponseBody.
func postJSON(ctx context.Context, up Upstream, body Payload) ([]byte, http.Header, error) {
	resp, err := up.Post(ctx, body)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return nil, nil, apierr.Transport(ctx, err)
	}
	if len(raw) > maxResponseBody {
		return nil, nil, fmt.Errorf("%w: response over %d bytes", apierr.ErrUpstreamProtocol, maxResponseBody)
	}
	return raw, resp.Header, nil
}

// readEvents posts body upstream and hands the data of each event of the answer's stream to
// handle, until handle says stop, the stream ends, or [DONE] comes (done). It calls flush before
// every wait for the network, so that what the client has goes out as soon as the proxy would
// wait (events that arrived together leave together). A stream that ends as it should (stop or
// [DONE]) is read on to its body's end (finishBody), so that its connection serves the next
// round or turn.
func readEvents(ctx context.Context, up Upstream, body Payload, flush func() error, handle func(data []byte) (stop bool, err error)) (done bool, err error) {
	return readNamedEvents(ctx, up, body, flush, func(_ string, data []byte) (bool, error) { return handle(data) })
}

// readNamedEvents is readEvents whose handle also gets each event's name ("" for none).
func readNamedEvents(ctx context.Context, up Upstream, body Payload, flush func() error, handle func(name string, data []byte) (stop bool, err error)) (done bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := up.Post(ctx, body)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	events := sse.NewReader(resp.Body)
	for {
		if !events.EventBuffered() {
			if err := flush(); err != nil {
				return false, err
			}
		}
		data, err := events.Next()
		switch {
		case err == io.EOF:
			return false, nil
		case err != nil:
			return false, readError(ctx, err)
		case bytes.HasPrefix(data, []byte("[DONE]")):
			finishBody(resp.Body, cancel)
			return true, nil
		}
		stop, err := handle(events.Name(), data)
		if err != nil {
			return false, err
		}
		if stop {
			finishBody(resp.Body, cancel)
			return false, nil
		}
	}
}

// What finishBody waits for after a stream's last event.
const (
	afterLastEventBytes   = 4 << 10
	afterLastEventTimeout = 250 * time.Millisecond
)

// finishBody reads what follows a stream's last event up to the body's end — over HTTP/1.1 the
// last chunk of the chunked encoding, which a server writes as its handler returns — at most
// afterLastEventBytes within afterLastEventTimeout (past either, cancel ends the request). Go's
// transport keeps a connection for the next request only when its response body was read to
// the end; one closed before it is closed too, and the next round or turn would open a new one
// (a TCP and, to a hosted model, a TLS handshake).
func finishBody(body io.Reader, cancel context.CancelFunc) {
	timer := time.AfterFunc(afterLastEventTimeout, cancel)
	_, _ = io.Copy(io.Discard, io.LimitReader(body, afterLastEventBytes))
	timer.Stop()
}
