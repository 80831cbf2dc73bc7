package sse

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func readEvents(t *testing.T, stream string) ([]string, error) {
	t.Helper()
	r := NewReader(strings.NewReader(stream))
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

func TestReader(t *testing.T) {
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

func TestReaderLongLine(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 3*readerBufSize+17)
	got, err := readEvents(t, "data: "+long+"\n\ndata: y\n\n")
	require.NoError(t, err)
	require.Equal(t, []string{long, "y"}, got)
}

func TestReaderLimits(t *testing.T) {
	t.Parallel()
	_, err := readEvents(t, "data: "+strings.Repeat("x", MaxEvent+1)+"\n\n")
	require.True(t, errors.Is(err, ErrInvalid), "%v", err)
	_, err = readEvents(t, strings.Repeat("junk\n", MaxJunkLines+1))
	require.True(t, errors.Is(err, ErrInvalid), "%v", err)
}

func TestAppendEvent(t *testing.T) {
	t.Parallel()
	require.Equal(t, "x: data: {\"a\":1}\n\n", string(AppendEvent([]byte("x: "), []byte(`{"a":1}`))))
}

// FuzzReader: any byte stream is read to its end, event by event, without a panic; every event
// read back from AppendEvent is the data written.
func FuzzReader(f *testing.F) {
	f.Add("data: {\"a\":1}\n\ndata: [DONE]\n\n", "x")
	f.Add(": comment\r\ndata: a\r\ndata: b\r\n\r\nevent: e\n\n", "")
	f.Add("data:x", "{}")
	f.Fuzz(func(t *testing.T, stream, data string) {
		r := NewReader(strings.NewReader(stream))
		for range 100000 {
			if _, err := r.Next(); err != nil {
				break
			}
		}
		if strings.ContainsAny(data, "\r\n") {
			return
		}
		got, err := readEvents(t, string(AppendEvent(nil, []byte(data))))
		require.NoError(t, err)
		require.Equal(t, []string{data}, got)
	})
}

func BenchmarkReader(b *testing.B) {
	event := "data: " + `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" word"},"finish_reason":null}]}` + "\n\n"
	stream := strings.Repeat(event, 1000)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		r := NewReader(strings.NewReader(stream))
		for {
			if _, err := r.Next(); err != nil {
				break
			}
		}
	}
}
