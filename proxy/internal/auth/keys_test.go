package auth

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseClientKeys(t *testing.T) {
	t.Parallel()
	k, err := ParseClientKeys("alice=sk-alice-1, bob = sk-bob\n# comment\n\nalice=sk-alice-2")
	require.NoError(t, err)
	for key, want := range map[string]string{"sk-alice-1": "alice", "sk-alice-2": "alice", "sk-bob": "bob"} {
		got, ok := k.Lookup(key)
		require.True(t, ok)
		require.Equal(t, want, got)
	}
	for _, bad := range []string{"", "alice", "alice=", "al ice=k", "a=k,b=k", "=k"} {
		_, err := ParseClientKeys(bad)
		require.Error(t, err, bad)
		if bad == "a=k,b=k" {
			require.NotContains(t, err.Error(), "=k")
		}
	}
}
