package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (the list net/http/httputil strips),
// never forwarded by a proxy.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// rewrittenHeader is the client's header less hop-by-hop headers and those that described the
// original body.
func rewrittenHeader(in http.Header) http.Header {
	h := in.Clone()
	removeHopHeaders(h)
	for _, k := range []string{"Content-Length", "Accept-Encoding", "Host"} {
		h.Del(k)
	}
	return h
}

// strip removes, from a request to the upstream (a thread turn's or a pass-through), the
// proxy's own headers (the thread's, its placement's and parents'), those that tell of the client's network (Forwarded, X-Forwarded-*,
// X-Real-IP), its cookies (the panel's session among them: the upstream is no party to them).
// With client keys it also removes every header that may carry a client's credential
// (clientCredential) and those by which a client could pick the operator's organization or
// project. The operator's key is the API's to set (upstreamRequest).
func (s *Server) strip(h http.Header) {
	for k := range h {
		if strings.HasPrefix(k, "X-Forwarded-") || (s.opts.ClientKeys.On() && clientCredential(k)) {
			delete(h, k)
		}
	}
	for _, k := range strippedHeaders {
		delete(h, k)
	}
	if s.opts.ClientKeys.On() {
		for _, k := range accountHeaders {
			delete(h, k)
		}
	}
}

// strippedHeaders are wsproxy's own request headers and those that name the client's address or
// carry its cookies; accountHeaders pick the operator's organization or project. Both are in the
// canonical form net/http keeps names in (TestHeaderNames): strip deletes them without
// canonicalising each on every request.
var (
	strippedHeaders = []string{threadHeader, placementHeader, parentsHeader, "Forwarded", "X-Real-Ip", "Cookie"}
	accountHeaders  = []string{"Openai-Organization", "Openai-Project"}
)

// credentialWords are the parts of a header name that mark a credential (Authorization,
// X-Api-Key, Api-Key, Ocp-Apim-Subscription-Key, X-Auth-Token, X-Goog-Api-Key, …).
var credentialWords = []string{"auth", "api-key", "apikey", "api_key", "subscription-key", "access-key", "token", "secret", "password", "credential", "cookie"}

// credentialWordsAt are credentialWords by their first byte.
var credentialWordsAt = func() (at [256][][]byte) {
	for _, w := range credentialWords {
		at[w[0]] = append(at[w[0]], []byte(w))
	}
	return at
}()

// clientCredential reports a request header that may carry a client's credential: none of them
// goes upstream for clients with keys, who are wsproxy's and whose upstream credential is
// UPSTREAM_API_KEY alone. It runs on every header of every keyed request: it allocates nothing.
func clientCredential(name string) bool {
	var buf [64]byte // a header name lowered here, not on the heap (canonical names are mixed case)
	n := append(buf[:0], name...)
	for i, c := range n {
		if 'A' <= c && c <= 'Z' {
			n[i] = c + 'a' - 'A'
		}
	}
	// Every word is looked for where a byte starts it: a name is read once, not once a word.
	for i, c := range n {
		for _, w := range credentialWordsAt[c] {
			if bytes.HasPrefix(n[i:], w) {
				return true
			}
		}
	}
	return false
}

// fromUpstream is what the proxy changes in an upstream's response before a client gets it: its
// X-Request-Id becomes X-Upstream-Request-Id (the client's X-Request-Id is wsproxy's); with
// client keys, the headers that name the operator's account and the upstream's cookies go
// (identity); the operator's keys, should a header value or the body — an error's, an answer's, a
// stream's — quote one, are redacted (keys: every upstream's that is set, UPSTREAM_API_KEY and
// the other APIs'; without them nothing is scanned).
type fromUpstream struct {
	identity bool
	keys     [][]byte
}

func (s *Server) fromUpstream() fromUpstream {
	return fromUpstream{identity: s.opts.ClientKeys.On(), keys: s.upstreamKeys}
}

// identityHeaders name the operator's account, or are the upstream's cookies.
var identityHeaders = []string{"Openai-Organization", "Openai-Project", "Set-Cookie", "Set-Cookie2"}

func (f fromUpstream) header(h http.Header) {
	// The client's X-Request-Id is wsproxy's (observed); the upstream's own goes on beside it.
	if ids := h.Values(requestIDHeader); len(ids) > 0 {
		h[upstreamRequestIDHeader] = ids
		h.Del(requestIDHeader)
	}
	if f.identity {
		for _, k := range identityHeaders {
			delete(h, k) // canonical, like strippedHeaders
		}
	}
	if len(f.keys) == 0 {
		return
	}
	for _, vs := range h {
		for i, v := range vs {
			if f.mayQuote(v) {
				vs[i] = string(f.redact([]byte(v)))
			}
		}
	}
}

