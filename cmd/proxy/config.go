package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/wsproxy/wsproxy/proxy"
	"github.com/wsproxy/wsproxy/workspace"
)

// Config is wsproxy's configuration: each field an environment variable and a flag; a flag
// wins over its variable.
type Config struct {
	DatabaseURL     string
	DatabaseTimeout time.Duration
	// DatabaseWait is how long a start waits for Postgres to answer.
	DatabaseWait    time.Duration
	UpstreamBaseURL string // "demo" starts the built-in demo model
	UpstreamAPIKey  string
	// AnthropicUpstreamBaseURL is the Messages API's upstream ("" means Anthropic's API, or the
	// demo model when UpstreamBaseURL is "demo"; "demo" the demo model).
	AnthropicUpstreamBaseURL string
	AnthropicUpstreamAPIKey  string
	// GeminiUpstreamBaseURL is the Gemini API's upstream ("" means Google's API, or the demo
	// model when UpstreamBaseURL is "demo"; "demo" the demo model).
	GeminiUpstreamBaseURL string
	GeminiUpstreamAPIKey  string
	// ThreadHeader names the headers (comma-separated) that name the thread when X-Thread-Id and
	// the path do not: the first one a request carries.
	ThreadHeader string
	// ThreadParents are the parents (names, nearest first, comma-separated) a thread named by
	// ThreadHeader starts with (docs/spec.md §17, §18).
	ThreadParents string
	ListenAddr    string
	PprofAddr     string // Go's runtime profiles' listener; off when empty
	AdminToken    string
	ClientKeys    string // name=key pairs, or @file
	// PassThroughRoutes are the routes forwarded as they are for clients with keys.
	PassThroughRoutes string
	MaxToolRounds     int
	MaxRequestBytes   int64
	// RequestReadTimeout bounds a request body's arrival; MaxBufferedBytes the bodies held at once.
	RequestReadTimeout time.Duration
	MaxBufferedBytes   int64
	UpstreamTimeout    time.Duration
	// StreamKeepalive is the longest a streamed turn's client waits without a byte.
	StreamKeepalive time.Duration
	// WorkspacePlacement is where the workspace goes in a request: tail or system.
	WorkspacePlacement string
	// PromptCacheKey: auto, thread or off.
	PromptCacheKey string
	// WorkspaceUnavailable is "fail" (503) or "bypass": what a thread turn whose workspace
	// cannot be read within WorkspaceBudget gets.
	WorkspaceUnavailable string
	WorkspaceBudget      time.Duration
	// DatabaseListenURL is no longer used: the replicas follow their watched threads through
	// the pool (EventsPollInterval). Accepted, and logged, so that a deployment that sets it starts.
	DatabaseListenURL string
	// EventsPollInterval is how often each replica reads where the threads its event streams and
	// MCP subscriptions watch stand (0: 250ms).
	EventsPollInterval time.Duration
	// HistoryRetention prunes events, snapshots, tool-call records, response turns and client
	// responses older than it (0 keeps them).
	HistoryRetention time.Duration
	// UntrustedWrites is what becomes of a write a turn that read content the user did not
	// write makes, when the user's words do not ground it (docs/spec.md §19): propose, apply or
	// refuse.
	UntrustedWrites string
	// ProposalsWebhook, when set, is an http(s) URL told of each proposal as it is made (a small
	// JSON POST: thread, proposal id, title; docs/spec.md §19).
	ProposalsWebhook string
	// UntrustedMarkers begin text a client adds to a user's message (comma-separated), beside
	// the markers wsproxy knows of the clients it has captured.
	UntrustedMarkers string
	// TrustedProxies are the proxies in front whose X-Forwarded-* headers are believed (CIDRs).
	TrustedProxies string
	// UI is "on" or "off": the workspace panel.
	UI string
	// MCP is "on" or "off": the workspace over MCP (/mcp).
	MCP             string
	ShutdownTimeout time.Duration
	LogLevel        string
	LogFormat       string

	// Bounds of a model's workspace calls: per round and per turn, items and argument bytes per call.
	MaxToolCallsPerRound int
	MaxToolCallsPerTurn  int
	MaxToolItems         int
	MaxToolArgumentBytes int64
	// MetricsToken, when set, is the bearer token /metrics needs.
	MetricsToken string
	// TraceContent records a tool call's arguments and result on its span:
	// OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true, an environment variable only, as
	// the other OTEL_ settings (no flag).
	TraceContent bool
}

