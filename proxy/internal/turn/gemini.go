package turn

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// GeminiRequest is a client's Gemini API request (generateContent, streamGenerateContent) on a
// thread turn (docs/spec.md §18), kept as raw JSON like the other requests: the proxy touches
// `contents`, `tools` (the five as functionDeclarations after the client's), with placement
// system `systemInstruction`, and `toolConfig` where the client's functionCallingConfig needs
// it (see toolConfigFor); every other member (`generationConfig`, `safetySettings`,
// `cachedContent`, members the proxy does not know) reaches the upstream with its exact bytes.
// The model and whether the turn streams come from the path, not the body.
type GeminiRequest struct {
	topLevel
	model string
	// list is the client's contents array, and where its elements lie.
	list json.RawMessage
	elements
	// contents is the conversation sent upstream, as runs of raw elements: the client's
	// contents with the workspace injected, then each tool round's two contents.
	contents []Payload
	// tools is the client's tools array's elements (nil for none); decls where the last
	// functionDeclarations array among them closes (its ']', an offset in tools; -1 for none),
	// emptyDecls whether that array is empty; names the client's functions, in order.
	tools      json.RawMessage
	decls      int
	emptyDecls bool
	names      []string
	nameSet    map[string]bool
	// system is the systemInstruction the rounds send in place of the client's (nil: the
	// client's).
	system json.RawMessage
	// generated are the ids the proxy made for workspace calls that came without one: their
	// functionResponse parts carry none either.
	generated map[string]bool
}

// ParseGeminiRequest parses and checks a Gemini thread turn's body (docs/spec.md §18, §10) for
// model (the path's) and a stream when streamed (the path's method). A request asking for
// structured output is left alone (KindSide): the Gemini API refuses function calling beside
// it, and Gemini CLI's routing classifier is one.
func ParseGeminiRequest(body []byte, model string, streamed bool) (*GeminiRequest, error) {
	return parseGemini(body, model, streamed, true)
}

// parseGemini parses a Gemini request; side: a request asking for structured output is a side
// request.
func parseGemini(body []byte, model string, streamed, side bool) (*GeminiRequest, error) {
	tl, err := parseTop(body)
	if err != nil {
		return nil, err
	}
	tl.streamed = streamed
	c := &GeminiRequest{topLevel: tl, model: model, decls: -1}
	top := tl.fields
	if k := kindOfGemini(top); side && k != KindTurn {
		c.kind = k // structured output (kind.go): the Gemini API refuses function calling beside it
		return c, nil
	}
	c.list = top.Get("contents")
	if isNull(c.list) {
		return nil, apierr.BadRequest("missing_required_parameter", "contents", "contents is not specified")
	}
	if c.elements, err = objects(c.list, "contents", "contents must be an array"); err != nil {
		return nil, err
	}
	if c.n > 0 {
		c.contents = []Payload{{c.list[c.first.start:c.last.end]}}
	}
	if t := top.Get("tools"); !isNull(t) {
		if err := c.checkTools(t); err != nil {
			return nil, err
		}
	}
	if gc, err := rawjson.Parse(field(&top, "generationConfig")); err == nil {
		if n, ok := number(field(&gc, "candidateCount")); ok && n > 1 {
			return nil, apierr.BadRequest("unsupported_parameter", "generationConfig.candidateCount",
				"candidateCount greater than 1 is not supported on a thread turn")
		}
	}
	return c, nil
}

