package proxy

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAPIUpstreams: every wire API has a name of its own and its upstream's settings, named
// apart from every other API's, and a default URL; APIUpstreams lists them in wireAPIs' order.
func TestAPIUpstreams(t *testing.T) {
	t.Parallel()
	ups := APIUpstreams()
	require.Len(t, ups, len(wireAPIs))
	seen := map[string]API{}
	for i, u := range ups {
		require.Equal(t, wireAPIs[i].name, u.API)
		require.NotEmpty(t, u.DefaultURL, "%s: no default URL", u.API)
		for _, name := range []string{string(u.API), u.URLSetting, u.KeySetting} {
			require.NotEmpty(t, name, "%s: a setting has no name", u.API)
			other, taken := seen[name]
			require.False(t, taken, "%s: %q is also %s's", u.API, name, other)
			seen[name] = u.API
		}
	}
}

// TestUpstreamsOption: Options.Upstreams gives each API its upstream, OpenAI's among them unless
// UpstreamURL or UpstreamAPIKey is set; an API left out gets its provider's API.
func TestUpstreamsOption(t *testing.T) {
	t.Parallel()
	local, _ := url.Parse("http://127.0.0.1:1/v1")
	other, _ := url.Parse("http://127.0.0.1:2/v1")
	opts := Options{Upstreams: map[API]Upstream{OpenAI: {URL: local, APIKey: "sk-op"}}}.withDefaults()
	require.Equal(t, Upstream{URL: local, APIKey: "sk-op"}, opts.Upstreams[OpenAI])
	require.Equal(t, local, opts.UpstreamURL)
	require.Equal(t, "sk-op", opts.UpstreamAPIKey)
	require.Equal(t, DefaultAnthropicUpstreamURL, opts.Upstreams[Anthropic].URL.String())
	require.Equal(t, DefaultGeminiUpstreamURL, opts.Upstreams[Gemini].URL.String())

	opts = Options{UpstreamURL: other, Upstreams: map[API]Upstream{OpenAI: {URL: local, APIKey: "sk-op"}}}.withDefaults()
	require.Equal(t, Upstream{URL: other}, opts.Upstreams[OpenAI])

	opts = Options{}.withDefaults()
	require.Equal(t, DefaultUpstreamURL, opts.Upstreams[OpenAI].URL.String())
	require.Len(t, opts.Upstreams, len(wireAPIs))
}