// DefaultConfig is the configuration with nothing set.
func DefaultConfig() Config {
	return Config{
		DatabaseTimeout:      workspace.DefaultTimeout,
		DatabaseWait:         30 * time.Second,
		UpstreamBaseURL:      proxy.DefaultUpstreamURL,
		ListenAddr:           "127.0.0.1:8080", // loopback: a key behind the proxy is spent by whoever reaches it
		MaxToolRounds:        proxy.DefaultMaxToolRounds,
		MaxRequestBytes:      proxy.DefaultMaxRequestBytes,
		RequestReadTimeout:   proxy.DefaultRequestReadTimeout,
		MaxBufferedBytes:     proxy.DefaultMaxBufferedBytes,
		UpstreamTimeout:      proxy.DefaultUpstreamTimeout,
		StreamKeepalive:      proxy.DefaultStreamKeepalive,
		WorkspacePlacement:   string(proxy.PlaceTail),
		PassThroughRoutes:    proxy.DefaultPassThroughRoutes,
		PromptCacheKey:       proxy.PromptCacheKeyAuto,
		WorkspaceUnavailable: "fail",
		WorkspaceBudget:      proxy.DefaultWorkspaceBudget,
		UI:                   "on",
		MCP:                  "on",
		ShutdownTimeout:      30 * time.Second,
		LogLevel:             "info",
		LogFormat:            "text",

		MaxToolCallsPerRound: proxy.DefaultMaxToolCallsPerRound,
		MaxToolCallsPerTurn:  proxy.DefaultMaxToolCallsPerTurn,
		MaxToolItems:         workspace.DefaultLimits().ItemsMax,
		MaxToolArgumentBytes: int64(workspace.DefaultLimits().ArgumentBytesMax),
	}
}

// setting binds one field to its variable and flag.
type setting struct {
	env, flag, usage string
	value            flag.Value
}

