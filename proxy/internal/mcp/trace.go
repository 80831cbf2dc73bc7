package mcp

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/wsproxy/wsproxy/proxy/internal/genai"
)

// tracing traces MCP's tool calls as the turn engine traces a turn's: an `execute_tool {name}`
// span below the request's server span, its Postgres statements below it. Off (the zero value)
// it starts no span.
type tracing = genai.Tools

func newTracing(tp trace.TracerProvider, content bool) tracing { return genai.NewTools(tp, content) }
