package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocsPinnedVersions: every npm client a page tells to install (`npm i …`, `npx -y …`) is
// named with the version the tests drive, pinned in scripts/npm/package.json.
func TestDocsPinnedVersions(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../scripts/npm/package.json")
	require.NoError(t, err)
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	require.NoError(t, json.Unmarshal(b, &pkg))
	pages, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	pages = append(pages, "../../README.md")
	install := regexp.MustCompile("(?:npm i(?: -g)?|npx -y)((?: [^ `\"\n]+)+)")
	checked, wrong := 0, []string{}
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, m := range install.FindAllStringSubmatch(string(b), -1) {
			for _, arg := range strings.Fields(m[1]) {
				if strings.HasPrefix(arg, "-") {
					break // the command's own arguments follow
				}
				name, version := arg, ""
				if i := strings.LastIndex(arg, "@"); i > 0 {
					name, version = arg[:i], arg[i+1:]
				}
				pinned, ok := pkg.Dependencies[name]
				if !ok {
					continue // not one of the clients the tests drive
				}
				checked++
				if version != pinned {
					wrong = append(wrong, filepath.Base(page)+": "+arg+" (pinned: "+pinned+")")
				}
			}
		}
	}
	require.Empty(t, wrong)
	require.GreaterOrEqual(t, checked, 8, "the pages name the clients they install")
}