// checkTools checks the client's tools: each an object, no function named like a workspace
// tool; it keeps where the last functionDeclarations array closes, and the functions' names.
func (c *GeminiRequest) checkTools(list json.RawMessage) error {
	first, last := -1, 0
	c.nameSet = map[string]bool{}
	err := rawjson.Each(list, func(i, start, end int) error {
		tool := list[start:end]
		if tool[0] != '{' {
			return apierr.BadRequest("invalid_type", "tools["+strconv.Itoa(i)+"]", "tools[%d] must be an object", i)
		}
		if first < 0 {
			first = start
		}
		last = end
		for _, key := range []string{"functionDeclarations", "function_declarations"} {
			vs, ve, ok := rawjson.Member(tool, key)
			if !ok || tool[vs] != '[' {
				continue
			}
			decls := tool[vs:ve]
			if err := rawjson.Each(decls, func(j, ds, de int) error {
				o, err := rawjson.Parse(decls[ds:de])
				if err != nil {
					return apierr.BadRequest("invalid_type", "tools", "tools[%d].%s[%d] must be an object", i, key, j)
				}
				name := text(o.Get("name"))
				if tools.IsTool(name) {
					return apierr.BadRequest("reserved_tool_name", "tools",
						"the tool name %q is reserved by the workspace proxy; rename the client tool", name)
				}
				if name != "" && !c.nameSet[name] {
					c.nameSet[name] = true
					c.names = append(c.names, name)
				}
				return nil
			}); err != nil {
				return err
			}
			c.decls = start + ve - 1 // relative to list for now
			c.emptyDecls = len(bytes.TrimSpace(decls[1:len(decls)-1])) == 0
		}
		return nil
	})
	if err != nil {
		if _, ok := err.(*apierr.Error); ok {
			return err
		}
		return apierr.BadRequest("invalid_type", "tools", "tools must be an array")
	}
	if first >= 0 {
		c.tools = list[first:last]
		if c.decls >= 0 {
			c.decls -= first
		}
	}
	return nil
}

// Model is the model the path names.
func (c *GeminiRequest) Model() string { return c.model }

// IsClientTool reports whether name is one of the client's functions.
func (c *GeminiRequest) IsClientTool(name string) bool { return c.nameSet[name] }

// Prepare puts the workspace text where placement says. The Gemini API has no prompt cache key
// and sends its usage in every stream: nothing else is added.
func (c *GeminiRequest) Prepare(text string, placement Placement, _ string) {
	c.InjectWorkspace(text, placement)
}

// JSON is the dialect of a generateContent turn.
func (c *GeminiRequest) JSON(t *Turn) JSONDialect { return &geminiJSON{req: c, up: t.Upstream} }

// Stream is the dialect of a streamGenerateContent turn.
func (c *GeminiRequest) Stream(t *Turn, out Emitter) StreamDialect {
	return &geminiSSE{req: c, up: t.Upstream, streamOut: streamOut{out: out}}
}

// isGeminiTurn reports a content of the client's turn: a user content (the role defaults to
// user).
func isGeminiTurn(content []byte) bool {
	start, end, ok := rawjson.Member(content, "role")
	if !ok {
		return true
	}
	role, _ := rawjson.Unquote(content[start:end])
	return role == "user" || role == ""
}

// InjectWorkspace puts text (the instructions and the block) where the placement says
// (docs/spec.md §18). With PlaceTail it becomes a new last text part of the last content when
// that is a user content (after its text, inline data or functionResponse parts). Otherwise,
// and with PlaceSystem, it becomes a new last part of systemInstruction. Either way the workspace
// tags in the text and the tools' outputs (functionResponse) of the client's latest turn are
// neutralised.
func (c *GeminiRequest) InjectWorkspace(text string, placement Placement) {
	if placement == PlaceTail && c.n > 0 && isGeminiTurn(c.list[c.last.start:c.last.end]) {
		c.contents = c.contents[:0]
		if c.n > 1 {
			c.contents = append(c.contents, Payload{c.list[c.first.start:c.beforeLast]})
		}
		c.contents = append(c.contents, appendGeminiPart(c.list[c.last.start:c.last.end], text))
		return
	}
	if c.n > 0 {
		c.contents = c.neutralizedTurn()
	}
	part := geminiTextPart(text)
	switch sys := field(&c.fields, "systemInstruction"); {
	case isNull(sys):
		o := rawjson.Object{}
		o.Set("parts", rawjson.AppendArray(nil, []json.RawMessage{part}))
		c.system = o.Bytes()
	case sys[0] == '"':
		o := rawjson.Object{}
		o.Set("parts", rawjson.AppendArray(nil, []json.RawMessage{geminiRawTextPart(sys), part}))
		c.system = o.Bytes()
	case sys[0] == '{':
		o, err := rawjson.Parse(sys)
		if err != nil {
			return
		}
		parts, err := rawjson.Split(o.Get("parts"))
		if err != nil {
			parts = nil
		}
		o.Set("parts", rawjson.AppendArray(nil, append(parts, part)))
		c.system = o.Bytes()
	}
}

