package admin

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/limits"
)

// TestOpenAPIMatchesRoutes: the document names exactly the admin routes the server serves.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(openAPIDocument, &doc))
	require.Equal(t, "3.1.0", doc.OpenAPI)
	var documented, served []string
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if method == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+path)
			var o struct{ Responses map[string]any }
			require.NoError(t, json.Unmarshal(op, &o))
			require.NotEmpty(t, o.Responses, "%s %s", method, path)
		}
	}
	for _, rt := range adminRouteTable {
		served = append(served, rt.method+" "+rt.path)
	}
	sort.Strings(documented)
	sort.Strings(served)
	require.Equal(t, served, documented)
}

// TestOpenAPIRevertThrough: the document says what ?through of a revert is, and that its answer
// is then a list of events.
func TestOpenAPIRevertThrough(t *testing.T) {
	t.Parallel()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(openAPIDocument, &doc))
	var op struct {
		Parameters []struct{ Name, In string }
		Responses  map[string]struct {
			Content map[string]struct {
				Schema struct {
					OneOf []map[string]any `json:"oneOf"`
				}
			}
		}
	}
	require.NoError(t, json.Unmarshal(doc.Paths["/admin/v1/threads/{thread}/events/{id}/revert"]["post"], &op))
	require.Len(t, op.Parameters, 1)
	require.Equal(t, "through", op.Parameters[0].Name)
	require.Equal(t, "query", op.Parameters[0].In)
	one := op.Responses["200"].Content["application/json"].Schema.OneOf
	require.Len(t, one, 2)
	require.Equal(t, "#/components/schemas/Event", one[0]["$ref"])
	require.Contains(t, one[1]["properties"], "data")
}

// TestOpenAPIClientSchemas: the document's clients' usage has exactly the fields the server
// shows (limits.Usage's), each an integer, and its limits start where the REST's checks do: 1.
func TestOpenAPIClientSchemas(t *testing.T) {
	t.Parallel()
	type schema struct {
		Ref        string `json:"$ref"`
		Type       any
		Minimum    *int64
		Required   []string
		Properties map[string]schema
	}
	var doc struct {
		Components struct{ Schemas map[string]schema }
	}
	require.NoError(t, json.Unmarshal(openAPIDocument, &doc))
	schemas := doc.Components.Schemas
	require.Equal(t, "#/components/schemas/ClientUsage", schemas["Client"].Properties["usage"].Ref)
	usage := schemas["ClientUsage"]
	var fields []string
	for f := range reflect.TypeFor[limits.Usage]().Fields() {
		fields = append(fields, strings.Split(f.Tag.Get("json"), ",")[0])
	}
	sort.Strings(fields)
	documented := slices.Sorted(maps.Keys(usage.Properties))
	require.Equal(t, fields, documented)
	require.ElementsMatch(t, fields, usage.Required)
	for name, p := range usage.Properties {
		require.Equal(t, "integer", p.Type, name)
	}
	for name, p := range schemas["ClientLimits"].Properties {
		require.NotNil(t, p.Minimum, name)
		require.Equal(t, int64(1), *p.Minimum, name)
		_, err := limitsBody{name: new(*p.Minimum - 1)}.patch()
		require.Error(t, err, "%s below the documented minimum", name)
		_, err = limitsBody{name: new(*p.Minimum)}.patch()
		require.NoError(t, err, "%s at the documented minimum", name)
	}
}
