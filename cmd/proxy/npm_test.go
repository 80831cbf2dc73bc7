package main

import (
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var npmClients = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("../../scripts/npm-clients.sh").Output()
	if err != nil {
		if exit, ok := err.(*exec.ExitError); ok {
			return "", &npmError{err, string(exit.Stderr)}
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
})

type npmError struct {
	err    error
	stderr string
}

func (e *npmError) Error() string {
	return "scripts/npm-clients.sh: " + e.err.Error() + ": " + e.stderr
}

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
