package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/wsproxy/wsproxy/workspace"
)

// invalid is a call's input that breaks a rule, in field.
func invalid(field, format string, args ...any) *workspace.ValidationError {
	return &workspace.ValidationError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// parseArguments decodes a call's arguments: a JSON object (an empty string counts as {}), with
// the action_and_reasoning the model gave, if any.
func parseArguments(raw string) (json.RawMessage, string, error) {
	if strings.TrimSpace(raw) == "" {
		return json.RawMessage("{}"), "", nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &fields); err != nil || fields == nil {
		return nil, "", invalid("", "arguments are not a JSON object")
	}
	var reasoning string
	if r, ok := fields["action_and_reasoning"]; ok {
		_ = json.Unmarshal(r, &reasoning) // a call without it (or with a non-string) still runs
	}
	return json.RawMessage(raw), reasoning, nil
}

// decodeArgs decodes args into v, naming the schema break when they do not fit.
func decodeArgs(args json.RawMessage, v any) error {
	if err := json.Unmarshal(args, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return invalid(te.Field, "must be %s, not a JSON %s", jsonType(te.Type.Kind().String()), te.Value)
		}
		var ve *workspace.ValidationError
		if errors.As(err, &ve) {
			return ve
		}
		return invalid("", "arguments do not match the schema: %v", err)
	}
	return nil
}

func jsonType(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	case "int", "int64":
		return "an integer"
	}
	return "a " + goKind
}

// index is a 1-based position: a JSON integer ≥ 1 (2.0 counts as 2).
type index int

func (i *index) UnmarshalJSON(b []byte) error {
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != float64(int64(f)) || f < 1 || f > 1e9 {
		return invalid("", "an index must be an integer ≥ 1, not %s", workspace.Truncate(string(b), 40))
	}
	*i = index(f)
	return nil
}
