package proxy

// Limits per client (docs/spec.md §20): each request of a client is counted and admitted, or
// refused with a 429 in its API's shape, before anything of it is read further, written or sent
// upstream; the tokens the upstream reports are counted as each answer ends, on every route.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/limits"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// ClientLimits are one client's limits (docs/spec.md §20); a zero field is no limit.
type ClientLimits = limits.Limits

// LimitsSource is each client's limits as they stand now. It is asked on every request of a
// client, so it answers from memory (the clients table's cache), never from the database.
type LimitsSource = limits.Source

// ClientUsage is what a client used in the current windows, on every replica.
type ClientUsage = limits.Usage

// ClientUsage is what client used this minute and today (UTC), on every replica as this one last
// read them (within Options.LimitsInterval): what GET /admin/v1/me and the clients listing show.
// Zero without client keys.
func (s *Server) ClientUsage(client string) ClientUsage {
	if s.counter == nil {
		return ClientUsage{}
	}
	return s.counter.Usage(client)
}

// startLimits starts the counter of the clients' usage when there are clients, and its sync
// with the other replicas when there is a store.
func (s *Server) startLimits() {
	if s.opts.ClientKeys == nil {
		return
	}
	var store limits.Store
	if s.opts.Store != nil {
		store = s.opts.Store
	}
	s.counter = limits.NewCounter(store, s.opts.LimitsInterval, s.log)
	if store == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.counter.Run(ctx) }()
	s.stopLimits = func() { cancel(); <-done }
}

// limitsOf is client's limits: Options.Limits's, or the clients table's as ClientKeys holds them.
func (s *Server) limitsOf(client string) limits.Limits {
	if s.opts.Limits != nil {
		return s.opts.Limits(client)
	}
	var l limits.Limits
	if s.opts.ClientKeys == nil {
		return l
	}
	c := s.opts.ClientKeys.Limits(client)
	if c.RequestsPerMinute != nil {
		l.RequestsPerMinute = int64(*c.RequestsPerMinute)
	}
	if c.TokensPerDay != nil {
		l.TokensPerDay = *c.TokensPerDay
	}
	if c.MaxThreads != nil {
		l.MaxThreads = int64(*c.MaxThreads)
	}
	return l
}

// admit counts a request of client ("" is no client: the admin's, or any without client keys)
// and refuses it past requests_per_minute, or once the day's tokens reached tokens_per_day.
func (s *Server) admit(client string) error {
	if s.counter == nil || client == "" {
		return nil
	}
	if ref := s.counter.Admit(client, s.limitsOf(client)); ref != nil {
		s.opts.Metrics.clientLimited(ref.Limit, client)
		return limitedError(ref.Limit, ref.RetryAfter)
	}
	return nil
}

// admitMCP is mcp.Options.Admit.
func (s *Server) admitMCP(_ *http.Request, client string) error { return s.admit(client) }

// limitedError is the 429 of a request past limit, with Retry-After (whole seconds, at least 1)
// when a window frees it.
func limitedError(limit string, retry time.Duration) *apierr.Error {
	e := &apierr.Error{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: limit + "_exceeded"}
	switch limit {
	case limits.RequestsPerMinute:
		e.Message = "this client's requests_per_minute is reached; retry after the minute ends"
	case limits.TokensPerDay:
		e.Message = "this client's tokens_per_day is reached; retry after the day ends (UTC)"
	default:
		e.Message = "this client's max_threads is reached: a new thread is refused until one of its threads is deleted"
	}
	if retry > 0 {
		secs := int64((retry + time.Second - 1) / time.Second)
		e.Header = http.Header{"Retry-After": {strconv.FormatInt(max(secs, 1), 10)}}
	}
	return e
}

// countTokens counts the tokens of a thread turn's rounds for its client.
func (s *Server) countClientTokens(client string, u workspace.Usage) {
	if s.counter != nil && client != "" {
		s.counter.AddTokens(client, workspace.AddTokens(u.PromptTokens, u.CompletionTokens))
	}
}

// maxKnownThreads bounds knownThreads: past it the set starts again.
const maxKnownThreads = 1 << 14

// knownThreads are threads this replica saw exist: a turn of one needs no count of its client's
// threads (max_threads).
type knownThreads struct {
	mu  sync.Mutex
	ids map[workspace.ThreadID]struct{}
}

func (k *knownThreads) has(id workspace.ThreadID) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.ids[id]
	return ok
}

func (k *knownThreads) add(id workspace.ThreadID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ids == nil || len(k.ids) >= maxKnownThreads {
		k.ids = map[workspace.ThreadID]struct{}{}
	}
	k.ids[id] = struct{}{}
}

