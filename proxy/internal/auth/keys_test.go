package auth

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/workspace"
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

// TestNewKeyAndReplace: a new key is wsp_ and 32 random bytes, its prefix 8 characters; keys
// replaced from the table authenticate at once, the old ones no more, and each client's use is
// noted once.
func TestNewKeyAndReplace(t *testing.T) {
	t.Parallel()
	key, stored := NewKey()
	require.Regexp(t, `^wsp_[A-Za-z0-9_-]{43}$`, key)
	require.Equal(t, key[:8], stored.Prefix)
	require.Equal(t, hashOf(key), stored.Hash)
	other, _ := NewKey()
	require.NotEqual(t, key, other)
	require.Equal(t, "shor", KeyPrefix("short-seeded-key-0123"), "a short key gives 4 characters away")

	k := NewClientKeys()
	require.False(t, k.On())
	_, ok := k.Lookup(key)
	require.False(t, ok)
	k.Replace(true, []workspace.LiveKey{{Hash: stored.Hash, Client: "alice"}})
	require.True(t, k.On())
	name, ok := k.Lookup(key)
	require.True(t, ok)
	require.Equal(t, "alice", name)
	k.Replace(true, []workspace.LiveKey{{Hash: hashOf(other), Client: "alice"}})
	_, ok = k.Lookup(key)
	require.False(t, ok, "replaced: revoked")
	require.Equal(t, []string{"alice"}, k.Used(), "the use before the reload is still noted")
	require.Empty(t, k.Used())
	g := &Guard{AdminToken: "admin-token-0123456789", ClientKeys: k}
	require.True(t, g.Holds("alice", g.KeyFingerprint(other)))
	require.False(t, g.Holds("alice", g.KeyFingerprint(key)), "what the revoked key made")
}