func (c *Config) settings() []setting {
	settings := []setting{
		{"DATABASE_URL", "database-url", "Postgres URL (required)", (*stringValue)(&c.DatabaseURL)},
		{"DATABASE_WAIT", "database-wait", "how long a start waits for Postgres to answer, retrying with backoff (/healthz answers meanwhile, /readyz is 503), before it gives up with the error", (*durationValue)(&c.DatabaseWait)},
		{"DATABASE_TIMEOUT", "database-timeout", "longest a workspace operation may wait for a connection and run (also the statement_timeout)", (*durationValue)(&c.DatabaseTimeout)},
	}
	for _, u := range c.upstreams() {
		settings = append(settings, setting{u.URLSetting, flagName(u.URLSetting), u.urlUsage, (*stringValue)(u.baseURL)},
			setting{u.KeySetting, flagName(u.KeySetting), u.keyUsage, (*secretValue)(u.apiKey)})
	}
	return append(settings, []setting{
		{"THREAD_HEADER", "thread-header", "request headers (comma-separated, the first one a request carries wins) that name the thread when neither X-Thread-Id nor the path does (e.g. X-Claude-Code-Session-Id, session-id, X-Gemini-Session-Id: a workspace per Claude Code, Codex or wrapped Gemini CLI session); default none", (*stringValue)(&c.ThreadHeader)},
		{"THREAD_PARENTS", "thread-parents", "the parents (scopes, nearest first, comma-separated: repo-x, alice; ~repo-x for a scope the admin shared with the client) a thread named by THREAD_HEADER starts with: a new agent session inherits its project's and its person's preferences; default none", (*stringValue)(&c.ThreadParents)},
		{"LISTEN_ADDR", "listen-addr", "address to serve on (:8080 for every interface)", (*stringValue)(&c.ListenAddr)},
		{"CLIENT_KEYS", "client-keys", "clients' keys, seeding the clients' table at start (SIGHUP re-reads @FILE): name=key pairs separated by commas, or @FILE with one per line; with any client every /v1 request needs a key and threads are per client", (*secretValue)(&c.ClientKeys)},
		{"PASSTHROUGH_ROUTES", "passthrough-routes", "with CLIENT_KEYS, the routes forwarded as they are: METHOD /v1/path patterns separated by commas, a trailing * matching any rest (others: 403)", (*stringValue)(&c.PassThroughRoutes)},
		{"ADMIN_TOKEN", "admin-token", "bearer token of the admin REST; generated and logged once when unset", (*secretValue)(&c.AdminToken)},
		{"MAX_TOOL_ROUNDS", "max-tool-rounds", "tool rounds per turn before a last call without the workspace tools", (*intValue)(&c.MaxToolRounds)},
		{"MAX_TOOL_CALLS_PER_ROUND", "max-tool-calls-per-round", "workspace calls run in one round, and messages in one MCP request; more get an error envelope, not run (MCP: the request is refused)", (*intValue)(&c.MaxToolCallsPerRound)},
		{"MAX_TOOL_CALLS_PER_TURN", "max-tool-calls-per-turn", "workspace calls run in one turn; more get an error envelope, not run", (*intValue)(&c.MaxToolCallsPerTurn)},
		{"MAX_TOOL_ITEMS", "max-tool-items", "items, edits or indices in one workspace call; more: the call's error envelope", (*intValue)(&c.MaxToolItems)},
		{"MAX_TOOL_ARGUMENT_BYTES", "max-tool-argument-bytes", "arguments of one workspace call (bytes, or with KiB, MiB, GiB); more: the call's error envelope", (*byteSize)(&c.MaxToolArgumentBytes)},
		{"MAX_REQUEST_BYTES", "max-request-bytes", "largest request body accepted (413 over it); bytes, or with KiB, MiB, GiB", (*byteSize)(&c.MaxRequestBytes)},
		{"REQUEST_READ_TIMEOUT", "request-read-timeout", "longest a request body may take to arrive (408 past it)", (*durationValue)(&c.RequestReadTimeout)},
		{"MAX_BUFFERED_BYTES", "max-buffered-bytes", "request bodies held in memory across all requests at once (503 past it); bytes, or with KiB, MiB, GiB", (*byteSize)(&c.MaxBufferedBytes)},
		{"WORKSPACE_PLACEMENT", "workspace-placement", "where the workspace goes in a request: tail (the last user or tool message, keeps the prompt cache) or system (the system prompt)", (*stringValue)(&c.WorkspacePlacement)},
		{"WORKSPACE_UNAVAILABLE", "workspace-unavailable", "what a thread turn gets when Postgres cannot give its workspace within WORKSPACE_BUDGET: fail (503 workspace_unavailable) or bypass (forwarded without the workspace, marked X-Workspace: unavailable, counted)", (*stringValue)(&c.WorkspaceUnavailable)},
		{"WORKSPACE_BUDGET", "workspace-budget", "with WORKSPACE_UNAVAILABLE=bypass, how long a thread turn waits for its workspace before it is forwarded without it", (*durationValue)(&c.WorkspaceBudget)},
		{"PROMPT_CACHE_KEY", "prompt-cache-key", "prompt_cache_key on thread turns without one: thread (an opaque key per thread), off, or auto (thread when the upstream is OpenAI's API)", (*stringValue)(&c.PromptCacheKey)},
		{"EVENTS_POLL_INTERVAL", "events-poll-interval", "how often each replica reads where the threads its event streams and MCP subscriptions watch stand (one indexed read, none while nothing is watched): a change reaches every replica within about that; 0 means 250ms, at most 1s", (*durationValue)(&c.EventsPollInterval)},
		{"DATABASE_LISTEN_URL", "database-listen-url", "no longer used (the replicas follow their threads through DATABASE_URL's pool); accepted and logged", (*secretValue)(&c.DatabaseListenURL)},
		{"UNTRUSTED_WRITES", "untrusted-writes", "what becomes of a write of a turn that read content the user did not write, when the user's own words do not ground it, in a workspace that sets none of its own: propose (a proposal the user reviews), apply (applied, marked unconfirmed) or refuse (not written)", (*stringValue)(&c.UntrustedWrites)},
		{"PROPOSALS_WEBHOOK", "proposals-webhook", "an http(s) URL that gets a JSON POST ({event, thread, proposal, title}, never a key) when an assistant's change becomes a proposal for the user to review; sent in the background, never delaying a turn; off when empty", (*stringValue)(&c.ProposalsWebhook)},
		{"UNTRUSTED_MARKERS", "untrusted-markers", "comma-separated texts that begin what a client adds to a user's message (like <my-context>): from one to the end of its part, the text is not the user's", (*stringValue)(&c.UntrustedMarkers)},
		{"HISTORY_RETENTION", "history-retention", "prune events, snapshots (but each thread's last), tool-call records, response turns and client responses older than this Go duration (like 2160h); 0 keeps them", (*durationValue)(&c.HistoryRetention)},
		{"TRUSTED_PROXIES", "trusted-proxies", "the proxies in front of wsproxy (CIDRs or addresses, separated by commas) whose X-Forwarded-For, X-Forwarded-Proto and X-Forwarded-Host are believed; default none", (*stringValue)(&c.TrustedProxies)},
		{"METRICS_TOKEN", "metrics-token", "bearer token /metrics needs (Authorization: Bearer <token>); unset: /metrics is open", (*secretValue)(&c.MetricsToken)},
		{"UI", "ui", "the workspace panel at /ui/: on or off", (*stringValue)(&c.UI)},
		{"MCP", "mcp", "the workspace over MCP at /mcp: on or off", (*stringValue)(&c.MCP)},
		{"UPSTREAM_TIMEOUT", "upstream-timeout", "longest wait for upstream response headers, and longest silence in a body", (*durationValue)(&c.UpstreamTimeout)},
		{"STREAM_KEEPALIVE", "stream-keepalive", "longest a streamed turn's client goes without a byte once its stream started or a round it cannot see began: past it, a keepalive comment (a ping event on /v1/messages); also the admin event streams' heartbeat", (*durationValue)(&c.StreamKeepalive)},
		{"SHUTDOWN_TIMEOUT", "shutdown-timeout", "how long in-flight requests may take to finish at shutdown", (*durationValue)(&c.ShutdownTimeout)},
		{"PPROF_ADDR", "pprof-addr", "an address (127.0.0.1:6060) serving Go's runtime profiles at /debug/pprof/ (CPU, heap, goroutines), on a listener of its own; default off", (*stringValue)(&c.PprofAddr)},
		{"LOG_LEVEL", "log-level", "debug, info, warn or error", (*stringValue)(&c.LogLevel)},
		{"LOG_FORMAT", "log-format", "text or json", (*stringValue)(&c.LogFormat)},
	}...)
}