// admitThread refuses a turn that would create a thread past its client's max_threads. A thread
// this replica saw exist costs nothing; any other one of a client with max_threads costs a count
// of the client's threads (one statement) before its turn starts. Two replicas creating threads
// of one client at once may each take the last place.
func (s *Server) admitThread(ctx context.Context, id workspace.ThreadID) error {
	if s.counter == nil || id.Client == "" {
		return nil
	}
	lim := s.limitsOf(id.Client).MaxThreads
	if lim <= 0 || s.knownThreads.has(id) {
		return nil
	}
	n, exists, err := s.opts.Store.ClientThreads(ctx, id)
	if err != nil {
		return err
	}
	if exists {
		s.knownThreads.add(id)
		return nil
	}
	if n >= lim {
		s.opts.Metrics.clientLimited(limits.MaxThreads, id.Client)
		return limitedError(limits.MaxThreads, 0)
	}
	return nil
}

// tapUsage prepares a pass-through of a client's for its usage to be counted (what forward tells
// modifyResponse goes in the request's info, with its client): a streamed chat completion that
// did not ask for its usage is made to (stream_options.include_usage), and what that adds comes
// out of the stream before the client reads it.
func (s *Server) tapUsage(r *http.Request, body []byte) []byte {
	info := requestInfoFrom(r.Context())
	if info == nil {
		return body
	}
	info.mu.Lock()
	defer info.mu.Unlock()
	if info.client == "" {
		return body
	}
	info.tapped = true
	if a := apiOf(r); a != nil && a.name == OpenAI && r.Method == http.MethodPost && apiPath(r.URL.EscapedPath()) == "/v1/chat/completions" {
		if asked, ok := askChatUsage(body); ok {
			body, info.strip = asked, true
		}
	}
	return body
}

// askChatUsage is a streamed chat request that did not ask for its usage with include_usage set
// (its other stream_options kept); ok is false for any other body, which goes as it came.
func askChatUsage(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(`"stream"`)) {
		return nil, false
	}
	s, e, ok := rawjson.Member(body, "stream")
	if !ok || string(body[s:e]) != "true" {
		return nil, false
	}
	req, err := rawjson.Parse(body)
	if err != nil {
		return nil, false
	}
	opts := rawjson.Object{}
	if v := req.Get("stream_options"); v != nil && string(v) != "null" {
		if opts, err = rawjson.Parse(v); err != nil {
			return nil, false // not an object: the upstream's to refuse as it is
		}
		if u := opts.Get("include_usage"); u != nil && string(u) != "false" && string(u) != "null" {
			return nil, false
		}
	}
	opts.Set("include_usage", json.RawMessage("true"))
	req.Set("stream_options", opts.Bytes())
	return req.Bytes(), true
}

