package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestListenBeyondLoopback: the proxy listens on loopback unless LISTEN_ADDR says otherwise, and
// warns at start when it listens beyond loopback with an upstream key that any client reaching it
// would spend (no CLIENT_KEYS).
func TestListenBeyondLoopback(t *testing.T) {
	t.Parallel()
	require.Equal(t, "127.0.0.1:8080", DefaultConfig().ListenAddr)
	const warning = "listening beyond loopback with UPSTREAM_API_KEY and no CLIENT_KEYS"
	for _, c := range []struct {
		name, addr, clientKeys string
		warn                   bool
	}{
		{"EveryInterface", ":0", "", true},
		{"EveryInterfaceWithClientKeys", ":0", "alice=sk-alice-0123456789abcdef", false},
		{"Loopback", "127.0.0.1:0", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, logs := MustRunMain(t, func(cfg *Config) {
				cfg.ListenAddr = c.addr
				cfg.UpstreamBaseURL = "http://127.0.0.1:1/v1"
				cfg.UpstreamAPIKey = "sk-upstream"
				cfg.ClientKeys = c.clientKeys
			})
			if c.warn {
				require.Contains(t, logs.String(), warning)
				require.NotContains(t, logs.String(), "sk-upstream")
			} else {
				require.NotContains(t, logs.String(), warning)
			}
		})
	}
}

// TestAnthropicKeyMissingWarned: with CLIENT_KEYS and no ANTHROPIC_UPSTREAM_API_KEY, the start
// warns that Messages requests go upstream with no key, naming the setting; with it, it does not.
func TestAnthropicKeyMissingWarned(t *testing.T) {
	t.Parallel()
	const warning = "CLIENT_KEYS without ANTHROPIC_UPSTREAM_API_KEY"
	for _, key := range []string{"", "sk-ant-op"} {
		_, logs := MustRunMain(t, func(cfg *Config) {
			cfg.UpstreamBaseURL = "http://127.0.0.1:1/v1"
			cfg.UpstreamAPIKey = "sk-upstream"
			cfg.AnthropicUpstreamBaseURL = "http://127.0.0.1:1"
			cfg.AnthropicUpstreamAPIKey = key
			cfg.ClientKeys = "alice=sk-alice-0123456789abcdef"
		})
		if key == "" {
			require.Contains(t, lineOf(t, logs.String(), warning), "level=WARN")
		} else {
			require.NotContains(t, logs.String(), warning)
		}
	}
}