// flagName is the flag of the variable env: UPSTREAM_BASE_URL's is upstream-base-url.
func flagName(env string) string { return strings.ToLower(strings.ReplaceAll(env, "_", "-")) }

// upstreamSetting is one wire API's upstream as configured: the names of its settings, its
// default and prefix (proxy.APIUpstreams), the fields of Config that hold them, and their texts.
type upstreamSetting struct {
	proxy.APIUpstream
	baseURL, apiKey *string
	// urlUsage and keyUsage are the settings' usage texts.
	urlUsage, keyUsage string
	// requests and provider name the API's requests and its upstream in the warning of a start
	// with client keys and no key of the operator's toward it.
	requests, provider string
}

// upstreams are the settings of the wire APIs' upstreams, in proxy.APIUpstreams' order: an API
// costs a row here and two fields of Config, and the settings, their checks, the upstreams, the
// warnings and the start line follow (main.go).
func (c *Config) upstreams() []upstreamSetting {
	rows := map[proxy.API]upstreamSetting{
		proxy.OpenAI: {baseURL: &c.UpstreamBaseURL, apiKey: &c.UpstreamAPIKey,
			urlUsage: `OpenAI-compatible base URL, or "demo" for the built-in demo model`,
			keyUsage: "replaces the client's Authorization toward the upstream when set"},
		proxy.Anthropic: {baseURL: &c.AnthropicUpstreamBaseURL, apiKey: &c.AnthropicUpstreamAPIKey,
			urlUsage: `base URL of the Anthropic Messages API's upstream for /v1/messages (default https://api.anthropic.com; the demo model when UPSTREAM_BASE_URL is demo), or "demo"`,
			keyUsage: "replaces the client's x-api-key and Authorization toward the Anthropic upstream when set",
			requests: "Messages", provider: "Anthropic"},
		proxy.Gemini: {baseURL: &c.GeminiUpstreamBaseURL, apiKey: &c.GeminiUpstreamAPIKey,
			urlUsage: `base URL of the Gemini API's upstream for /v1beta/models/… (default https://generativelanguage.googleapis.com; the demo model when UPSTREAM_BASE_URL is demo), or "demo"`,
			keyUsage: "replaces the client's x-goog-api-key, ?key= and Authorization toward the Gemini upstream when set",
			requests: "Gemini", provider: "Gemini"},
	}
	var ups []upstreamSetting
	for _, a := range proxy.APIUpstreams() {
		u := rows[a.API] // TestUpstreamSettings: every API has its row
		u.APIUpstream = a
		ups = append(ups, u)
	}
	return ups
}

