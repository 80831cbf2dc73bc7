package turn

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/tools"
)

// maxToolNames is how many tool names a request keeps in a set, far above what an API accepts;
// past it, IsClientTool reads them from the body, so that memory does not grow with a hostile
// body's tools.
const maxToolNames = 256

// clientTools are the client's tools of a request.
type clientTools struct {
	// list is the client's tools array; tools the run of its elements (nil for none); names
	// their names, when there are at most maxToolNames (else IsClientTool reads them from list).
	list  json.RawMessage
	tools json.RawMessage
	names map[string]bool
}

// check checks the client's tools array: every tool an object, none named like a workspace
// tool; it keeps the run of its elements and, for a list of usual size, the names.
func (c *clientTools) check(list json.RawMessage) error {
	names := map[string]bool{}
	var err error
	c.list = list
	c.tools, err = eachToolName(list, func(name []byte) error {
		if name == nil {
			return nil
		}
		if tools.IsTool(string(name)) {
			return apierr.BadRequest("reserved_tool_name", "tools",
				"the tool name %q is reserved by the workspace proxy; rename the client tool", name)
		}
		if names != nil {
			names[string(name)] = true
			if len(names) > maxToolNames {
				names = nil
			}
		}
		return nil
	})
	c.names = names
	return err
}

// eachToolName walks a tools array, checked, and calls fn with the name of each tool's function
// or custom part, or its own name (the Responses and Messages APIs' shape; nil when it has
// none), without allocating for names without escapes. It returns the run of the array's
// elements (nil for none).
func eachToolName(list json.RawMessage, fn func(name []byte) error) (json.RawMessage, error) {
	var scratch struct{ tool, part rawjson.Object }
	first, last := -1, 0
	err := rawjson.Each(list, func(i, start, end int) error {
		elem := list[start:end]
		if elem[0] != '{' {
			return apierr.BadRequest("invalid_type", fmt.Sprintf("tools[%d]", i), "tools[%d] must be an object", i)
		}
		if first < 0 {
			first = start
		}
		last = end
		var err error
		if scratch.tool, err = rawjson.ParseInto(scratch.tool, elem); err != nil {
			return err
		}
		var name []byte
		for _, part := range [...]string{"function", "custom"} {
			v := scratch.tool.Get(part)
			if len(v) == 0 || v[0] != '{' {
				continue
			}
			if scratch.part, err = rawjson.ParseInto(scratch.part, v); err != nil {
				return err
			}
			if name = rawName(scratch.part.Get("name")); name != nil {
				break
			}
		}
		if name == nil { // the Responses API's shape: {"type":"function","name":…}
			name = rawName(scratch.tool.Get("name"))
		}
		return fn(name)
	})
	if err != nil {
		var e *apierr.Error
		if errors.As(err, &e) || errors.Is(err, errFound) {
			return nil, err
		}
		return nil, apierr.BadRequest("invalid_type", "tools", "tools must be an array")
	}
	if first < 0 {
		return nil, nil
	}
	return list[first:last], nil
}

// rawName is the text of a raw JSON string: its bytes when it has no escapes, else decoded;
// nil for anything but a non-empty string.
func rawName(v json.RawMessage) []byte {
	if len(v) < 3 || v[0] != '"' {
		return nil
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1]
	}
	s, _ := rawjson.Unquote(v)
	return []byte(s)
}

// IsClientTool reports whether name is one of the client's tools.
func (c *clientTools) IsClientTool(name string) bool {
	if c.tools == nil {
		return false
	}
	if c.names != nil {
		return c.names[name]
	}
	_, err := eachToolName(c.list, func(n []byte) error {
		if n != nil && string(n) == name {
			return errFound
		}
		return nil
	})
	return errors.Is(err, errFound)
}

// errFound stops a walk that found what it looked for.
var errFound = errors.New("found")

// toolRuns are the tools of a round: the client's, then the proxy's (in the request's shape)
// when withWorkspaceTools.
func (c *clientTools) toolRuns(withWorkspaceTools bool, workspace Payload) []Payload {
	var runs []Payload
	if len(c.tools) > 0 {
		runs = append(runs, Payload{c.tools})
	}
	if withWorkspaceTools {
		runs = append(runs, workspace)
	}
	return runs
}

// workspaceTools are the five tools' definitions as one run of elements.
var workspaceTools = func() Payload {
	a := rawjson.AppendArray(nil, tools.Definitions)
	return Payload{a[1 : len(a)-1]}
}()

// responsesWorkspaceTools are the five tools in the Responses API's function-tool shape
// ({"type":"function","name","description","parameters","strict":false}: the API's strict
// default would require every property), as one run of elements.
var responsesWorkspaceTools = func() Payload {
	list := make([]json.RawMessage, len(tools.All))
	for i, d := range tools.All {
		o := rawjson.Object{}
		o.Set("type", rawjson.String("function"))
		o.Set("name", rawjson.String(d.Name))
		o.Set("description", rawjson.String(d.Description))
		o.Set("parameters", d.Parameters)
		o.Set("strict", json.RawMessage("false"))
		list[i] = o.Bytes()
	}
	return Payload{elementRun(list)}
}()
