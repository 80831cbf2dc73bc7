// Package apierr is the proxy's errors and their funnel: the Error the proxy answers with in its
// API's shape, the upstream's own errors (an error answer, an error event of a stream, a failure
// to reach it), and Write, the one place that decides a failure's status and logs it.
package apierr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// StatusClientClosedRequest is nginx's status for a request whose client went away before the
// answer: it is never sent, only logged and counted.
const StatusClientClosedRequest = 499

// Error is an error the proxy itself answers with, in OpenAI's shape
// ({"error":{"message","type","param","code"}}), or in its wire API's own (Shape).
type Error struct {
	Status  int
	Type    string // invalid_request_error, server_error, …
	Code    string
	Param   string
	Message string
	Header  http.Header // added to the response (Retry-After, …)
	Err     error       // the cause, logged; never shown to the client
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Message + ": " + e.Err.Error()
	}
	return e.Message
}

func (e *Error) Unwrap() error { return e.Err }

// Log logs a failure that is the proxy's or a dependency's (5xx): a bug (500) at Error, a
// dependency that failed (the upstream, Postgres) or a proxy at its limits at Warn. A client's
// mistakes are not logged.
func (e *Error) Log(ctx context.Context, log *slog.Logger, msg string, attrs ...slog.Attr) {
	if e.Status < 500 {
		return
	}
	level := slog.LevelWarn
	if e.Status == http.StatusInternalServerError {
		level = slog.LevelError
	}
	log.LogAttrs(ctx, level, msg, append(attrs, slog.Int("status", e.Status), slog.String("code", e.Code), slog.Any("err", e.Err))...)
}

// BadRequest is a 400 invalid_request_error.
func BadRequest(code, param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

// InvalidJSON is the 400 invalid_json of a request body that is not valid JSON, naming where
// the syntax breaks: the byte offset, and what json found there.
func InvalidJSON(body []byte) *Error {
	var se *json.SyntaxError
	if err := json.Unmarshal(body, new(json.RawMessage)); errors.As(err, &se) {
		return BadRequest("invalid_json", "", "the request body is not valid JSON: %s at byte %d", strings.TrimPrefix(se.Error(), "json: "), se.Offset)
	}
	return BadRequest("invalid_json", "", "the request body is not valid JSON")
}

// NoRoute is the error of a request that a catch-all pattern of mux met: 405 method_not_allowed
// with Allow when mux serves the path for other methods, else 404 not_found with message.
func NoRoute(mux *http.ServeMux, r *http.Request, message string) *Error {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); m != r.Method && pattern != r.Pattern && strings.Contains(pattern, " ") { // a method's own route
			allow = append(allow, m)
		}
	}
	if len(allow) == 0 {
		return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Message: message}
	}
	list := strings.Join(allow, ", ")
	return &Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
		Message: r.Method + " is not allowed on " + r.URL.Path + " (allowed: " + list + ")", Header: http.Header{"Allow": {list}}}
}

// UpstreamError is an upstream's non-2xx answer: the proxy returns it to the client unchanged.
type UpstreamError struct {
	StatusCode int
	Header     http.Header
	Body       []byte
}

func (e *UpstreamError) Error() string {
	return fmt.Sprintf("upstream answered %d: %s", e.StatusCode, workspace.Truncate(string(e.Body), 200))
}

// Temporary reports an answer a later try may not meet: the upstream overloaded or failing (429,
// 500, 502, 503, 504, 529).
func (e *UpstreamError) Temporary() bool {
	switch e.StatusCode {
	case 429, 500, 502, 503, 504, 529:
		return true
	}
	return false
}

// RetryAfter is the wait the answer's Retry-After asks for, given in seconds or as an HTTP date
// (RFC 9110 §10.2.3); 0 for none, one not understood, or a date past.
func (e *UpstreamError) RetryAfter() time.Duration {
	v := strings.TrimSpace(e.Header.Get("Retry-After"))
	if secs, err := strconv.Atoi(v); err == nil {
		return time.Duration(min(max(secs, 0), math.MaxInt32)) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0)
	}
	return 0
}

