// Package turn is wsproxy's turn engine: a thread turn's request read and rewritten on raw JSON
// (the workspace placed, the five tools added), the one loop that runs the workspace's calls and
// calls the upstream again until the model answers (Runner), and the wire dialects it speaks —
// chat completions, the Responses API, Anthropic's Messages API and Google's Gemini API, each as
// JSON and as server-sent events. It knows neither HTTP handlers nor Prometheus: the upstream is an
// interface, the client of a stream an Emitter, and metrics go through Metrics
// (docs/architecture.md).
package turn

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// Kinds of a thread's request (docs/spec.md §18): a turn of the loop, or a request the agent
// makes for itself, which is left alone (forwarded as it came, counted by its kind).
const (
	// KindTurn is a thread turn: the workspace in the request, the five tools, the loop.
	KindTurn = "turn"
	// KindSide is an agent's side request: a title, a topic, a routing classifier.
	KindSide = "side"
	// KindCompaction is an agent's compaction: a summary of the conversation for its own history.
	KindCompaction = "compaction"
)

// Request is a client's request of a thread turn in one wire API (ChatRequest,
// ResponsesRequest, MessagesRequest), ready to run once Prepare has put the workspace in it.
type Request interface {
	// Kind is the request's kind: KindTurn, or a kind that is left alone.
	Kind() string
	// Model is the model the request names ("" for none).
	Model() string
	// Streamed reports whether the client asked for a stream.
	Streamed() bool
	// Prepare puts text (the instructions and the block) where placement says, and what the
	// turn adds for the upstream: its usage when streamed, a prompt_cache_key ("" for none) the
	// client did not set, what lets a round's reasoning go back.
	Prepare(text string, placement Placement, cacheKey string)
	// JSON is the dialect of a turn whose client gets one body.
	JSON(t *Turn) JSONDialect
	// Stream is the dialect of a turn whose client gets a stream, on out.
	Stream(t *Turn, out Emitter) StreamDialect
	// Reading is what the request gives the model to read, by who wrote it (docs/spec.md §19):
	// the client's conversation as it came, whatever Prepare added.
	Reading() workspace.Reading
	// Tainted is what every thread turn's start asks of Reading: whether the request holds
	// untrusted content, and the client's own tools. It reads the conversation up to its first
	// untrusted part only.
	Tainted() (tainted, clientTools bool)
}

// Counted is a request of an API that counts a request's tokens (the Messages API's
// count_tokens): CountBody is the count's body as the turn's first round would send it, with
// text where placement puts it and the five tools after the client's.
type Counted interface {
	CountBody(text string, placement Placement) Payload
}

// Dialect is one wire format of a turn's rounds: chat completions as JSON (chatJSON) or as
// server-sent events (chatSSE), the Responses API as JSON (responsesJSON) or as typed events
// (responsesSSE), the Messages API as JSON (messagesJSON) or as typed events (messagesSSE). The
// loop (Runner.Run) is the same for every dialect: it asks for the next round's request, has
// the dialect fetch and decode the reply, runs the workspace's calls, has the dialect extend the
// request with them, and has it finish the turn. A new wire format is a new dialect, never a
// new loop.
type Dialect interface {
	// request is the upstream body of the next round, with or without the workspace tools.
	request(withWorkspaceTools bool) Payload
	// fetch sends body upstream and decodes the reply into its tool calls, in order (the
	// client's marked), its usage with the token counts in the API's terms, and what it says of
	// itself (for traces). An error after part of the round reached the client is wrapped in
	// noRetry.
	fetch(ctx context.Context, body Payload) (calls []toolCall, u usage, info roundInfo, err error)
	// pause is called before the loop waits for the workspace's tools: a stream sends what it
	// holds.
	pause() error
	// extend appends the last reply and the results of the workspace's calls to the request.
	extend(calls []toolCall, results []tools.Result)
	// finish ends the turn on the last reply: the client gets its calls, if any, or the answer,
	// with the usage of every round.
	finish(clientCalls []toolCall, usage *usageSum, rounds int) error
}

// JSONDialect is a dialect whose client gets one body.
type JSONDialect interface {
	Dialect
	// Answer is the client's body and the upstream's header of the last round, once the turn
	// ended.
	Answer() (body []byte, header http.Header)
}