// tapResponse counts the usage of a 2xx answer to a request forward tapped.
func (s *Server) tapResponse(resp *http.Response) {
	info := requestInfoFrom(resp.Request.Context())
	if s.counter == nil || info == nil || resp.StatusCode < 200 || resp.StatusCode > 299 {
		return
	}
	info.mu.Lock()
	tapped, strip, client := info.tapped, info.strip, info.client
	info.mu.Unlock()
	if !tapped {
		return
	}
	sse := isEventStream(resp.Header)
	b := &usageBody{rc: resp.Body, sse: sse, strip: strip && sse, counter: s.counter, client: client}
	if b.strip {
		// What comes out changes length: the client's framing is chunked.
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	resp.Body = b
}

// maxUsageTail is how much of the end of a JSON answer is kept to find its usage in.
const maxUsageTail = 16 << 10

// maxPendingEvent bounds an event held while its end has not come (strip): past it, what is held
// goes out as it is.
const maxPendingEvent = 1 << 20

// usageBody passes an answer through while reading its usage: a stream's from its events (every
// usage member an event carries: chat's, Responses' response.completed, the Messages API's
// message_start and message_delta, Gemini's usageMetadata), a JSON body's from its last usage
// member. When strip is set (wsproxy asked a chat stream for its usage) the stream is rewritten
// event by event: the usage chunk comes out, and so does the "usage":null wsproxy's asking put in
// every other chunk. Its tokens are counted once, when it is closed.
type usageBody struct {
	rc         io.ReadCloser
	sse, strip bool
	counter    *limits.Counter
	client     string
	closed     bool

	buf     []byte // strip: what is read from the upstream
	pending []byte // sse: a line not yet ended; strip: an event not yet ended
	out     []byte // strip: rewritten bytes not yet read
	tail    []byte // JSON: the last maxUsageTail bytes
	eof     bool

	prompt, completion int64 // the largest counts seen (streams' are cumulative)
}

func (b *usageBody) Read(p []byte) (int, error) {
	if !b.strip {
		n, err := b.rc.Read(p)
		if n > 0 {
			if b.sse {
				b.scanLines(p[:n])
			} else {
				b.keepTail(p[:n])
			}
		}
		if err == io.EOF && !b.sse {
			b.jsonUsage()
		}
		return n, err
	}
	for len(b.out) == 0 {
		if b.eof {
			return 0, io.EOF
		}
		if b.buf == nil {
			b.buf = make([]byte, 32<<10)
		}
		n, err := b.rc.Read(b.buf)
		b.pending = append(b.pending, b.buf[:n]...)
		b.rewrite(err != nil)
		if err == io.EOF {
			b.eof = true
		} else if err != nil {
			if len(b.out) == 0 {
				return 0, err
			}
			break
		}
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

func (b *usageBody) Close() error {
	if !b.closed { // ReverseProxy's goroutine, or the turn's, reads it and closes it
		b.closed = true
		if b.sse && !b.strip && len(b.pending) > 0 {
			b.event(b.pending)
		}
		b.counter.AddTokens(b.client, workspace.AddTokens(b.prompt, b.completion))
	}
	return b.rc.Close()
}

// scanLines reads the usage of the stream's data lines in p (a line may span reads).
func (b *usageBody) scanLines(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(b.pending)+len(p) <= maxPendingEvent {
				b.pending = append(b.pending, p...)
			}
			return
		}
		line := p[:i]
		if len(b.pending) > 0 {
			line = append(b.pending, line...)
			b.pending = b.pending[:0]
		}
		b.line(line)
		p = p[i+1:]
	}
}

// line reads one line of a stream: a data line that mentions usage is read for it.
func (b *usageBody) line(line []byte) {
	data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r"), []byte("data:"))
	if ok && bytes.Contains(data, []byte(`sage`)) {
		b.event(data)
	}
}

// event reads the usage members of a stream event's data.
func (b *usageBody) event(data []byte) {
	for _, path := range [][]string{{"usage"}, {"usageMetadata"}, {"response", "usage"}, {"message", "usage"}} {
		v := data
		for _, key := range path {
			s, e, ok := rawjson.Member(v, key)
			if !ok {
				v = nil
				break
			}
			v = v[s:e]
		}
		if len(v) > 0 && v[0] == '{' {
			b.note(v)
		}
	}
}

// note keeps the counts of one usage object.
func (b *usageBody) note(raw []byte) {
	prompt, completion := usageTokens(raw)
	b.prompt, b.completion = max(b.prompt, prompt), max(b.completion, completion)
}

// keepTail keeps the last maxUsageTail bytes of a JSON answer: a small answer whole, in a
// buffer of its size.
func (b *usageBody) keepTail(p []byte) {
	if len(p) >= maxUsageTail {
		b.tail = append(b.tail[:0], p[len(p)-maxUsageTail:]...)
		return
	}
	if over := len(b.tail) + len(p) - maxUsageTail; over > 0 {
		b.tail = append(b.tail[:0], b.tail[over:]...)
	}
	b.tail = append(b.tail, p...)
}

// jsonUsage reads the usage of a JSON answer: the value of its last "usage" member and of its
// last "usageMetadata" member (the top-level one of every API's answer, and the last element's
// of Gemini's streamed array). One forward scan finds both: bytes.Index is vectorised, where
// bytes.LastIndex compares a rolling hash byte by byte (a 1 KB answer cost 1 µs, most of a
// pass-through's counting).
func (b *usageBody) jsonUsage() {
	var last [2][]byte // the last usage and usageMetadata values
	t := b.tail
	for {
		// "usage, found by its u: a quote starts too many searches over in JSON.
		i := bytes.Index(t, []byte(`usage`))
		if i < 0 {
			break
		}
		rest, which := t[i+len(`usage`):], -1
		if r, ok := bytes.CutPrefix(rest, []byte(`"`)); ok {
			rest, which = r, 0
		} else if r, ok := bytes.CutPrefix(rest, []byte(`Metadata"`)); ok {
			rest, which = r, 1
		}
		// A member's name: after a quote that no backslash escapes (not inside a string).
		if which >= 0 && i > 0 && t[i-1] == '"' && (i == 1 || t[i-2] != '\\') {
			if v := memberValue(rest); v != nil {
				last[which] = v
			}
		}
		t = t[i+1:]
	}
	for _, v := range last {
		if v != nil {
			b.note(v)
		}
	}
}

// memberValue is the object that follows a member's name in rest (": {…}"), or nil.
func memberValue(rest []byte) []byte {
	rest = bytes.TrimLeft(rest, " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '{' {
		return nil
	}
	if end := valueEnd(rest, 0); end > 0 {
		return rest[:end]
	}
	return nil
}

// rewrite takes the events of pending that ended (all of it at the end of the stream) to out,
// without what wsproxy's asking for the usage added.
func (b *usageBody) rewrite(end bool) {
	for {
		i := bytes.Index(b.pending, []byte("\n\n"))
		if i < 0 {
			if end || len(b.pending) > maxPendingEvent {
				b.out = append(b.out, b.stripEvent(b.pending)...)
				b.pending = b.pending[:0]
			}
			return
		}
		b.out = append(b.out, b.stripEvent(b.pending[:i+2])...)
		b.pending = b.pending[i+2:]
	}
}

// stripEvent is a chat stream's event as the client would have had it without include_usage: a
// usage chunk (no choices) is dropped, counted; a chunk's "usage":null is taken out.
func (b *usageBody) stripEvent(ev []byte) []byte {
	rest, ok := bytes.CutPrefix(ev, []byte("data:"))
	if !ok {
		return ev
	}
	data := bytes.TrimLeft(rest, " ")
	s, e, ok := rawjson.Member(data, "usage")
	if !ok {
		return ev
	}
	if string(data[s:e]) != "null" {
		b.note(data[s:e])
		if cs, ce, ok := rawjson.Member(data, "choices"); ok && string(bytes.ReplaceAll(data[cs:ce], []byte(" "), nil)) == "[]" {
			return nil
		}
		return ev
	}
	// "usage":null: the member goes, with the comma that joined it to its neighbour.
	off := len(ev) - len(data)
	ks := bytes.LastIndex(data[:s], []byte(`"usage"`))
	if ks < 0 {
		return ev
	}
	from, to := ks, e
	if j := lastNonSpace(data[:ks]); j >= 0 && data[j] == ',' {
		from = lastNonSpace(data[:j]) + 1 // and the space before the comma
	} else if k := firstNonSpace(data[e:]); k >= 0 && data[e+k] == ',' {
		to = e + k + 1
	} else {
		return ev
	}
	out := make([]byte, 0, len(ev)-(to-from))
	out = append(out, ev[:off+from]...)
	return append(out, ev[off+to:]...)
}

func lastNonSpace(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if !isSpace(b[i]) {
			return i
		}
	}
	return -1
}