// primary reports the OpenAI upstream's, "the upstream": UPSTREAM_BASE_URL has its default in
// DefaultConfig (empty is refused), its "demo" makes the demo model every unset upstream, its key
// is required with CLIENT_KEYS (Validate: no warning), and the start line names it upstream.
func (u upstreamSetting) primary() bool { return u.API == proxy.OpenAI }

// shownAs is the upstream's attribute in the start line and the warnings: upstream for the
// primary one, else the API's name and _upstream (anthropic_upstream).
func (u upstreamSetting) shownAs() string {
	if u.primary() {
		return "upstream"
	}
	return string(u.API) + "_upstream"
}

// Load reads the environment (through getenv), then the flags in args.
func (c *Config) Load(args []string, getenv func(string) string, output io.Writer) error {
	fs := flag.NewFlagSet("wsproxy", flag.ContinueOnError)
	fs.SetOutput(output)
	for _, s := range c.settings() {
		if v := getenv(s.env); v != "" {
			if err := s.value.Set(v); err != nil {
				return fmt.Errorf("%s: %w", s.env, err)
			}
		}
		fs.Var(s.value, s.flag, s.usage+" ($"+s.env+")")
	}
	c.TraceContent = strings.EqualFold(getenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"), "true")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: wsproxy [flags]\n       wsproxy version\n\nEvery flag is also an environment variable.\n\n")
		fs.PrintDefaults()
	}
	return fs.Parse(args)
}