// Sentinels for failures to reach the upstream.
var (
	ErrUpstreamTimeout     = errors.New("upstream timed out")
	ErrUpstreamUnreachable = errors.New("upstream unreachable")
	// ErrUpstreamProtocol: the upstream answered something that is not its API's wire format.
	ErrUpstreamProtocol = errors.New("upstream response not understood")
)

// errorBody is the JSON of an Error.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// Body is the error's JSON.
func (e *Error) Body() []byte {
	var b errorBody
	b.Error.Message = e.Message
	b.Error.Type = e.Type
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	if e.Code != "" {
		b.Error.Code = &e.Code
	}
	out, _ := rawjson.Marshal(b)
	return out
}

// From maps any failure of a request to the Error the client gets. It is the one place that
// decides statuses; UpstreamError is handled by the caller (its body goes back unchanged).
func From(err error) *Error {
	var e *Error
	var ve *workspace.ValidationError
	var de *workspace.DuplicateError
	var ce *workspace.ConflictError
	var pe *workspace.ParentsError
	var ae *workspace.AnsweredError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &ve):
		return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_value", Param: ve.Field, Message: ve.Error()}
	case errors.As(err, &de):
		return &Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "duplicate_preference", Param: "title",
			Message: fmt.Sprintf("a preference with this title is already recorded: #%d %q", de.Existing.Index, de.Existing.Title)}
	case errors.As(err, &ce):
		return &Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "changed_since", Message: ce.Error()}
	case errors.As(err, &pe):
		return &Error{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_parents", Param: "parents", Message: pe.Error()}
	case errors.As(err, &ae):
		return &Error{Status: http.StatusConflict, Type: "invalid_request_error", Code: "proposal_answered", Message: ae.Error()}
	case errors.Is(err, workspace.ErrNotFound):
		return &Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Message: "not found"}
	case errors.Is(err, ErrUpstreamTimeout):
		return &Error{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "upstream_timeout", Message: "the upstream did not answer in time", Err: err}
	case errors.Is(err, ErrUpstreamUnreachable):
		msg := "the upstream could not be reached"
		if he := (*HostError)(nil); errors.As(err, &he) && he.Host != "" {
			msg = "the upstream at " + he.Host + " could not be reached"
		}
		return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_unreachable", Message: msg, Err: err}
	case errors.Is(err, ErrUpstreamProtocol):
		return &Error{Status: http.StatusBadGateway, Type: "server_error", Code: "upstream_invalid_response", Message: "the upstream's response was not understood", Err: err}
	case errors.Is(err, workspace.ErrUnavailable) && errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "workspace_unavailable",
			Message: "the workspace store (Postgres) did not answer in time; the request was not run", Err: err}
	case errors.Is(err, workspace.ErrUnavailable):
		return &Error{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "workspace_unavailable",
			Message: "the workspace store (Postgres) is unavailable; the request was not run", Err: err}
	case errors.Is(err, context.Canceled):
		return &Error{Status: StatusClientClosedRequest, Type: "invalid_request_error", Code: "client_closed_request", Message: "the client closed the request", Err: err}
	}
	return &Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error", Message: "internal error", Err: err}
}

// StreamFailure is the error a stream's failure event reports for err, which ended a turn
// after its first byte: the upstream's own error (an error event of its stream, or an error
// answer of a later round) with its type, code and message, else the proxy's.
func StreamFailure(err error) *Error {
	var se *StreamError
	var ue *UpstreamError
	var raw []byte
	switch {
	case errors.As(err, &se):
		raw = se.Data
	case errors.As(err, &ue):
		raw = ue.Body
	}
	type detail struct {
		Type    string `json:"type"`
		Code    any    `json:"code"`
		Message string `json:"message"`
	}
	var d struct {
		detail
		Error *detail `json:"error"`
	}
	if raw != nil && json.Unmarshal(raw, &d) == nil {
		if d.Error != nil {
			d.detail = *d.Error
		}
		if d.Message != "" {
			e := &Error{Type: d.Type, Message: d.Message}
			if e.Type == "" || e.Type == "error" { // a Responses error event's type
				e.Type = "server_error"
			}
			e.Code, _ = d.Code.(string)
			return e
		}
	}
	return From(err)
}