func firstNonSpace(b []byte) int {
	for i, c := range b {
		if !isSpace(c) {
			return i
		}
	}
	return -1
}

// usageTokens reads a usage object of any of the wire APIs: its prompt tokens (OpenAI's
// prompt_tokens, Responses' and the Messages API's input_tokens with its cache reads and writes,
// Gemini's promptTokenCount with toolUsePromptTokenCount) and its completion tokens
// (completion_tokens, output_tokens, candidatesTokenCount with thoughtsTokenCount); an object
// with a total alone (embeddings') counts it as prompt.
func usageTokens(raw []byte) (prompt, completion int64) {
	var total int64
	eachMember(raw, func(key, val []byte) {
		n := tokenCount(val)
		switch string(key) { // compared without converting
		case "prompt_tokens", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "promptTokenCount", "toolUsePromptTokenCount":
			prompt = workspace.AddTokens(prompt, n)
		case "completion_tokens", "output_tokens", "candidatesTokenCount", "thoughtsTokenCount":
			completion = workspace.AddTokens(completion, n)
		case "total_tokens", "totalTokenCount":
			total = max(total, n)
		}
	})
	if prompt == 0 && completion == 0 {
		prompt = total
	}
	return prompt, completion
}

// tokenCount is a count's value: a non-negative JSON integer, else 0.
func tokenCount(v []byte) int64 {
	if len(v) == 0 || len(v) > 18 {
		return 0
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

// eachMember calls fn with the name (as written, without its quotes) and raw value of each
// member of the JSON object b, allocating nothing; it stops at the first thing that is not a
// member. Names with escapes are not among the usage's, and are passed as written.
func eachMember(b []byte, fn func(key, val []byte)) {
	i := skipSpaces(b, 0)
	if i >= len(b) || b[i] != '{' {
		return
	}
	i++
	for {
		i = skipSpaces(b, i)
		if i >= len(b) || b[i] != '"' {
			return
		}
		kend := stringEnd(b, i)
		if kend < 0 {
			return
		}
		key := b[i+1 : kend-1]
		i = skipSpaces(b, kend)
		if i >= len(b) || b[i] != ':' {
			return
		}
		i = skipSpaces(b, i+1)
		vend := valueEnd(b, i)
		if vend <= i {
			return
		}
		fn(key, b[i:vend])
		i = skipSpaces(b, vend)
		if i >= len(b) || b[i] != ',' {
			return
		}
		i++
	}
}

func skipSpaces(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// stringEnd is the index after the JSON string that begins at b[i], -1 when it does not end.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd is the index after the JSON value that begins at b[i] (objects and arrays by their
// brackets, outside strings), i or less when there is none.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				if j = stringEnd(b, j); j < 0 {
					return -1
				}
				j--
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && !isSpace(b[j]) {
		j++
	}
	return j
}