// neutralizedTurn is the client's contents as runs, with the workspace tags in the text and
// functionResponse parts of its latest turn (its last user content and every content after it) neutralised.
func (c *GeminiRequest) neutralizedTurn() []Payload {
	list := c.list
	if !mayHoldTag(list[c.first.start:c.last.end]) {
		return []Payload{{list[c.first.start:c.last.end]}}
	}
	turn, before, prev := -1, -1, -1
	_ = rawjson.Each(list, func(_, start, end int) error {
		if isGeminiTurn(list[start:end]) {
			turn, before = start, prev
		}
		prev = end
		return nil
	})
	if turn < 0 {
		return []Payload{{list[c.first.start:c.last.end]}}
	}
	var runs []Payload
	if before >= 0 {
		runs = append(runs, Payload{list[c.first.start:before]})
	}
	_ = rawjson.Each(list, func(_, start, end int) error {
		if start >= turn {
			runs = append(runs, Payload{neutralizedGeminiContent(list[start:end])})
		}
		return nil
	})
	return runs
}

// neutralizedGeminiContent is a content with the workspace tags of its parts neutralised
// (neutralizedGeminiParts); content itself when it holds none.
func neutralizedGeminiContent(content []byte) []byte {
	if !mayHoldTag(content) {
		return content
	}
	start, end, ok := rawjson.Member(content, "parts")
	if !ok || content[start] != '[' {
		return content
	}
	n := neutralizedGeminiParts(content[start:end])
	if string(n) == string(content[start:end]) {
		return content
	}
	return append(append(append([]byte(nil), content[:start]...), n...), content[end:]...)
}

// neutralizedGeminiParts is a parts array with the workspace tags neutralised in its text parts
// and in every string of its functionResponse parts (a tool's output, which may quote anything);
// parts itself when it holds none.
func neutralizedGeminiParts(parts json.RawMessage) json.RawMessage {
	if !mayHoldTag(parts) {
		return parts
	}
	list, err := rawjson.Split(parts)
	if err != nil {
		return parts
	}
	changed := false
	for i, p := range list {
		n := neutralizedPart(p)
		if o, err := rawjson.Parse(n); err == nil && !isNull(field(&o, "functionResponse")) {
			if fr := neutralizedStrings(field(&o, "functionResponse")); string(fr) != string(field(&o, "functionResponse")) {
				o.Set(spelling(&o, "functionResponse"), fr)
				n = o.Bytes()
			}
		}
		changed = changed || string(n) != string(p)
		list[i] = n
	}
	if !changed {
		return parts
	}
	return rawjson.AppendArray(nil, list)
}

// neutralizedStrings is a JSON value with the workspace tags of every string in it neutralised,
// members in their order; v itself when it holds none.
func neutralizedStrings(v json.RawMessage) json.RawMessage {
	if len(v) == 0 || !mayHoldTag(v) {
		return v
	}
	switch v[0] {
	case '"':
		return neutralized(v)
	case '{':
		o, err := rawjson.Parse(v)
		if err != nil {
			return v
		}
		for i := range o.Vals {
			o.Vals[i] = neutralizedStrings(o.Vals[i])
		}
		return o.Bytes()
	case '[':
		list, err := rawjson.Split(v)
		if err != nil {
			return v
		}
		for i := range list {
			list[i] = neutralizedStrings(list[i])
		}
		return rawjson.AppendArray(nil, list)
	}
	return v
}

// appendGeminiPart appends a text part of text to the parts of content (placement tail),
// keeping the content's own bytes but for the workspace tags in its text, neutralised.
func appendGeminiPart(content []byte, text string) Payload {
	part := geminiTextPart(text)
	start, end, ok := rawjson.Member(content, "parts")
	if !ok || content[start] != '[' { // missing or null: the block is the parts
		o, _ := rawjson.Parse(content)
		o.Set("parts", rawjson.AppendArray(nil, []json.RawMessage{part}))
		return Payload{o.Bytes()}
	}
	parts := neutralizedGeminiParts(content[start:end])
	open := parts[:len(parts)-1]
	var tail []byte
	if len(bytes.TrimSpace(open)) > 1 {
		tail = append(tail, ',')
	}
	tail = append(append(tail, part...), ']')
	return Payload{content[:start], open, tail, content[end:]}
}

func geminiTextPart(text string) json.RawMessage { return geminiRawTextPart(rawjson.String(text)) }

