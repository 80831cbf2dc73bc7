package turn

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// responseRound is one round's response object, as the upstream sent it (a non-streamed body,
// or the `response` of a stream's terminal event).
type responseRound struct {
	top    rawjson.Object
	id     string
	model  string
	status string
	stored bool
	items  []json.RawMessage // output, as it came
	calls  []toolCall        // the function calls and other calls the client runs, in order
	hidden []bool            // per item: a workspace call, never shown to the client
	// untrusted are the items of a server tool's (web_search_call, mcp_call …) or of a type
	// wsproxy does not know: what the model read that it did not write (docs/spec.md §19).
	untrusted []workspace.Part
}

// modelItemTypes are the output items the model writes itself: not untrusted content.
var modelItemTypes = map[string]bool{"message": true, "reasoning": true, "function_call": true, "compaction": true}

// clientCallTypes are the output items, other than function calls, that the client runs: a
// round with one of them ends the turn like a call of the client's function.
var clientCallTypes = map[string]bool{
	"custom_tool_call": true, "local_shell_call": true, "shell_call": true, "apply_patch_call": true,
	"computer_call": true, "mcp_approval_request": true,
}

// parseResponse reads a round's response object. Only its function calls are the proxy's to
// understand; an output item of any other type (or one that is not an object) is the client's
// to see, as it came, and an output that is not an array holds nothing the proxy runs.
func parseResponse(raw []byte, req *ResponsesRequest) (*responseRound, error) {
	top, err := rawjson.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: the response is not a JSON object", apierr.ErrUpstreamProtocol)
	}
	// Stored only when the response says so: a server that omits store may keep nothing, and a
	// round resent whole works on every server.
	rr := &responseRound{top: top, stored: string(top.Get("store")) == "true"}
	rr.id, rr.model, rr.status = text(top.Get("id")), text(top.Get("model")), text(top.Get("status"))
	if out := top.Get("output"); !isNull(out) {
		rr.items, _ = rawjson.Split(out)
	}
	rr.hidden = make([]bool, len(rr.items))
	for i, item := range rr.items {
		o, err := rawjson.Parse(item)
		if err != nil {
			continue
		}
		typ := text(o.Get("type"))
		switch {
		case typ == "function_call":
			c := responsesCall(o, req.IsClientTool)
			c.Raw = item
			rr.hidden[i] = !c.Client
			rr.calls = append(rr.calls, c)
		case clientCallTypes[typ]:
			rr.calls = append(rr.calls, toolCall{ID: text(o.Get("call_id")), Name: typ, Client: true, Raw: item})
		case !modelItemTypes[typ]:
			rr.untrusted = append(rr.untrusted, workspace.Part{Type: workspace.SourceServerTool, Tool: typ, CallID: text(o.Get("id"))})
		}
	}
	return rr, nil
}

// responsesCall is a function_call output item as the loop runs it: the workspace's call, the
// client's, or a parallel wrapper of workspace calls only, run as one call (Parts); a wrapper
// that also names the client's tools is the client's call, as the model made it (the upstream
// expects one output per call_id).
func responsesCall(item rawjson.Object, client func(string) bool) toolCall {
	c := toolCall{ID: text(item.Get("call_id")), Name: text(item.Get("name")), Arguments: arguments(item.Get("arguments"))}
	if c.ID == "" {
		c.ID = text(item.Get("id"))
	}
	if c.ID == "" {
		c.ID = newCallID()
	}
	c.Client = client(c.Name) // any other name is run as the workspace's, as in chat turns
	if parts, ok := wrapperCalls(c, client); ok {
		for n, p := range parts {
			if !tools.IsTool(p.name) {
				c.Client, c.Parts = true, nil
				break
			}
			c.Parts = append(c.Parts, toolCall{ID: c.ID + "_" + strconv.Itoa(n+1), Name: p.name, Arguments: p.args})
		}
	} else if isParallelWrapper(c.Name, client) {
		c.Client = true
	}
	return c
}

// toClient makes the function call at output index n the client's.
func (rr *responseRound) toClient(n int) {
	if n >= len(rr.items) || !rr.hidden[n] {
		return
	}
	rr.hidden[n] = false
	for i := range rr.calls {
		if &rr.calls[i].Raw[0] == &rr.items[n][0] {
			rr.calls[i].Client, rr.calls[i].Parts = true, nil
		}
	}
}

// workspaceCallIDs are the call_ids of the round's workspace calls.
func (rr *responseRound) workspaceCallIDs() []string {
	var ids []string
	for _, c := range rr.calls {
		if !c.Client {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// owed are the call_ids of the round's workspace calls when the upstream stored the round: a
// client continuing from it owes the upstream their outputs, which the proxy sends
// (docs/spec.md §12). An unstored round owes nothing: its client sends the items it saw, which
// hold none of them.
func (rr *responseRound) owed() []string {
	if !rr.stored {
		return nil
	}
	return rr.workspaceCallIDs()
}

// info is what the round says of itself, for traces.
func (rr *responseRound) info() roundInfo {
	info := roundInfo{model: rr.model, id: rr.id, untrusted: rr.untrusted}
	if rr.status != "" {
		info.finishReasons = []string{rr.status}
	}
	return info
}

// visible appends the round's items the client may see (all but the workspace's calls).
func (rr *responseRound) visible(dst []json.RawMessage) []json.RawMessage {
	for i, item := range rr.items {
		if !rr.hidden[i] {
			dst = append(dst, item)
		}
	}
	return dst
}

// answer is the response object the client gets at the end of a turn: the last round's, with the
// turn's id, the visible output of every round, the usage summed over rounds, and the
// previous_response_id the client sent.
func (rr *responseRound) answer(id string, output []json.RawMessage, usage *usageSum, rounds int, req *ResponsesRequest) []byte {
	o := rr.top.Clone()
	o.Set("id", rawjson.String(id))
	o.Set("output", rawjson.AppendArray(nil, output))
	if rounds > 1 && !usage.empty() {
		o.Set("usage", usage.json())
	}
	if rounds > 1 || req.Continued {
		req.showClientPrevious(&o)
	}
	return o.Bytes()
}