// Validate checks the configuration, naming the first bad field.
func (c Config) Validate() error {
	if c.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required (a Postgres URL, e.g. postgres://user@localhost/wsproxy)")
	}
	// The upstreams' base URLs (an empty one but UPSTREAM_BASE_URL takes its default).
	for _, up := range c.upstreams() {
		base := *up.baseURL
		if base == "demo" || (base == "" && !up.primary()) {
			continue
		}
		if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s: %q is not an http(s) URL (or \"demo\")", up.URLSetting, base)
		}
	}
	for _, h := range c.threadHeaders() {
		if !validHeaderName(h) {
			return fmt.Errorf("THREAD_HEADER: %q is not a header name", h)
		}
	}
	if c.ThreadParents != "" && len(c.threadHeaders()) == 0 {
		return errors.New("THREAD_PARENTS: applies to threads named by THREAD_HEADER, which is not set")
	}
	for _, name := range c.threadParents() {
		if _, err := workspace.NewParentID("", name); err != nil {
			return fmt.Errorf("THREAD_PARENTS: %q: %w", name, err)
		}
	}
	if c.ClientKeys != "" && c.UpstreamAPIKey == "" && c.UpstreamBaseURL != "demo" {
		return errors.New("CLIENT_KEYS needs UPSTREAM_API_KEY: clients' keys are wsproxy's, the upstream needs its own")
	}
	if err := c.validateSecrets(); err != nil {
		return err
	}
	if c.ListenAddr == "" {
		return errors.New("LISTEN_ADDR must not be empty")
	}
	if err := c.validateBounds(); err != nil {
		return err
	}
	if _, err := proxy.ParseAllowedRoutes(c.PassThroughRoutes); err != nil {
		return fmt.Errorf("PASSTHROUGH_ROUTES: %w", err)
	}
	if c.WorkspaceUnavailable != "fail" && c.WorkspaceUnavailable != "bypass" {
		return fmt.Errorf("WORKSPACE_UNAVAILABLE: %q is not fail or bypass", c.WorkspaceUnavailable)
	}
	switch c.PromptCacheKey {
	case proxy.PromptCacheKeyAuto, proxy.PromptCacheKeyThread, proxy.PromptCacheKeyOff:
	default:
		return fmt.Errorf("PROMPT_CACHE_KEY: %q is not auto, thread or off", c.PromptCacheKey)
	}
	if _, err := proxy.ParsePlacement(c.WorkspacePlacement); err != nil {
		return fmt.Errorf("WORKSPACE_PLACEMENT: %w", err)
	}
	if _, err := proxy.ParseTrustedProxies(c.TrustedProxies); err != nil {
		return fmt.Errorf("TRUSTED_PROXIES: %w", err)
	}
	if c.EventsPollInterval < 0 {
		return fmt.Errorf("EVENTS_POLL_INTERVAL: %s must not be negative", c.EventsPollInterval)
	}
	if c.EventsPollInterval > time.Second {
		return fmt.Errorf("EVENTS_POLL_INTERVAL: %s is above 1s: a change must reach every replica's event streams within a second of its commit (docs/spec.md §13)", c.EventsPollInterval)
	}
	if c.UI != "on" && c.UI != "off" {
		return fmt.Errorf("UI: %q is not on or off", c.UI)
	}
	if c.MCP != "on" && c.MCP != "off" {
		return fmt.Errorf("MCP: %q is not on or off", c.MCP)
	}
	switch c.UntrustedWrites {
	case "", workspace.UntrustedPropose, workspace.UntrustedApply, workspace.UntrustedRefuse:
	default:
		return fmt.Errorf("UNTRUSTED_WRITES: %q must be propose, apply or refuse", c.UntrustedWrites)
	}
	if c.ProposalsWebhook != "" {
		u, err := url.Parse(c.ProposalsWebhook)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("PROPOSALS_WEBHOOK: %q must be an absolute http or https URL", c.ProposalsWebhook)
		}
	}
	if c.HistoryRetention < 0 {
		return fmt.Errorf("HISTORY_RETENTION: %s must not be negative", c.HistoryRetention)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return err
	}
	if f := strings.ToLower(c.LogFormat); f != "text" && f != "json" {
		return fmt.Errorf("LOG_FORMAT: %q is not text or json", c.LogFormat)
	}
	return nil
}

// validateSecrets refuses a client key, admin token or metrics token shorter than
// auth.MinSecretLength (docs/spec.md §10): the length, not the throttle of failed
// authentication, is what makes guessing them hopeless.
func (c Config) validateSecrets() error {
	for _, s := range [][2]string{{"ADMIN_TOKEN", c.AdminToken}, {"METRICS_TOKEN", c.MetricsToken}} {
		if s[1] != "" && utf8.RuneCountInString(s[1]) < proxy.MinSecretLength {
			return fmt.Errorf("%s: shorter than %d characters (e.g. openssl rand -hex 32)", s[0], proxy.MinSecretLength)
		}
	}
	keys, err := c.clientKeys()
	if err != nil {
		return err
	}
	if keys != nil && keys.ShortKey() != 0 {
		return fmt.Errorf("CLIENT_KEYS: entry %d: the key is shorter than %d characters", keys.ShortKey(), proxy.MinSecretLength)
	}
	return nil
}