// geminiRawTextPart is a text part ({"text"}) whose text is the JSON string raw.
func geminiRawTextPart(raw json.RawMessage) json.RawMessage {
	o := rawjson.Object{}
	o.Set("text", raw)
	return o.Bytes()
}

// appendRound adds a tool round to the conversation: the model's content as the upstream sent
// it (thought parts and thoughtSignatures as they came) and a user content of one
// functionResponse part per workspace call, its id echoed when the call had one.
func (c *GeminiRequest) appendRound(model json.RawMessage, calls []toolCall, results []tools.Result) {
	c.contents = append(c.contents, Payload{model})
	parts := make([]json.RawMessage, len(calls))
	for i, call := range calls {
		fr := rawjson.Object{}
		if !c.generated[call.ID] {
			fr.Set("id", rawjson.String(call.ID))
		}
		fr.Set("name", rawjson.String(call.Name))
		fr.Set("response", geminiResponse(results[i].Content))
		p := rawjson.Object{}
		p.Set(spelling(&p, "functionResponse"), fr.Bytes())
		parts[i] = p.Bytes()
	}
	user := rawjson.Object{}
	user.Set("role", rawjson.String("user"))
	user.Set("parts", rawjson.AppendArray(nil, parts))
	c.contents = append(c.contents, Payload{user.Bytes()})
}

// geminiResponse is a functionResponse's response: the result's envelope, a JSON object (its
// error member tells a refused call), or the text under "output" should it be anything else.
func geminiResponse(content string) json.RawMessage {
	b := bytes.TrimSpace([]byte(content))
	if len(b) > 0 && b[0] == '{' && rawjson.Valid(b) {
		return b
	}
	o := rawjson.Object{}
	o.Set("output", rawjson.String(content))
	return o.Bytes()
}

// Body encodes the request for one upstream round: the conversation so far, the client's tools
// with the five after its functions when withWorkspaceTools, the system the placement made and
// the tool config the client's means (toolConfigFor). A last round of a client that declared
// no function still declares the five, with function calling off: the conversation holds their
// calls.
func (c *GeminiRequest) Body(withWorkspaceTools bool) Payload {
	var runs []Payload
	var config json.RawMessage
	switch {
	case withWorkspaceTools && c.decls >= 0:
		sep := []byte(",")
		if c.emptyDecls {
			sep = nil
		}
		runs = []Payload{{c.tools[:c.decls], append(sep, geminiWorkspaceDecls...), c.tools[c.decls:]}}
		config = c.toolConfigFor(false)
	case withWorkspaceTools || c.decls < 0:
		if c.tools != nil {
			runs = append(runs, Payload{c.tools})
		}
		runs = append(runs, Payload{geminiWorkspaceTool})
		config = c.toolConfigFor(!withWorkspaceTools)
	default:
		runs = []Payload{{c.tools}}
	}
	return roundBody(c.fields, "contents", c.contents, runs, replacement{spelling(&c.fields, "systemInstruction"), c.system},
		replacement{spelling(&c.fields, "toolConfig"), config})
}

// toolConfigFor is the toolConfig a round sends in place of the client's (nil: the client's).
// off: function calling off (mode NONE), the last round of a client without functions.
// Otherwise the client's config keeps its meaning with the five declared: mode NONE stays NONE
// (the client wants no calls this turn: the workspace's neither), allowedFunctionNames stay as
// listed (the model calls one of those), and mode ANY without names — a call of a function
// the client declared — gets the client's functions as its allowedFunctionNames, so that the
// call the client forces is its own, not a workspace call every round.
func (c *GeminiRequest) toolConfigFor(off bool) json.RawMessage {
	tc, err := rawjson.Parse(field(&c.fields, "toolConfig"))
	if err != nil {
		if !isNull(field(&c.fields, "toolConfig")) {
			return nil // not an object: the upstream's to refuse as it was
		}
		tc = rawjson.Object{}
	}
	fc, err := rawjson.Parse(field(&tc, "functionCallingConfig"))
	if err != nil {
		fc = rawjson.Object{}
	}
	switch mode := strings.ToUpper(text(fc.Get("mode"))); {
	case off:
		fc = rawjson.Object{}
		fc.Set("mode", rawjson.String("NONE"))
	case mode == "ANY" && isNull(field(&fc, "allowedFunctionNames")) && len(c.names) > 0:
		names := make([]json.RawMessage, len(c.names))
		for i, n := range c.names {
			names[i] = rawjson.String(n)
		}
		name := "allowedFunctionNames"
		if spelling(&tc, "functionCallingConfig") != "functionCallingConfig" {
			name = protoName(name) // the client writes this object's members by their proto names
		}
		fc.Set(name, rawjson.AppendArray(nil, names))
	default:
		return nil
	}
	tc.Set(spelling(&tc, "functionCallingConfig"), fc.Bytes())
	return tc.Bytes()
}