// mayQuote reports whether v may hold a copy of a key: the key as it is, or an escape.
func (f fromUpstream) mayQuote(v string) bool {
	if strings.IndexByte(v, '\\') >= 0 {
		return true
	}
	for _, key := range f.keys {
		if strings.Contains(v, string(key)) {
			return true
		}
	}
	return false
}

// redacted stands where a response quoted the operator's key.
const redacted = "[redacted]"

// redact is body with every copy of the operator's keys replaced by redacted: a key as it is,
// or as a JSON string may write it (keyAt), any of its characters escaped.
func (f fromUpstream) redact(body []byte) []byte {
	for _, key := range f.keys {
		if bytes.Contains(body, key) {
			body = bytes.ReplaceAll(body, key, []byte(redacted))
		}
		if bytes.IndexByte(body, '\\') >= 0 {
			body = redactEscaped(body, key)
		}
	}
	return body
}

// redactEscaped is body with every escaped copy of key (keyAt) replaced by redacted; body itself
// when it holds none.
func redactEscaped(body, key []byte) []byte {
	var out []byte // nil until the first copy
	copied := 0    // body[:copied] is in out
	for i := 0; i < len(body); i++ {
		if c := body[i]; c != key[0] && c != '\\' {
			continue
		}
		if n, _ := keyAt(body, i, key); n > 0 {
			out = append(append(out, body[copied:i]...), redacted...)
			copied = i + n
			i += n - 1
		}
	}
	if out == nil {
		return body
	}
	return append(out, body[copied:]...)
}

// keyAt is the length of the copy of key that b holds at i as a JSON string may write it: each
// character as it is or escaped — \uXXXX in either case of hex (a surrogate pair past U+FFFF),
// \/, \" and \\ for those three, \b \f \n \r \t for theirs — and 0 when it holds none there.
// partial reports that b ends inside what could still be one.
func keyAt(b []byte, i int, key []byte) (n int, partial bool) {
	j := i
	for k := 0; k < len(key); {
		if j >= len(b) {
			return 0, true
		}
		r, size := utf8.DecodeRune(key[k:])
		if b[j] != '\\' {
			for end := k + size; k < end; k, j = k+1, j+1 {
				if j >= len(b) {
					return 0, true
				}
				if b[j] != key[k] {
					return 0, false
				}
			}
			continue
		}
		m, got, part := escapeAt(b, j)
		if part {
			return 0, true
		}
		if m == 0 || got != r {
			return 0, false
		}
		j, k = j+m, k+size
	}
	return j - i, false
}

// escapeAt reads the JSON escape that begins at b[j] ('\\'): its length and the character it
// writes (m 0: none); partial when b ends inside one.
func escapeAt(b []byte, j int) (m int, r rune, partial bool) {
	if j+1 >= len(b) {
		return 0, 0, true
	}
	switch c := b[j+1]; c {
	case '"', '\\', '/':
		return 2, rune(c), false
	case 'b':
		return 2, '\b', false
	case 'f':
		return 2, '\f', false
	case 'n':
		return 2, '\n', false
	case 'r':
		return 2, '\r', false
	case 't':
		return 2, '\t', false
	case 'u':
	default:
		return 0, 0, false
	}
	v, n, part := hex4(b, j+2)
	if part || n == 0 {
		return 0, 0, part
	}
	if !utf16.IsSurrogate(rune(v)) || v >= 0xdc00 {
		return 6, rune(v), false
	}
	if j+6 >= len(b) || (b[j+6] == '\\' && j+7 >= len(b)) {
		return 0, 0, true
	}
	if b[j+6] != '\\' || b[j+7] != 'u' {
		return 0, 0, false
	}
	lo, n, part := hex4(b, j+8)
	if part || n == 0 {
		return 0, 0, part
	}
	if r := utf16.DecodeRune(rune(v), rune(lo)); r != utf8.RuneError {
		return 12, r, false
	}
	return 0, 0, false
}

