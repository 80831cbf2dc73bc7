package proxy

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func readEvents(t *testing.T, stream string) ([]string, error) {
	t.Helper()
	r := NewSSEReader(strings.NewReader(stream))
	var out []string
	for {
		d, err := r.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(d))
	}
}

func TestSSEReader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		stream string
		want   []string
	}{
		{"OpenAI", "data: {\"a\":1}\n\ndata: [DONE]\n\n", []string{`{"a":1}`, "[DONE]"}},
		{"CRLF", "data: x\r\n\r\ndata: y\r\n\r\n", []string{"x", "y"}},
		{"NoSpace", "data:x\n\n", []string{"x"}},
		{"Comments", ": keep-alive\n\n: OPENROUTER PROCESSING\n\ndata: x\n\n", []string{"x"}},
		{"OtherFields", "event: message\nid: 3\nretry: 10\ndata: x\n\n", []string{"x"}},
		{"MultiLine", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"LastEventWithoutBlankLine", "data: x\n\ndata: y", []string{"x", "y"}},
		{"BlankLinesOnly", "\n\n\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := readEvents(t, tt.stream)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestSSEReaderLongLine(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 3*sseReaderBufSize+17)
	got, err := readEvents(t, "data: "+long+"\n\ndata: y\n\n")
	require.NoError(t, err)
	require.Equal(t, []string{long, "y"}, got)
}

func TestSSEReaderLimits(t *testing.T) {
	t.Parallel()
	_, err := readEvents(t, "data: "+strings.Repeat("x", maxSSEEvent+1)+"\n\n")
	require.True(t, errors.Is(err, ErrUpstreamProtocol), "%v", err)
	_, err = readEvents(t, strings.Repeat("junk\n", maxSSEJunkLines+1))
	require.True(t, errors.Is(err, ErrUpstreamProtocol), "%v", err)
}
