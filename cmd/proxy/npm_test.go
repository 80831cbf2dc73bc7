package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var npmClients = sync.OnceValues(func() (string, error) {
	cmd := exec.Command("../../scripts/npm-clients.sh")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/npm-clients.sh: %w: %s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
})

// nodeModules is the node_modules folder of the pinned npm clients (scripts/npm), installed by
// scripts/npm-clients.sh when missing; the test fails, never skips, when they cannot be.
func nodeModules(t *testing.T) string {
	t.Helper()
	dir, err := npmClients()
	require.NoError(t, err, "the end-to-end tests need the pinned npm clients")
	return dir
}

// npmBin is the path of an installed npm client's command (claude, …).
func npmBin(t *testing.T, name string) string {
	return filepath.Join(nodeModules(t), ".bin", name)
}
