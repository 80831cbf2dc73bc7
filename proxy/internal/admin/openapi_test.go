package admin

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
