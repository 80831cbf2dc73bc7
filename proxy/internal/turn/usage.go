package turn

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/wsproxy/wsproxy/proxy/internal/rawjson"
	"github.com/wsproxy/wsproxy/workspace"
)

// usageSum adds up the usage objects of a turn's rounds (docs/spec.md §16): one round's goes
// to the client as the upstream sent it; several are merged member by member in the last
// round's order (members only earlier rounds had after them): numbers summed (integers
// saturating at the int64 bounds), objects merged alike, null the same as absent, anything else
// the last round's. It keeps the raw objects and merges them only when asked, so a turn of one
// round decodes nothing; the token counts it sums as it goes.
type usageSum struct {
	raws   []json.RawMessage
	tokens workspace.Usage
}

// usage is one round's usage object as the upstream sent it (nil for none) and its token
// counts, which each dialect's fetch reads in its API's terms (chatTokens, responsesTokens,
// messagesTokens).
type usage struct {
	raw    json.RawMessage
	tokens workspace.Usage
}

// add keeps a round's usage; its raw object must stay unchanged until json is called.
func (u *usageSum) add(r usage) {
	if !isNull(r.raw) {
		u.raws = append(u.raws, r.raw)
		u.tokens.Add(r.tokens)
	}
}

// tokenCount reads a token count: one that is not a non-negative integer counts 0, one past the
// int64 bounds its largest.
func tokenCount(o rawjson.Object, key string) int64 {
	n, _ := strconv.ParseInt(string(o.Get(key)), 10, 64) // past the bounds: the largest
	return max(n, 0)
}

// usageTokens reads a usage object whose prompt is prompt, its cached part cached of the
// object details, and its completion completion: chat completions' and the Responses API's.
func usageTokens(raw json.RawMessage, prompt, details, completion string) usage {
	u := usage{raw: raw}
	o, err := rawjson.Parse(raw)
	if err != nil {
		return u
	}
	u.tokens = workspace.Usage{PromptTokens: tokenCount(o, prompt), CompletionTokens: tokenCount(o, completion)}
	if d, err := rawjson.Parse(o.Get(details)); err == nil {
		u.tokens.CachedPromptTokens = tokenCount(d, "cached_tokens")
	}
	return u
}

// chatTokens reads chat completions' usage: prompt_tokens, prompt_tokens_details.cached_tokens
// and completion_tokens.
func chatTokens(raw json.RawMessage) usage {
	return usageTokens(raw, "prompt_tokens", "prompt_tokens_details", "completion_tokens")
}

// responsesTokens reads the Responses API's usage: input_tokens,
// input_tokens_details.cached_tokens and output_tokens.
func responsesTokens(raw json.RawMessage) usage {
	return usageTokens(raw, "input_tokens", "input_tokens_details", "output_tokens")
}

// keep keeps a completed round's usage object (null: none) for with, without its token counts.
func (u *usageSum) keep(raw json.RawMessage) { u.add(usage{raw: raw}) }

// with is the usage of u's rounds and of raw, the round under way (null: none), as json makes
// it; u stays as it is.
func (u *usageSum) with(raw json.RawMessage) json.RawMessage {
	sum := usageSum{raws: u.raws[:len(u.raws):len(u.raws)]}
	sum.keep(raw)
	return sum.json()
}

func (u *usageSum) empty() bool { return len(u.raws) == 0 }

func (u *usageSum) json() json.RawMessage {
	if len(u.raws) == 0 {
		return nil
	}
	sum := u.raws[0]
	for _, raw := range u.raws[1:] {
		sum = mergeUsage(sum, raw)
	}
	return sum
}

// mergeUsage merges usage object b, the later, into a (see usageSum).
func mergeUsage(a, b json.RawMessage) json.RawMessage {
	bo, err := rawjson.Parse(b)
	if err != nil {
		return a
	}
	ao, err := rawjson.Parse(a)
	if err != nil {
		return b
	}
	out := rawjson.Object{}
	for i, k := range bo.Keys {
		out.Set(k, mergeValue(ao.Get(k), bo.Vals[i]))
	}
	for i, k := range ao.Keys {
		if out.Index(k) < 0 {
			out.Set(k, ao.Vals[i])
		}
	}
	return out.Bytes()
}

func mergeValue(a, b json.RawMessage) json.RawMessage {
	switch {
	case isNull(a):
		return b
	case isNull(b):
		return a
	case a[0] == '{' && b[0] == '{':
		return mergeUsage(a, b)
	case isNumber(a) && isNumber(b):
		return addNumbers(a, b)
	}
	return b
}

func isNumber(v json.RawMessage) bool { return v[0] == '-' || (v[0] >= '0' && v[0] <= '9') }

// addNumbers adds two JSON numbers: integers exactly, saturating at the int64 bounds; others as
// float64.
func addNumbers(a, b json.RawMessage) json.RawMessage {
	x, errX := strconv.ParseInt(string(a), 10, 64)
	y, errY := strconv.ParseInt(string(b), 10, 64)
	if errX == nil && errY == nil {
		return json.RawMessage(strconv.FormatInt(workspace.AddTokens(x, y), 10))
	}
	f, _ := strconv.ParseFloat(string(a), 64)
	g, _ := strconv.ParseFloat(string(b), 64)
	sum := f + g
	if math.IsInf(sum, 0) || math.IsNaN(sum) {
		sum = math.Copysign(math.MaxFloat64, sum)
	}
	format := byte('f')
	if math.Abs(sum) >= 1e21 {
		format = 'g'
	}
	return json.RawMessage(strconv.FormatFloat(sum, format, -1, 64))
}