// geminiCount is a countTokens request with a thread (docs/spec.md §18): its
// generateContentRequest (or its contents, made into one) rewritten as the turn's first round
// would be.
type geminiCount struct {
	outer rawjson.Object
	inner *GeminiRequest
}

// ParseGeminiCount parses a countTokens body for model: {"contents"} or
// {"generateContentRequest": {"model", "contents", "tools", "systemInstruction", …}}.
func ParseGeminiCount(body []byte, model string) (Counted, error) {
	tl, err := parseTop(body)
	if err != nil {
		return nil, err
	}
	inner := field(&tl.fields, "generateContentRequest")
	if isNull(inner) {
		o := rawjson.Object{}
		o.Set("model", rawjson.String("models/"+model))
		o.Set("contents", tl.fields.Get("contents"))
		inner = o.Bytes()
	}
	req, err := parseGemini(inner, model, false, false)
	if err != nil {
		return nil, err
	}
	if !req.fields.Has("model") {
		req.fields.Set("model", rawjson.String("models/"+model))
	}
	return &geminiCount{outer: tl.fields, inner: req}, nil
}

// CountBody is the countTokens body with its request rewritten as the turn's first round would
// be: the workspace in place and the five tools after the client's.
func (g *geminiCount) CountBody(text string, placement Placement) Payload {
	g.inner.InjectWorkspace(text, placement)
	inner := g.inner.Body(true)
	w := payloadWriter{buf: make([]byte, 0, 256)}
	w.byte('{')
	for i, k := range g.outer.Keys {
		if k == "contents" || k == "generateContentRequest" || k == "generate_content_request" {
			continue
		}
		w.member(k)
		w.raw(g.outer.Vals[i])
	}
	w.member(spelling(&g.outer, "generateContentRequest"))
	w.flush()
	w.pieces = append(w.pieces, inner...)
	w.byte('}')
	return w.payload()
}

// geminiSchema is a JSON schema in the Gemini API's OpenAPI subset: type in capitals, and the
// members it reads (properties, required, items, enum, description, nullable, format and the
// bounds).
func geminiSchema(raw json.RawMessage) json.RawMessage {
	in, err := rawjson.Parse(raw)
	if err != nil {
		return raw
	}
	out := rawjson.Object{}
	for i, k := range in.Keys {
		v := in.Vals[i]
		switch k {
		case "type":
			out.Set(k, rawjson.String(strings.ToUpper(text(v))))
		case "properties":
			props, err := rawjson.Parse(v)
			if err != nil {
				continue
			}
			p := rawjson.Object{}
			for j, name := range props.Keys {
				p.Set(name, geminiSchema(props.Vals[j]))
			}
			out.Set(k, p.Bytes())
		case "items":
			out.Set(k, geminiSchema(v))
		case "required", "enum", "description", "nullable", "format", "minItems", "maxItems", "minimum", "maximum":
			out.Set(k, v)
		}
	}
	return out.Bytes()
}

// geminiWorkspaceDecls are the five tools as Gemini functionDeclarations ({name, description,
// parameters}), as one run of elements; geminiWorkspaceTool is them as a tool of their own.
var geminiWorkspaceDecls, geminiWorkspaceTool = func() (json.RawMessage, json.RawMessage) {
	list := make([]json.RawMessage, len(tools.All))
	for i, d := range tools.All {
		o := rawjson.Object{}
		o.Set("name", rawjson.String(d.Name))
		o.Set("description", rawjson.String(d.Description))
		o.Set("parameters", geminiSchema(d.Parameters))
		list[i] = o.Bytes()
	}
	tool := rawjson.Object{}
	tool.Set(spelling(&tool, "functionDeclarations"), rawjson.AppendArray(nil, list))
	return elementRun(list), tool.Bytes()
}()

