package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/wsproxy/wsproxy/tools"
	"github.com/wsproxy/wsproxy/workspace"
)

// The tool lists: the five tools with the descriptions and schemas the proxy injects
// (tools.All), with a required thread argument where the token is not bound to one thread, and
// MCP's own as_of on the tools that take indices (docs/spec.md §15).
var (
	boundTools  = toolDefs("")
	adminTools  = toolDefs("The thread whose workspace the call reads or changes: its id as requests through wsproxy name it (X-Thread-Id), client~id for a client's thread. A new thread is created.")
	clientTools = toolDefs("The thread whose workspace the call reads or changes: its id as your requests through wsproxy name it (X-Thread-Id). A new thread is created.")
)

// asOf is the schema of the as_of argument of update_preferences and remove_preferences.
var asOf = map[string]any{"type": "integer", "minimum": 0,
	"description": "The change a list_preferences result or the workspace resource ended with (as of change N): the indices then name the list as it stood then, and a preference changed or removed since is reported, never replaced by another. Without it, the indices name the list as it stands when the call runs."}

// toolDefs are the five tools, with a required thread argument described as thread says ("" for
// none).
func toolDefs(thread string) []*mcp.Tool {
	defs := make([]*mcp.Tool, len(tools.All))
	for i, d := range tools.All {
		var params map[string]any
		if err := json.Unmarshal(d.Parameters, &params); err != nil {
			panic("tools.All: " + err.Error())
		}
		props := params["properties"].(map[string]any)
		if thread != "" {
			props["thread"] = map[string]any{"type": "string", "description": thread}
			params["required"] = append([]any{"thread"}, params["required"].([]any)...)
		}
		if d.Name == tools.UpdatePreferences || d.Name == tools.RemovePreferences {
			props["as_of"] = asOf
		}
		schema, err := json.Marshal(params)
		if err != nil {
			panic("tools.All: " + err.Error())
		}
		closed := false
		defs[i] = &mcp.Tool{Name: d.Name, Description: d.Description, InputSchema: json.RawMessage(schema),
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: d.Name == tools.ListPreferences, OpenWorldHint: &closed}}
	}
	return defs
}

// callTool is the handler of a tool: the call runs on the agent path against the thread the
// scope resolves, and its result is the envelope's text (an error envelope's: a tool error).
// The store's own failures are JSON-RPC errors.
func (s *Server) callTool(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		sc := scopeFrom(ctx)
		id, err := sc.resolve(threadArgument(args))
		if err != nil {
			err = s.sharedScope(ctx, sc, threadArgument(args), err)
		}
		if err != nil {
			s.metrics(name, tools.Result{})
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}, IsError: true}, nil
		}
		ctx, span := s.tracing.Start(ctx, name, string(args), semconv.GenAIConversationID(id.Name), attribute.String("wsproxy.via", workspace.ViaMCP))
		res, err := tools.Run(ctx, s.opts.Store.Workspace(id), tools.Call{Name: name, Arguments: string(args), Via: workspace.ViaMCP, Existing: sc.bound()})
		s.tracing.End(span, res, err)
		if err != nil {
			s.log.LogAttrs(ctx, slog.LevelWarn, "mcp tool call failed", slog.String("tool", name), slog.String("thread", id.String()), slog.Any("err", err))
			msg := "internal error"
			if errors.Is(err, workspace.ErrUnavailable) {
				msg = "the workspace store (Postgres) is unavailable; nothing was run"
			}
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: msg}
		}
		s.metrics(name, res)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Text}}, IsError: !res.OK}, nil
	}
}

// errSharedReadOnly: a client's tool call names a shared scope (docs/spec.md §20).
var errSharedReadOnly = errors.New("a shared scope is read-only to clients: its items reach the threads that name it among their parents; " +
	"call the tool on one of your threads, and ask the user to change the scope")

// sharedScope is what a call that names a thread the scope does not resolve (err) is told: for a
// client that names ~name, a workspace outside every client's namespace that is shared with it,
// errSharedReadOnly (nothing of it is written); else err, as if it did not exist.
func (s *Server) sharedScope(ctx context.Context, sc scope, name string, err error) error {
	rest, ok := strings.CutPrefix(name, workspace.SharedPrefix)
	if sc.client == "" || !ok {
		return err
	}
	id, perr := workspace.NewThreadID("", rest)
	if perr != nil {
		return err
	}
	shared, serr := s.opts.Store.Workspace(id).SharedWithClient(ctx, sc.client)
	switch {
	case serr != nil:
		return serr
	case shared:
		return errSharedReadOnly
	}
	return err
}

func (s *Server) metrics(name string, res tools.Result) {
	if s.opts.Metrics != nil {
		s.opts.Metrics.MCPToolCall(name, res.OK, res.LockedSkips, res.Untrusted)
	}
}

// threadArgument is the call's thread argument: "" when there is none (or the arguments are not
// an object, which the tool then refuses; a thread that is not a string names none).
func threadArgument(args json.RawMessage) string {
	var a struct {
		Thread json.RawMessage `json:"thread"`
	}
	if json.Unmarshal(args, &a) != nil {
		return ""
	}
	var name string
	if json.Unmarshal(a.Thread, &name) != nil {
		return ""
	}
	return name
}