// Write is the error funnel: it answers err in OpenAI's shape, or in the shape WithShape gave
// the request's wire API (an upstream's own error goes back with its status and body
// unchanged), and logs only the failures that are the proxy's or its dependencies', once.
func Write(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var ue *UpstreamError
	if errors.As(err, &ue) {
		CopyHeader(w.Header(), ue.Header)
		w.Header().Del("Content-Length")
		w.WriteHeader(ue.StatusCode)
		_, _ = w.Write(ue.Body)
		log.LogAttrs(r.Context(), slog.LevelDebug, "upstream error returned", slog.Int("status", ue.StatusCode))
		return
	}
	if errors.Is(err, ErrAnswered) {
		return
	}
	e := From(err)
	e.Log(r.Context(), log, "request failed", slog.String("route", r.Pattern))
	if e.Status == StatusClientClosedRequest {
		return // nobody is listening
	}
	if id := RequestID(r.Context()); id != "" && e.Status >= 500 {
		named := *e // e may be shared: a sentinel
		named.Message += " (request " + id + ")"
		e = &named
	}
	CopyHeader(w.Header(), e.Header)
	WriteJSON(w, e.Status, e.BodyFor(r.Context()))
}

type requestIDKey struct{}

// WithRequestID is ctx with the id of its request (X-Request-Id): the message of a 5xx the
// request gets names it, and so does every log line of the request.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID is the id of ctx's request ("" for none).
func RequestID(ctx context.Context) string { id, _ := ctx.Value(requestIDKey{}).(string); return id }

type shapeKey struct{}

// Shape is a wire API's error body for an Error of the proxy (nil: OpenAI's, Error.Body).
type Shape func(*Error) []byte

// WithShape marks a request of a wire API whose errors have a shape of their own: Write answers
// its errors with shape.
func WithShape(r *http.Request, shape Shape) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), shapeKey{}, shape))
}

// BodyFor is the error's body in the shape of ctx's request (WithShape), else OpenAI's.
func (e *Error) BodyFor(ctx context.Context) []byte {
	if shape, _ := ctx.Value(shapeKey{}).(Shape); shape != nil {
		return shape(e)
	}
	return e.Body()
}

// WriteJSON answers status with a JSON body.
func WriteJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// ErrAnswered is a failure whose answer already went out (a 413 after a drain).
var ErrAnswered = errors.New("request already answered")

// StreamError is an error the upstream sent inside its stream (`data: {"error":…}`, or the
// Responses API's error event).
type StreamError struct {
	Data []byte // the event's JSON, as sent
}

func (e *StreamError) Error() string {
	return "upstream stream error: " + workspace.Truncate(string(e.Data), 200)
}

// HostError is a failure to reach the upstream at Host (its host and port, as configured): the
// client's upstream_unreachable names it.
type HostError struct {
	Host string
	Err  error
}

func (e *HostError) Error() string { return "upstream " + e.Host + ": " + e.Err.Error() }
func (e *HostError) Unwrap() error { return e.Err }

// Timeout is the wrapped error's (url.Error asks its error directly, not its chain).
func (e *HostError) Timeout() bool {
	t, ok := e.Err.(interface{ Timeout() bool })
	return ok && t.Timeout()
}

// Transport wraps a failure to talk to the upstream in ErrUpstreamTimeout or
// ErrUpstreamUnreachable; a cancelled client context stays context.Canceled.
func Transport(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, ErrUpstreamTimeout) || errors.Is(err, ErrUpstreamUnreachable):
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("upstream: %w", context.Cause(ctx))
	}
	return fmt.Errorf("%w: %w", ErrUpstreamUnreachable, err)
}

// CopyHeader copies the values of src into dst, replacing dst's of the same names.
func CopyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = append(dst[k][:0:0], vs...)
	}
}