// geminiTokens reads the Gemini API's usageMetadata: promptTokenCount (with
// toolUsePromptTokenCount, the prompt of its built-in tools' results, which it bills as input)
// as the prompt, cachedContentTokenCount its cached part, candidatesTokenCount and
// thoughtsTokenCount (the thinking, billed as output and not part of the candidates' count) as
// the completion. A stream's is cumulative: its last chunk's is the round's.
func geminiTokens(raw json.RawMessage) usage {
	u := usage{raw: raw}
	o, err := rawjson.Parse(raw)
	if err != nil {
		return u
	}
	u.tokens = workspace.Usage{
		PromptTokens:       workspace.AddTokens(tokenCount(o, spelling(&o, "promptTokenCount")), tokenCount(o, spelling(&o, "toolUsePromptTokenCount"))),
		CachedPromptTokens: tokenCount(o, spelling(&o, "cachedContentTokenCount")),
		CompletionTokens:   workspace.AddTokens(tokenCount(o, spelling(&o, "candidatesTokenCount")), tokenCount(o, spelling(&o, "thoughtsTokenCount"))),
	}
	return u
}

// GeminiError is the Gemini API's error body for an Error of the proxy (docs/spec.md §18):
// {"error":{"code","message","status"}}, Google's status name by the HTTP status.
func GeminiError(e *apierr.Error) []byte {
	var b struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	b.Error.Code = e.Status
	if b.Error.Code == 0 {
		b.Error.Code = http.StatusInternalServerError
	}
	b.Error.Message = e.Message
	b.Error.Status = geminiStatus(b.Error.Code)
	out, _ := rawjson.Marshal(b)
	return out
}

// geminiStatus is Google's status name (google.rpc.Code) of an HTTP status.
func geminiStatus(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "UNAUTHENTICATED"
	case status == http.StatusForbidden:
		return "PERMISSION_DENIED"
	case status == http.StatusNotFound:
		return "NOT_FOUND"
	case status == http.StatusConflict:
		return "ABORTED"
	case status == http.StatusTooManyRequests:
		return "RESOURCE_EXHAUSTED"
	case status == apierr.StatusClientClosedRequest:
		return "CANCELLED"
	case status == http.StatusNotImplemented:
		return "UNIMPLEMENTED"
	case status == http.StatusBadGateway || status == http.StatusServiceUnavailable:
		return "UNAVAILABLE"
	case status == http.StatusGatewayTimeout:
		return "DEADLINE_EXCEEDED"
	case status >= 500:
		return "INTERNAL"
	}
	return "INVALID_ARGUMENT"
}

// isGeminiError reports whether body is an error in Google's shape.
func isGeminiError(body []byte) bool {
	var b struct {
		Error json.RawMessage `json:"error"`
	}
	return json.Unmarshal(body, &b) == nil && len(b.Error) > 0 && b.Error[0] == '{'
}

// The Gemini API's JSON mapping accepts each member under its lowerCamelCase name and its proto
// name (snake_case, as Google's REST examples write them): the dialect reads both, and writes a
// member it replaces under the client's spelling, so that the upstream never gets one twice
// (docs/spec.md §18).

// protoName is the proto name of a lowerCamelCase member name.
func protoName(camel string) string {
	var b strings.Builder
	for _, r := range camel {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('_')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// spelling is the name o holds member camel under: its proto name when o holds that and not
// camel; camel otherwise.
func spelling(o *rawjson.Object, camel string) string {
	if o.Get(camel) == nil {
		if proto := protoName(camel); o.Get(proto) != nil {
			return proto
		}
	}
	return camel
}

// field is member camel of o, under either name (nil when absent).
func field(o *rawjson.Object, camel string) json.RawMessage {
	return o.Get(spelling(o, camel))
}

// number reads a JSON number, or a string holding one (the JSON mapping of Google's int64
// fields): 2, 2.0, 2e0 and "2" alike.
func number(v json.RawMessage) (float64, bool) {
	if s, ok := rawjson.Unquote(v); ok {
		v = json.RawMessage(s)
	}
	var n float64
	if json.Unmarshal(v, &n) != nil {
		return 0, false
	}
	return n, true
}