// hex4 reads the four hex digits at b[i:]: n 4 and their value, n 0 when they are not; partial
// when b ends after fewer, all of them digits.
func hex4(b []byte, i int) (v uint16, n int, partial bool) {
	for n = 0; n < 4; n++ {
		if i+n >= len(b) {
			return 0, 0, true
		}
		d, ok := hexDigit(b[i+n])
		if !ok {
			return 0, 0, false
		}
		v = v<<4 | uint16(d)
	}
	return v, 4, false
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// passThroughResponse applies f to a pass-through's response (ReverseProxy.ModifyResponse), its
// body decompressed when it came gzipped (rewritePassThrough asks for nothing else): an error
// body (not 2xx) is read, up to maxErrorBody, and sent as it came but for the key; any other is
// redacted as it streams (body), without its Content-Length (a redaction changes the length).
func (f fromUpstream) passThroughResponse(resp *http.Response) error {
	f.header(resp.Header)
	if len(f.keys) == 0 || resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	body := resp.Body
	if strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			resp.Body.Close()
			return fmt.Errorf("read upstream body: %w", err)
		}
		body = struct {
			io.Reader
			io.Closer
		}{zr, resp.Body}
		resp.Header.Del("Content-Encoding")
	}
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		if n := resp.ContentLength; body == resp.Body && n >= 0 && n <= maxWholeAnswer && !isEventStream(resp.Header) {
			// A JSON answer of a known length is read whole and goes on with its redacted
			// length: scanned as it is read, it lost its Content-Length, and ReverseProxy
			// flushes a body of no length after every write (a write of its own each time).
			defer body.Close() // its last read ended it: net/http keeps the connection
			b := make([]byte, n)
			if _, err := io.ReadFull(body, b); err != nil {
				return fmt.Errorf("read upstream body: %w", err)
			}
			withBody(resp, f.redact(b))
			return nil
		}
		resp.Body = f.body(body)
		resp.ContentLength = -1
		resp.Header.Del("Content-Length")
		return nil
	}
	defer body.Close()
	b, err := io.ReadAll(io.LimitReader(body, maxErrorBody))
	if err != nil {
		return fmt.Errorf("read upstream error body: %w", err)
	}
	withBody(resp, f.redact(b))
	return nil
}

// maxWholeAnswer bounds the 2xx answer passThroughResponse reads whole to redact it; a longer
// one, or one of no length, is redacted as it is read (redactingBody).
const maxWholeAnswer = 1 << 20

// isEventStream reports a response that is a stream of server-sent events.
func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	return len(ct) >= len("text/event-stream") && strings.EqualFold(ct[:len("text/event-stream")], "text/event-stream")
}

// withBody makes b the response's body, with its length.
func withBody(resp *http.Response, b []byte) {
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.TransferEncoding = nil
}

// body is rc with the operator's keys redacted as it is read (rc itself without keys).
func (f fromUpstream) body(rc io.ReadCloser) io.ReadCloser {
	if len(f.keys) == 0 {
		return rc
	}
	return &redactingBody{ReadCloser: rc, f: f}
}

// redactingBody is an upstream body read with the operator's keys redacted. Of what it read it
// holds back only a tail that could begin a key, until the next read tells: a stream's events
// pass as they come (an event ends in a new line, which begins no key).
type redactingBody struct {
	io.ReadCloser
	f       fromUpstream
	buf     *[]byte // from redactBuffers, back there once closed
	ready   []byte  // redacted, for the caller
	pending []byte  // redacted, but it could begin a key
	err     error   // the body's, once met
}

// redactBuffers recycles the redacting bodies' buffers, which a pass-through made one of per
// response (39 KB a request). Each reads redactRead bytes at least, ReverseProxy's copy's size, so
// that one buffer serves any body.
var redactBuffers sync.Pool

const redactRead = 32 << 10

// maxPooledRedact bounds what redactBuffers keeps.
const maxPooledRedact = 64 << 10

func (b *redactingBody) Read(p []byte) (int, error) {
	for len(b.ready) == 0 {
		if b.err != nil {
			// At the end, a tail held back is no key: it goes as it is.
			b.ready, b.pending = b.pending, nil
			if len(b.ready) == 0 {
				return 0, b.err
			}
			break
		}
		if b.buf == nil {
			b.buf = redactBuffer(max(len(p), redactRead) + b.f.longestKey())
		}
		// What was held back goes first (pending: the buffer's own tail, or a redaction's copy's;
		// copy minds the overlap).
		buf := (*b.buf)[:copy((*b.buf)[:cap(*b.buf)], b.pending)]
		n, err := b.ReadCloser.Read(buf[len(buf):cap(buf)])
		buf, b.err = buf[:len(buf)+n], err
		r := b.f.redact(buf)
		hold := 0
		if err == nil {
			hold = b.f.keyStart(r)
		}
		b.ready, b.pending = r[:len(r)-hold], r[len(r)-hold:]
	}
	n := copy(p, b.ready)
	b.ready = b.ready[n:]
	return n, nil
}

