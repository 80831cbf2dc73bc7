package main

import (
	"context"
	"flag"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSubcommands: every subcommand is built from its name and owns its flags (-h is its usage);
// an unknown name is an error.
func TestSubcommands(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"run", "upstream", "model", "bareproxy", "floor", "suite", "latency", "cache", "soak"} {
		require.ErrorIs(t, run(context.Background(), []string{name, "-h"}), flag.ErrHelp, name)
	}
	require.ErrorContains(t, run(context.Background(), []string{"nonesuch"}), `unknown subcommand "nonesuch"`)
	require.ErrorContains(t, run(context.Background(), []string{"run"}), "-url is required")
}
