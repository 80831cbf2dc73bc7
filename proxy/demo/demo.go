// Package demo is a small deterministic model that speaks the OpenAI chat completions and
// Responses wire formats, Anthropic's Messages API and the Gemini API, streamed and not, so
// wsproxy can be tried without an API key (UPSTREAM_BASE_URL=demo), from Claude Code and Gemini
// CLI too. It turns plain sentences into workspace tool calls:
//
//	"I prefer short paragraphs."        add_preferences (soft)
//	"It must be formal."                add_preferences (hard)
//	"My goal is a review of soil carbon." set_objective
//	"Forget the paragraphs one."        remove_preferences (the index read from the block)
//	"What are my preferences?"          list_preferences
//
// and, once the proxy has run them, answers from their results. Every answer says it comes
// from the demo.
package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/wire"
)

// Prefix starts every answer.
const Prefix = "[wsproxy demo model] "

// ModelName is the model the demo reports.
const ModelName = "wsproxy-demo"

// Handler serves /v1/chat/completions, /v1/responses, /v1/messages (and its count_tokens),
// the Gemini API's /v1beta/models/{model}:generateContent, :streamGenerateContent and
// :countTokens, and /v1/models. Any other method or path gets the error its provider answers
// with, in that provider's shape: 405 with Allow for a wrong method, else 404.
func Handler() http.Handler {
	d := &model{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", d.chat)
	mux.HandleFunc("POST /v1/responses", d.responses)
	mux.HandleFunc("POST /v1/messages", d.messages)
	mux.HandleFunc("POST /v1/messages/count_tokens", d.countTokens)
	mux.HandleFunc("POST /v1beta/models/{call}", d.gemini)
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","created":0,"owned_by":"wsproxy"}]}`, ModelName)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { notServed(mux, w, r) })
	return mux
}

// notServed answers a request the demo has no route for as the provider whose API the path is
// answers it: 405 with Allow when the path takes another method, else 404, in that provider's
// JSON shape (Anthropic's on the Messages API, Google's on the Gemini API, else OpenAI's). The
// demo imitates the providers as any upstream does, knowing nothing of wsproxy's insides.
func notServed(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	status, code, message := http.StatusNotFound, "not_found", "the demo model has no route for "+r.Method+" "+r.URL.Path
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); m != r.Method && strings.HasPrefix(pattern, m+" ") {
			status, code, message = http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" is not allowed on "+r.URL.Path+" (allowed: "+m+")"
			w.Header().Set("Allow", m)
		}
	}
	var body []byte
	switch path := r.URL.Path; {
	case path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/"):
		kind := "invalid_request_error"
		if status == http.StatusNotFound {
			kind = "not_found_error"
		}
		body = wire.MessagesError(kind, message)
	case strings.HasPrefix(path, "/v1beta/"):
		googleStatus := "INVALID_ARGUMENT"
		if status == http.StatusNotFound {
			googleStatus = "NOT_FOUND"
		}
		body = wire.GeminiError(status, googleStatus, message)
	default:
		body = wire.OpenAIError(message, "invalid_request_error", "", code)
	}
	wire.WriteJSON(w, status, body)
}

type model struct{ n atomic.Int64 }

type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
}

