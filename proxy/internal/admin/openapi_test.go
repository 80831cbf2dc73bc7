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
