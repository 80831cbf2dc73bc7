// Package sse reads and writes server-sent events as OpenAI-compatible and Anthropic servers
// send them: `data:` lines (several in one event joined by "\n"), events ending at a blank line,
// an `event:` line's name kept beside the data, comment lines (`: keep-alive`) and other fields
// skipped; written as `data: …\n\n` (with its `event:` line when named).
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// Limits: what a Reader accepts before it calls the stream broken.
const (
	MaxEvent      = 8 << 20 // one event's data (a whole tool call may come in one chunk)
	MaxJunkLines  = 300     // lines in a row that carry no data (comments, other fields)
	readerBufSize = 4 << 10
)

// ErrInvalid is what a Reader returns, wrapped, for a stream that breaks its limits.
var ErrInvalid = errors.New("invalid event stream")

// Reader reads the data of server-sent events, and their names.
type Reader struct {
	r    *bufio.Reader
	data []byte
	line []byte
	name []byte
	// nameStr is name as a string, kept while the events' names repeat (they mostly do).
	nameStr string
}

// NewReader reads events from r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, readerBufSize)}
}

// Next returns the data of the next event; the slice is valid until the next call. It returns
// io.EOF at the end of the stream (a last event without its blank line still counts).
func (s *Reader) Next() ([]byte, error) {
	s.data, s.name = s.data[:0], s.name[:0]
	hasData := false
	junk := 0
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && hasData {
				return s.data, nil
			}
			return nil, err
		}
		if len(line) == 0 { // end of event
			if hasData {
				return s.data, nil
			}
			s.name = s.name[:0] // an event without data: its name goes with it
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if string(field) == "event" {
			s.name = append(s.name[:0], bytes.TrimPrefix(value, []byte(" "))...)
		}
		if string(field) != "data" {
			if junk++; junk > MaxJunkLines {
				return nil, fmt.Errorf("%w: %d lines in a row without data", ErrInvalid, junk)
			}
			continue
		}
		junk = 0
		value = bytes.TrimPrefix(value, []byte(" "))
		if hasData {
			s.data = append(s.data, '\n')
		}
		if len(s.data)+len(value) > MaxEvent {
			return nil, fmt.Errorf("%w: an event over %d bytes", ErrInvalid, MaxEvent)
		}
		s.data = append(s.data, value...)
		hasData = true
	}
}

// Name is the name of the event Next returned last (its event field; "" for none).
func (s *Reader) Name() string {
	if string(s.name) != s.nameStr {
		s.nameStr = string(s.name)
	}
	return s.nameStr
}

// EventBuffered reports whether a whole further event is already buffered, so that Next will not
// wait for the network.
func (s *Reader) EventBuffered() bool {
	b, _ := s.r.Peek(s.r.Buffered())
	return bytes.Contains(b, []byte("\n\n")) || bytes.Contains(b, []byte("\r\n\r\n"))
}

// readLine returns the next line without its end (\n, \r\n, or nothing at EOF).
func (s *Reader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		frag, err := s.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(s.line)+len(frag) > MaxEvent {
				return nil, fmt.Errorf("%w: a line over %d bytes", ErrInvalid, MaxEvent)
			}
			s.line = append(s.line, frag...)
			continue
		}
		if err != nil && (err != io.EOF || len(frag)+len(s.line) == 0) {
			return nil, err
		}
		var line []byte
		if len(s.line) > 0 {
			s.line = append(s.line, frag...)
			line = s.line
		} else {
			line = frag
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		return line, nil
	}
}

// SetHeaders sets the response headers of an event stream: its content type, no caching, and no
// buffering by nginx in front.
func SetHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
}

// AppendEvent appends one event carrying data.
func AppendEvent(buf, data []byte) []byte { return AppendNamedEvent(buf, "", data) }

// AppendNamedEvent appends one event carrying data under the event name (none when "", which
// must hold no line break); data with line breaks goes out as one data line per line, as a
// Reader joins them.
func AppendNamedEvent(buf []byte, name string, data []byte) []byte {
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	for {
		line, rest, more := bytes.Cut(data, []byte("\n"))
		buf = append(buf, "data: "...)
		buf = append(buf, line...)
		buf = append(buf, '\n')
		if !more {
			break
		}
		data = rest
	}
	return append(buf, '\n')
}
