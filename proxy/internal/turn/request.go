package turn

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
)

// The parts of a request every dialect reads alike: its top-level members, and the elements of
// its arrays (messages, input items, contents) as runs of the body's bytes.

// extent is where an element lies in its array: msgs[start:end].
type extent struct{ start, end int }

// elements is where the elements of an array lie: n of them; first, second and last their spans,
// beforeLast the end of the one before the last.
type elements struct {
	n                   int
	first, second, last extent
	beforeLast          int
}

// objects finds the elements of list, an array of objects named name in the request: 400 for
// an element that is not an object (naming it), or with notArray for a list that is not an array.
func objects(list json.RawMessage, name, notArray string) (elements, error) {
	var el elements
	err := rawjson.Each(list, func(i, start, end int) error {
		if list[start] != '{' {
			return apierr.BadRequest("invalid_type", fmt.Sprintf("%s[%d]", name, i), "%s[%d] must be an object", name, i)
		}
		switch i {
		case 0:
			el.first = extent{start, end}
		case 1:
			el.second = extent{start, end}
		}
		el.beforeLast, el.last, el.n = el.last.end, extent{start, end}, i+1
		return nil
	})
	if err != nil {
		var e *apierr.Error
		if errors.As(err, &e) {
			return elements{}, e
		}
		return elements{}, apierr.BadRequest("invalid_type", name, "%s", notArray)
	}
	return el, nil
}

// topLevel is a request's top-level members, as the client sent them, and its "stream".
type topLevel struct {
	fields   rawjson.Object
	streamed bool
	// kind is the request's kind when it is left alone ("" for a turn).
	kind string
}

// Kind is the request's kind (Request.Kind).
func (f *topLevel) Kind() string { return cmp.Or(f.kind, KindTurn) }

// parseTop reads a request body's top-level members (checking the whole body as it goes): an
// error for a body that is not a JSON object.
func parseTop(body []byte) (topLevel, error) {
	top, err := rawjson.Parse(body)
	if err != nil {
		if !rawjson.Valid(body) {
			return topLevel{}, apierr.InvalidJSON(body)
		}
		return topLevel{}, apierr.BadRequest("invalid_json", "", "the request body must be a JSON object")
	}
	t := topLevel{fields: top}
	if s := top.Get("stream"); s != nil {
		_ = json.Unmarshal(s, &t.streamed)
	}
	return t, nil
}

// Streamed reports whether the client asked for a stream.
func (f *topLevel) Streamed() bool { return f.streamed }

// Model is the model the request names ("" when none).
func (f *topLevel) Model() string {
	m, _ := rawjson.Unquote(f.fields.Get("model"))
	return m
}

// setDefault sets a top-level member the client did not send.
func (f *topLevel) setDefault(key string, value json.RawMessage) {
	if f.fields.Get(key) == nil {
		f.fields.Set(key, value)
	}
}

// elementRun is the run of elements of an array of vals (without its brackets).
func elementRun(vals []json.RawMessage) json.RawMessage {
	a := rawjson.AppendArray(nil, vals)
	return a[1 : len(a)-1]
}