// StreamDialect is a dialect whose client gets a stream.
type StreamDialect interface {
	Dialect
	// Failure is the event (name and data) that ends a stream whose turn failed after its first
	// byte.
	Failure(err error) (event string, data []byte)
	// End is what follows the last event of a stream that succeeded (nil for nothing).
	End() []byte
	// Keepalive is what keeps a silent stream alive (docs/spec.md §16).
	Keepalive() []byte
}

// Emitter is the client of a streamed turn.
type Emitter interface {
	// Emit writes one event: data (a chat.completion.chunk, a Responses or Messages event) under
	// the event name event ("" for none).
	Emit(event string, data []byte) error
	// Flush sends what was written. The stream dialects call it whenever the turn is about to
	// wait (for the upstream, or for tools), so every event leaves as soon as it is ready, and events that
	// arrived together leave together.
	Flush() error
}

// jsonAnswer is what a JSON dialect keeps for its client: the last round's body, as it came,
// and header, and the client's body once finish set it.
type jsonAnswer struct {
	raw, body []byte
	header    http.Header
}

// post sends a round's body upstream and keeps its answer's body and header.
func (a *jsonAnswer) post(ctx context.Context, up Upstream, body Payload) ([]byte, error) {
	raw, header, err := postJSON(ctx, up, body)
	if err != nil {
		return nil, err
	}
	a.raw, a.header = raw, header
	return raw, nil
}

func (a *jsonAnswer) pause() error { return nil }

// Answer is the client's body, and the last round's upstream header.
func (a *jsonAnswer) Answer() ([]byte, http.Header) { return a.body, a.header }

// streamOut is a stream dialect's client: it writes events to out and flushes only when it
// wrote something.
type streamOut struct {
	out   Emitter
	dirty bool // written, not flushed
	// partial: the client got part of the round under way, so a retry would repeat it.
	partial bool
}

// attempt runs stream, one attempt at a round; its error is wrapped in noRetry once part of the
// round reached the client.
func (s *streamOut) attempt(stream func() error) error {
	s.partial = false
	if err := stream(); err != nil {
		if s.partial {
			return noRetry{err}
		}
		return err
	}
	return nil
}

// sendEvent writes one event of the round.
func (s *streamOut) sendEvent(name string, data []byte) error {
	s.dirty, s.partial = true, true
	return s.out.Emit(name, data)
}

func (s *streamOut) flush() error {
	if !s.dirty {
		return nil
	}
	s.dirty = false
	return s.out.Flush()
}

func (s *streamOut) pause() error {
	s.dirty = true // the Emitter learns that the stream now waits for the proxy's tools
	return s.flush()
}

// Metrics count what the loop does; the HTTP edge's Prometheus metrics implement it.
type Metrics interface {
	// ToolCall counts a workspace call of tool name: ok or refused, with the locked items it
	// left alone, and what became of its write when its turn read untrusted content (untrusted:
	// tools.Result.Untrusted, "" for none).
	ToolCall(name string, ok bool, lockedSkips int, untrusted string)
	// ToolRounds records a turn's rounds that ran workspace calls.
	ToolRounds(n int)
	// ToolRoundsExhausted counts a turn whose tool rounds reached the bound (MaxToolRounds): its
	// last upstream call goes without the workspace tools (docs/spec.md §6).
	ToolRoundsExhausted()
	// Tokens counts the tokens one round's upstream reported, for the turn's model (the
	// request's) and client ("" without client keys).
	Tokens(model, client string, u workspace.Usage)
	// UpstreamRetry counts a round sent again after the turn's tools ran.
	UpstreamRetry()
}

// toolCall is one tool call of a reply.
type toolCall struct {
	ID        string
	Name      string
	Arguments string
	Length    int             // the arguments' length when Arguments holds only their start (tools.Call.Length)
	Client    bool            // one of the client's tools: the client runs it
	Raw       json.RawMessage // as the upstream sent it (non-streamed replies), or as the proxy made it
	// shown: a streamed client call whose deltas the client already got.
	shown bool
	// Parts are the workspace calls of a parallel wrapper run as one call (its result lists
	// theirs), for wire formats that send one output per call the model made.
	Parts []toolCall
}

var keepaliveComment = []byte(": keepalive\n\n")