// validateBounds checks the settings that bound a turn: its rounds and calls, its bodies, its
// durations.
func (c Config) validateBounds() error {
	if c.MaxToolRounds < 1 || c.MaxToolRounds > 100 {
		return fmt.Errorf("MAX_TOOL_ROUNDS: %d is out of range 1-100", c.MaxToolRounds)
	}
	for _, b := range []struct {
		name string
		n    int64
	}{{"MAX_TOOL_CALLS_PER_ROUND", int64(c.MaxToolCallsPerRound)}, {"MAX_TOOL_CALLS_PER_TURN", int64(c.MaxToolCallsPerTurn)},
		{"MAX_TOOL_ITEMS", int64(c.MaxToolItems)}, {"MAX_TOOL_ARGUMENT_BYTES", c.MaxToolArgumentBytes}} {
		if b.n < 1 || b.n > 1<<31-1 {
			return fmt.Errorf("%s: %d is out of range 1-%d", b.name, b.n, 1<<31-1)
		}
	}
	if c.MaxRequestBytes < 1024 {
		return fmt.Errorf("MAX_REQUEST_BYTES: %d is below 1024", c.MaxRequestBytes)
	}
	if c.MaxBufferedBytes < c.MaxRequestBytes {
		return fmt.Errorf("MAX_BUFFERED_BYTES: %d is below MAX_REQUEST_BYTES (%d)", c.MaxBufferedBytes, c.MaxRequestBytes)
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"DATABASE_TIMEOUT", c.DatabaseTimeout}, {"DATABASE_WAIT", c.DatabaseWait}, {"WORKSPACE_BUDGET", c.WorkspaceBudget}, {"REQUEST_READ_TIMEOUT", c.RequestReadTimeout}, {"UPSTREAM_TIMEOUT", c.UpstreamTimeout},
		{"STREAM_KEEPALIVE", c.StreamKeepalive}, {"SHUTDOWN_TIMEOUT", c.ShutdownTimeout}} {
		if d.d <= 0 {
			return fmt.Errorf("%s: %s must be positive", d.name, d.d)
		}
	}
	return nil
}

// validHeaderName reports an HTTP field name (RFC 9110 §5.1: a token).
func validHeaderName(s string) bool {
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("LOG_LEVEL: %q is not debug, info, warn or error", s)
	}
	return l, nil
}

// clientKeys reads CLIENT_KEYS (nil when unset).
func (c Config) clientKeys() (*proxy.ClientKeys, error) {
	spec := c.ClientKeys
	if spec == "" {
		return nil, nil
	}
	if path, ok := strings.CutPrefix(spec, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("CLIENT_KEYS: %w", err)
		}
		spec = string(b)
	}
	keys, err := proxy.ParseClientKeys(spec)
	if err != nil {
		return nil, fmt.Errorf("CLIENT_KEYS: %w", err)
	}
	return keys, nil
}

// logger builds the configured logger on w.
func (c Config) logger(w io.Writer) *slog.Logger {
	level, _ := parseLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: level}
	if strings.ToLower(c.LogFormat) == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

type stringValue string

func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }

// secretValue is a string flag whose value never shows in the usage text.
type secretValue string

func (v *secretValue) String() string     { return "" }
func (v *secretValue) Set(s string) error { *v = secretValue(s); return nil }

type intValue int

func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%q is not an integer", s)
	}
	*v = intValue(n)
	return nil
}

// byteSize is a number of bytes, written plain (8388608) or with a binary unit (8MiB, 256 MiB).
type byteSize int64

func (v *byteSize) String() string { return strconv.FormatInt(int64(*v), 10) }
func (v *byteSize) Set(s string) error {
	num, unit := strings.TrimSpace(s), int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, unit = strings.TrimSpace(rest), u.n
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/unit {
		return fmt.Errorf("%q is not a size (bytes, or a number with KiB, MiB or GiB)", s)
	}
	*v = byteSize(n * unit)
	return nil
}

type durationValue time.Duration

func (v *durationValue) String() string { return time.Duration(*v).String() }
func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a Go duration (like 3s or 10m)", s)
	}
	*v = durationValue(d)
	return nil
}

// threadHeaders are THREAD_HEADER's header names, in order.
func (c Config) threadHeaders() []string { return commaList(c.ThreadHeader) }

// threadParents are THREAD_PARENTS' names, in order.
func (c Config) threadParents() []string { return commaList(c.ThreadParents) }

// commaList is a comma-separated list's items, trimmed, the empty ones left out.
func commaList(list string) []string {
	var out []string
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.TrimSpace(name); name != "" {
			out = append(out, name)
		}
	}
	return out
}