type request struct {
	Messages []message `json:"messages"`
	Tools    []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Stream        bool `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// text is a message's content as text.
func (m message) text() string { return ContentText(m.Content) }

// clientText is what the client wrote in a message, without what wsproxy appended: from a
// string, as ClientText reads it; from an array of parts, the parts but the one holding the
// block.
func (m message) clientText() string {
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) != nil {
		return ClientText(m.text())
	}
	var b strings.Builder
	for _, p := range parts {
		if !strings.Contains(p.Text, "<workspace>") {
			b.WriteString(p.Text)
			b.WriteString("\n")
		}
	}
	return b.String()
}

// ContentText is a message's content as text: the string, or the texts of its parts, each
// followed by a line break.
func ContentText(content json.RawMessage) string {
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(content, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
		b.WriteString("\n")
	}
	return b.String()
}

// call is a tool call the demo makes.
type call struct {
	ID, Name, Arguments string
}

// reply is what the demo answers: content, or tool calls.
type reply struct {
	content string
	calls   []call
}

func (d *model) chat(w http.ResponseWriter, r *http.Request) {
	var req request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		wire.WriteJSON(w, http.StatusBadRequest, wire.OpenAIError("invalid JSON: "+err.Error(), "invalid_request_error", "", ""))
		return
	}
	rp := d.think(req)
	h := wire.ChatHead{ID: "chatcmpl-demo" + strconv.FormatInt(d.n.Add(1), 10), Created: time.Now().Unix(), Model: ModelName,
		StreamUsage: req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage}
	prompt, completion := tokens(req, rp)
	u := wire.ChatUsage{Prompt: prompt, Completion: completion, Cached: -1}
	calls := make([]wire.ChatCall, len(rp.calls))
	for i, c := range rp.calls {
		calls[i] = wire.ChatCall(c)
	}
	if req.Stream {
		stream(w, h, rp.content, calls, u)
		return
	}
	wire.WriteJSON(w, http.StatusOK, h.Completion(rp.content, calls, u))
}

// tokens are the demo's token counts of a request and its reply: words.
func tokens(req request, rp reply) (prompt, completion int) {
	for _, m := range req.Messages {
		prompt += len(strings.Fields(m.text()))
	}
	completion = len(strings.Fields(rp.content))
	for _, c := range rp.calls {
		completion += len(strings.Fields(c.Arguments))
	}
	return prompt, completion
}

// stream sends the reply as OpenAI does: a role chunk, content word by word or each tool call
// with its arguments in pieces (of about 12 bytes, whole characters), a finish chunk, the usage
// chunk when asked, [DONE].
func stream(w http.ResponseWriter, h wire.ChatHead, content string, calls []wire.ChatCall, u wire.ChatUsage) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	send := func(chunk []byte) {
		_, _ = w.Write(wire.ChatEvent(chunk))
		_ = rc.Flush()
	}
	send(h.Chunk(wire.ChatRoleDelta(len(calls) > 0), ""))
	for i, word := range strings.SplitAfter(content, " ") {
		if word != "" {
			send(h.Chunk(wire.ChatTextDelta(word), ""))
			if i%8 == 7 {
				time.Sleep(5 * time.Millisecond) // a little of a real model's pace
			}
		}
	}
	for i, c := range calls {
		send(h.Chunk(wire.ChatCallDelta(i, c.ID, c.Name), ""))
		for a := c.Arguments; a != ""; {
			n := min(len(a), 12)
			for n < len(a) && !utf8.RuneStart(a[n]) {
				n++
			}
			send(h.Chunk(wire.ChatArgumentsDelta(i, a[:n]), ""))
			a = a[n:]
		}
	}
	send(h.Chunk([]byte(`{}`), wire.ChatFinish(len(calls))))
	if h.StreamUsage {
		send(h.UsageChunk(u))
	}
	_, _ = io.WriteString(w, wire.ChatDone)
	_ = rc.Flush()
}

var (
	sentenceEnd  = regexp.MustCompile(`[.!?;\n]+`)
	prefersRe    = regexp.MustCompile(`(?i)^(?:i (?:would |'d )?(?:prefer|like|want)|i'd rather|please use|use)\s+(.+)$`)
	mustRe       = regexp.MustCompile(`(?i)^(?:it|this|that|the \w+|everything)?\s*(?:must|has to|needs to|should always)\s+(?:be\s+)?(.+)$`)
	goalRe       = regexp.MustCompile(`(?i)^(?:my (?:goal|objective|aim) is(?: to)?|i(?:'m| am) (?:trying|working) (?:to|on)|help me(?: to)?)\s+(.+)$`)
	forgetRe     = regexp.MustCompile(`(?i)^(?:forget|drop|remove|delete) (?:the |my )?(.+?)(?: one| preference| rule)?$`)
	listRe       = regexp.MustCompile(`(?i)(what are my preferences|list (?:my )?preferences|show (?:me )?(?:my )?(?:preferences|workspace))`)
	blockLineRe  = regexp.MustCompile(`(?m)^#(\d+) \[(hard|soft)\] (.+?)(?: — .*?)?(?: \(locked\))?$`)
	objectiveRe  = regexp.MustCompile(`(?m)^Objective: (.*)$`)
	workspaceRe  = regexp.MustCompile(`(?s)<workspace>.*?</workspace>`)
	toolEnvelope = regexp.MustCompile(`^\{"ok":`)
)

// think decides the reply to a request.
func (d *model) think(req request) reply {
	offered := map[string]bool{}
	for _, t := range req.Tools {
		offered[t.Function.Name] = true
	}
	// The workspace block: the latest one of the request (wsproxy appends it to the last user
	// or tool message, or to the system prompt).
	block := ""
	for i := len(req.Messages) - 1; i >= 0 && block == ""; i-- {
		block = workspaceRe.FindString(req.Messages[i].text())
	}
	last := len(req.Messages) - 1
	if last >= 0 && req.Messages[last].Role == "tool" {
		return reply{content: Prefix + summarize(req.Messages)}
	}
	userText := ""
	for i := last; i >= 0; i-- {
		if req.Messages[i].Role == "user" {
			userText = req.Messages[i].clientText()
			break
		}
	}
	var calls []call
	add := func(name string, args map[string]any) {
		if !offered[name] {
			return
		}
		b, _ := json.Marshal(args)
		calls = append(calls, call{ID: fmt.Sprintf("call_demo_%d_%d", d.n.Load(), len(calls)), Name: name, Arguments: string(b)})
	}
	var items []map[string]any
	for _, s := range sentenceEnd.Split(userText, -1) {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case listRe.MatchString(s):
			add("list_preferences", map[string]any{"action_and_reasoning": "The user asked to see their preferences."})
		case goalRe.MatchString(s):
			add("set_objective", map[string]any{"text": capitalize(goalRe.FindStringSubmatch(s)[1]),
				"action_and_reasoning": "The user stated their goal."})
		case mustRe.MatchString(s):
			items = append(items, map[string]any{"title": capitalize(mustRe.FindStringSubmatch(s)[1]), "kind": "hard"})
		case prefersRe.MatchString(s):
			items = append(items, map[string]any{"title": capitalize(prefersRe.FindStringSubmatch(s)[1]), "kind": "soft"})
		case forgetRe.MatchString(s):
			what := strings.ToLower(forgetRe.FindStringSubmatch(s)[1])
			if i := findIndex(block, what); i > 0 {
				add("remove_preferences", map[string]any{"indices": []int{i},
					"action_and_reasoning": "The user asked to drop the " + what + " preference."})
			}
		}
	}
	if len(items) > 0 {
		add("add_preferences", map[string]any{"items": items, "action_and_reasoning": "The user stated preferences to record."})
	}
	if len(calls) > 0 {
		return reply{calls: calls}
	}
	return reply{content: Prefix + describe(block)}
}

// ClientText is a message's text without what wsproxy appended to it (the instruction text and
// the block, placement tail): what the client wrote. Fake models of the tests use it too.
func ClientText(s string) string {
	i := strings.Index(s, "<workspace>")
	if i < 0 {
		return s
	}
	s = strings.TrimRight(s[:i], "\n")
	if j := strings.LastIndex(s, "\n\n"); j >= 0 {
		return s[:j]
	}
	return ""
}

// findIndex finds the preference of the block whose title mentions what.
func findIndex(block, what string) int {
	for _, m := range blockLineRe.FindAllStringSubmatch(block, -1) {
		if strings.Contains(strings.ToLower(m[3]), what) {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return 0
}

// summarize answers from the results of the tools the proxy ran this turn, saying what they
// did: "Workspace updated" when one of them changed something, "Your workspace" for a listing,
// "Nothing changed yet" for a proposal the user will review, else "Nothing changed" (a
// duplicate, a locked item, an error).
func summarize(msgs []message) string {
	var results []string
	changed, listed, proposed := false, 0, false
	for i := len(msgs) - 1; i >= 0 && msgs[i].Role == "tool"; i-- {
		text := msgs[i].text()
		if !toolEnvelope.MatchString(text) {
			continue
		}
		var env struct {
			OK     bool   `json:"ok"`
			Result string `json:"result"`
			Error  string `json:"error"`
		}
		_ = json.Unmarshal([]byte(text), &env)
		if !env.OK {
			results = append([]string{"error: " + env.Error}, results...)
			continue
		}
		results = append([]string{env.Result}, results...)
		switch {
		case proposedRe.MatchString(env.Result):
			proposed = true
		case listedRe.MatchString(env.Result):
			listed++
		case changedRe.MatchString(env.Result):
			changed = true
		}
	}
	if len(results) == 0 {
		return "Done."
	}
	headline := "Nothing changed"
	switch {
	case changed:
		headline = "Workspace updated"
	case listed == len(results):
		headline = "Your workspace"
	case proposed:
		headline = "Nothing changed yet"
	}
	return headline + " — " + strings.Join(results, "\n")
}

// The results of the tools (tools/plan.go, tools/agent.go), as the demo tells them apart.
var (
	changedRe  = regexp.MustCompile(`^objective set: |^recorded [1-9]|(?:^|; )(?:updated|removed) #`)
	listedRe   = regexp.MustCompile(`^(?:#\d+ \[|no preferences recorded yet)`)
	proposedRe = regexp.MustCompile(`^(?:proposed; |nothing to propose; )`)
)

// blockCounts are what a block holds: the thread's own preferences, and the inherited ones by
// scope, nearest first, unconfirmed ones included (docs/spec.md §17, §19).
type blockCounts struct {
	own       int
	scopes    []string
	inherited map[string]int
}

var (
	scopeHeadingRe  = regexp.MustCompile(`^From (\S+) \(the user's; `)
	inheritedLineRe = regexp.MustCompile(`^- \[(?:hard|soft)\] `)
	unconfirmedRe   = regexp.MustCompile(` \(from (\S+)\)$`)
)

// countBlock reads a whole block: own items (`#N [kind] …`), and inherited ones (`- [kind] …`)
// under their scope's heading, or, among the unconfirmed, marked `(from scope)`.
func countBlock(block string) blockCounts {
	c := blockCounts{inherited: map[string]int{}}
	scope := ""
	for line := range strings.SplitSeq(block, "\n") {
		switch {
		case blockLineRe.MatchString(line):
			c.own++
		case scopeHeadingRe.MatchString(line):
			scope = scopeHeadingRe.FindStringSubmatch(line)[1]
		case strings.HasPrefix(line, "Unconfirmed, "):
			scope = ""
		case inheritedLineRe.MatchString(line):
			s := scope
			if m := unconfirmedRe.FindStringSubmatch(line); m != nil {
				s = m[1]
			}
			if s == "" {
				continue
			}
			if c.inherited[s] == 0 {
				c.scopes = append(c.scopes, s)
			}
			c.inherited[s]++
		}
	}
	return c
}

// describe answers when there is nothing to record: what the workspace holds, inherited items
// included. A request without a block named no thread, or was forwarded without its workspace
// (WORKSPACE_UNAVAILABLE=bypass): the demo cannot tell which, and says both.
func describe(block string) string {
	if block == "" {
		return "There is no workspace on this request: either it names no thread (name one with the " +
			"X-Thread-Id header), or wsproxy could not read its workspace and forwarded it without " +
			"(WORKSPACE_UNAVAILABLE=bypass; the answer's X-Workspace header says unavailable)."
	}
	objective := "(none yet)"
	if m := objectiveRe.FindStringSubmatch(block); m != nil {
		objective = m[1]
	}
	c := countBlock(block)
	held := fmt.Sprintf("You have %d preference(s) recorded.", c.own)
	if len(c.scopes) > 0 {
		total, parts := 0, make([]string, len(c.scopes))
		for i, s := range c.scopes {
			total += c.inherited[s]
			parts[i] = fmt.Sprintf("%s: %d", s, c.inherited[s])
		}
		held = fmt.Sprintf("You have %d preference(s) recorded in this thread and %d inherited (%s).",
			c.own, total, strings.Join(parts, ", "))
	}
	return fmt.Sprintf("I am not a real model. Your objective: %s. %s "+
		"Try: \"I prefer short paragraphs.\", \"It must be formal.\", \"My goal is …\", \"Forget the … one.\", "+
		"\"What are my preferences?\"", objective, held)
}

func capitalize(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