// Close closes the body and gives its buffer back; a read after it fails.
func (b *redactingBody) Close() error {
	if b.buf != nil {
		if cap(*b.buf) <= maxPooledRedact {
			redactBuffers.Put(b.buf)
		}
		b.buf = nil
	}
	b.ready, b.pending, b.err = nil, nil, http.ErrBodyReadAfterClose
	return b.ReadCloser.Close()
}

// redactBuffer is a buffer of n bytes' capacity at least, from redactBuffers when it has one.
func redactBuffer(n int) *[]byte {
	if b, ok := redactBuffers.Get().(*[]byte); ok && cap(*b) >= n {
		return b
	}
	b := make([]byte, 0, n)
	return &b
}

// longestKey is the longest a copy of a key may be: escaped, a character takes at most six times
// its bytes (\uXXXX for one byte; a surrogate pair, twelve, for four).
func (f fromUpstream) longestKey() int {
	n := 0
	for _, key := range f.keys {
		n = max(n, 6*len(key))
	}
	return n
}

// keyStart is the length of b's longest tail that begins a copy of one of the keys, as it is or
// escaped (keyAt; 0 when none).
func (f fromUpstream) keyStart(b []byte) int {
	hold := 0
	for _, key := range f.keys {
		for i := max(0, len(b)-6*len(key)+1); i < len(b)-hold; i++ {
			if c := b[i]; c != key[0] && c != '\\' {
				continue
			}
			if _, partial := keyAt(b, i, key); partial {
				hold = len(b) - i
				break
			}
		}
	}
	return hold
}

// removeHopHeaders removes h's hop-by-hop headers (hopByHop).
func removeHopHeaders(h http.Header) {
	named := connectionNamed(h)
	for k := range h {
		if hopByHop(named, k) {
			delete(h, k)
		}
	}
}

// connectionNamed is the headers h's Connection values name, in canonical form.
func connectionNamed(h http.Header) []string {
	var named []string
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				named = append(named, http.CanonicalHeaderKey(name))
			}
		}
	}
	return named
}

// hopByHop reports whether k is a hop-by-hop header of a message whose Connection values name
// named (connectionNamed): one of hopHeaders, or one of named (RFC 9110 §7.6.1).
func hopByHop(named []string, k string) bool {
	return slices.Contains(hopHeaders, k) || slices.Contains(named, k)
}

// responseHeader is what the client gets of an upstream response's header when the proxy writes
// the body itself: copyResponseHeader into a header of its own.
func responseHeader(in http.Header) http.Header {
	h := make(http.Header, len(in))
	copyResponseHeader(h, in)
	return h
}

// copyResponseHeader copies into dst what the client gets of an upstream response's header
// when the proxy writes the body itself: all but the hop-by-hop headers (those named in
// Connection too) and those that described the upstream's body (Content-Length,
// Content-Encoding). Each value slice is dst's own.
func copyResponseHeader(dst, src http.Header) {
	named := connectionNamed(src)
	for k, vs := range src {
		if k == "Content-Length" || k == "Content-Encoding" || hopByHop(named, k) {
			continue
		}
		dst[k] = append(dst[k][:0:0], vs...)
	}
}

// redactingLog is log with the operator's keys redacted from its records' attribute values: the
// turn engine logs what an upstream sent (a stream's error data, which may quote the key). Nil
// stays nil, and without keys log is returned as it is.
func (f fromUpstream) redactingLog(log *slog.Logger) *slog.Logger {
	if log == nil || len(f.keys) == 0 {
		return log
	}
	return slog.New(redactingHandler{log.Handler(), f})
}

// redactingHandler is the slog.Handler of redactingLog.
type redactingHandler struct {
	slog.Handler
	f fromUpstream
}

func (h redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.Handler.Handle(ctx, out)
}

func (h redactingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	for i, a := range attrs {
		attrs[i] = h.attr(a)
	}
	return redactingHandler{h.Handler.WithAttrs(attrs), h.f}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{h.Handler.WithGroup(name), h.f}
}

// attr is a with the keys redacted from its value (each member of a group's).
func (h redactingHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	if v.Kind() == slog.KindGroup {
		members := v.Group()
		redacted := make([]any, len(members))
		for i, m := range members {
			redacted[i] = h.attr(m)
		}
		return slog.Group(a.Key, redacted...)
	}
	s := []byte(v.String())
	if r := h.f.redact(s); !bytes.Equal(r, s) {
		return slog.String(a.Key, string(r))
	}
	return a
}
