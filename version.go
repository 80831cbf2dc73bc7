// Package wsproxy holds what belongs to the whole program rather than one of its rooms: its
// version.
package wsproxy

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var versionFile string

// Version is the version being built, as the VERSION file names it (CHANGELOG.md says what each
// one changed).
var Version = strings.TrimSpace(versionFile)
