package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy"
)

// TestUpstreamSettings: every wire API of proxy.APIUpstreams has its row in Config.upstreams —
// two fields of its own, its settings (variable and flag) with their usage, the texts of its
// warning — and its settings reach its upstream: each API's base URL and key as set, its
// default when unset, the demo model (at its prefix) for every unset one with
// UPSTREAM_BASE_URL=demo.
func TestUpstreamSettings(t *testing.T) {
	t.Parallel()
	c := DefaultConfig()
	apis := proxy.APIUpstreams()
	require.NotEmpty(t, apis)
	require.Equal(t, proxy.OpenAI, apis[0].API, "OpenAI's upstream, the primary one, comes first")
	settings := map[string]setting{}
	for _, s := range c.settings() {
		settings[s.env] = s
	}
	fields := map[*string]proxy.API{}
	rows := c.upstreams()
	require.Len(t, rows, len(apis))
	for i, u := range rows {
		require.Equal(t, apis[i], u.APIUpstream)
		require.NotEmpty(t, u.URLSetting, "%s: no URL setting", u.API)
		require.NotEmpty(t, u.KeySetting, "%s: no key setting", u.API)
		require.True(t, strings.HasPrefix(u.DefaultURL, "https://"), "%s: default %q", u.API, u.DefaultURL)
		require.NotNil(t, u.baseURL, "%s has no row in Config.upstreams", u.API)
		require.NotNil(t, u.apiKey, "%s has no row in Config.upstreams", u.API)
		for _, f := range []*string{u.baseURL, u.apiKey} {
			other, taken := fields[f]
			require.False(t, taken, "%s and %s share a field of Config", u.API, other)
			fields[f] = u.API
		}
		for env, usage := range map[string]string{u.URLSetting: u.urlUsage, u.KeySetting: u.keyUsage} {
			s, ok := settings[env]
			require.True(t, ok, "%s is not a setting", env)
			require.Equal(t, usage, s.usage)
			require.NotEmpty(t, usage, "%s has no usage text", env)
		}
		if !u.primary() {
			require.NotEmpty(t, u.requests, "%s: its warning names no requests", u.API)
			require.NotEmpty(t, u.provider, "%s: its warning names no upstream", u.API)
		}
	}

	// Each API's settings, by variable and by flag, reach its upstream.
	env, args := map[string]string{"DATABASE_URL": "postgres://x"}, []string{}
	for _, a := range apis {
		env[a.URLSetting] = "http://" + string(a.API) + ".example" + a.Prefix
		args = append(args, "-"+flagName(a.KeySetting), "key-"+string(a.API))
	}
	m := NewMain()
	require.NoError(t, m.Config.Load(args, func(k string) string { return env[k] }, io.Discard))
	require.NoError(t, m.Config.Validate())
	ups, err := m.upstreams()
	require.NoError(t, err)
	require.Len(t, ups, len(apis))
	for _, a := range apis {
		require.Equal(t, env[a.URLSetting], ups[a.API].URL.String())
		require.Equal(t, "key-"+string(a.API), ups[a.API].APIKey)
	}

	// Unset: each API's default (UPSTREAM_BASE_URL's is DefaultConfig's), with no key.
	m = NewMain()
	ups, err = m.upstreams()
	require.NoError(t, err)
	for _, a := range apis {
		require.Equal(t, proxy.Upstream{URL: ups[a.API].URL}, ups[a.API])
		require.Equal(t, a.DefaultURL, ups[a.API].URL.String())
	}

	// UPSTREAM_BASE_URL=demo: one demo model serves every API left unset.
	m = NewMain()
	m.log = slog.New(slog.DiscardHandler)
	m.Config.UpstreamBaseURL = "demo"
	ups, err = m.upstreams()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.demo.Close()) })
	for _, a := range apis {
		require.Equal(t, "http://"+m.demoAddr+a.Prefix, ups[a.API].URL.String())
	}
}
