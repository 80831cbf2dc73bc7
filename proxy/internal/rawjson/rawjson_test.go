package rawjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	t.Parallel()
	o, err := Parse([]byte(` { "a" : 1 , "b\"c":"x}y", "d":[{"e":"]"}], "e":true,"f":null,"a":2 } `))
	require.NoError(t, err)
	require.Equal(t, []string{"a", `b"c`, "d", "e", "f"}, o.Keys)
	require.Equal(t, "2", string(o.Get("a")), "a repeated key: the last value wins")
	require.Equal(t, `"x}y"`, string(o.Get(`b"c`)))
	require.Equal(t, `[{"e":"]"}]`, string(o.Get("d")))
	require.False(t, o.Has("f"))
	require.True(t, json.Valid(o.Bytes()))
	for _, bad := range []string{``, `[]`, `"s"`, `{"a"}`, `{"a":1,}`, `{"a":1`, `{"a":1} x`, `{"a":[1,]}`, `{"a":"\x01"}`, `{"a":01}`} {
		_, err := Parse([]byte(bad))
		require.ErrorIs(t, err, ErrNotObject, bad)
	}
}

func TestAppendString(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain", `q"uo\te`, "line\nbreak\r\ttab", "\x00\x01\x1f", "é — ü ✓ 🙂", "bad \xff utf8", "<workspace> & </workspace>", "\u2028"} {
		got := AppendString(nil, s)
		require.True(t, json.Valid(got), "%q -> %s", s, got)
		var back string
		require.NoError(t, json.Unmarshal(got, &back))
		require.Equal(t, strings.ToValidUTF8(s, "\uFFFD"), back)
		u, ok := Unquote(got)
		require.True(t, ok)
		require.Equal(t, back, u)
	}
	require.Equal(t, `"a<b>&c"`, string(AppendString(nil, "a<b>&c")), "no HTML escaping")
	m, err := Marshal(map[string]string{"a": "<b>"})
	require.NoError(t, err)
	require.Equal(t, `{"a":"<b>"}`, string(m))
}

func TestSplitAndEach(t *testing.T) {
	t.Parallel()
	got, err := Split([]byte(` [ 1 , "a,]" , {"b":[2,3]}, [], null ] `))
	require.NoError(t, err)
	require.Equal(t, []json.RawMessage{json.RawMessage(`1`), json.RawMessage(`"a,]"`), json.RawMessage(`{"b":[2,3]}`), json.RawMessage(`[]`), json.RawMessage(`null`)}, got)
	got, err = Split([]byte(`[]`))
	require.NoError(t, err)
	require.Empty(t, got)
	for _, bad := range []string{``, `{}`, `null`, `[1,`, `[1 2]`, `[1] 2`, `[tru]`} {
		_, err := Split([]byte(bad))
		require.ErrorIs(t, err, ErrNotArray, bad)
	}
	stop := errors.New("stop")
	seen := 0
	err = Each([]byte(`[1,2,3]`), func(i, _, _ int) error {
		seen++
		if i == 1 {
			return stop
		}
		return nil
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, 2, seen)
}

func TestEachDoesNotAllocate(t *testing.T) {
	b := []byte(`[` + strings.Repeat(`{"role":"user","content":"x"},0,`, 1000) + `null]`)
	n := 0
	allocs := testing.AllocsPerRun(10, func() {
		_ = Each(b, func(int, int, int) error { n++; return nil })
	})
	require.Zero(t, allocs)
}

// FuzzSplit: on valid JSON, Parse and Split agree with encoding/json; on anything else they
// refuse, as Valid does.
func FuzzSplit(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"]}"}],"c\"d":"e\\\\"}`))
	f.Add([]byte(`[ 1 , "x" , [ ] , { } , null , true , -0.5e3 ]`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m map[string]json.RawMessage
		o, err := Parse(b)
		if json.Unmarshal(b, &m) == nil && m != nil {
			if err != nil {
				t.Fatalf("Parse refused an object: %v", err)
			}
			for k, v := range m {
				if !bytes.Equal(bytes.TrimSpace(v), o.Get(k)) {
					t.Fatalf("member %q: %s vs %s", k, v, o.Get(k))
				}
			}
		} else if err == nil {
			t.Fatalf("Parse accepted what encoding/json refuses: %q", b)
		}
		var a []json.RawMessage
		got, err := Split(b)
		if json.Unmarshal(b, &a) == nil && a != nil {
			if err != nil || len(got) != len(a) {
				t.Fatalf("Split: %v, %d elements, want %d", err, len(got), len(a))
			}
			for i := range a {
				if !bytes.Equal(bytes.TrimSpace(a[i]), got[i]) {
					t.Fatalf("element %d: %s vs %s", i, a[i], got[i])
				}
			}
		} else if err == nil {
			t.Fatalf("Split accepted what encoding/json refuses: %q", b)
		}
	})
}

// FuzzValid: Valid agrees with encoding/json.Valid.
func FuzzValid(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, ` {"a" : [1, -0.5e+3, true, false, null, "x\u00e9\n"] } `, `{"a":}`, `[1,]`, `01`, `-`, `1.`, `1e`,
		`"\x01"`, `"\u12G4"`, `"\/"`, `{"a":1}x`, `[[[[]]]]`, "\"\xff\"", `tru`, `nul`, `{"a" 1}`, `{,}`, `[1 2]`, ``, ` `} {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001)))
	f.Add([]byte(strings.Repeat("[", 10000) + strings.Repeat("]", 10000)))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", b, got, want)
		}
	})
}

func TestMember(t *testing.T) {
	t.Parallel()
	b := []byte(` {"role":"user", "content" : "a\"b" ,"x":[1,{"content":2}],"role":"tool"} `)
	start, end, ok := Member(b, "content")
	require.True(t, ok)
	require.Equal(t, `"a\"b"`, string(b[start:end]))
	start, end, ok = Member(b, "role")
	require.True(t, ok)
	require.Equal(t, `"tool"`, string(b[start:end]), "the last of a repeated key, as Parse")
	_, _, ok = Member(b, "missing")
	require.False(t, ok)
	for _, bad := range []string{``, `[]`, `{"content":1,}`, `{"content":1} x`, `{}`} {
		_, _, ok := Member([]byte(bad), "content")
		require.False(t, ok, bad)
	}
}

// FuzzValidWalks: on valid JSON, EachValid and MemberValid, which skip strings without checking
// them, find what Each and Member find.
func FuzzValidWalks(f *testing.F) {
	for _, s := range []string{`[1,"a\"b",{"k":[1,{"x":"\\"}]},null]`, `{"role":"tool","content":"a\\\"]}{","role":"user"}`,
		`{"r\u006fle":"x","k":{"a":[]}}`, ` [ {"a" : "b" } , true ] `, `{"a":1e5,"b":-0.5,"c":false}`, `[]`, `{}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := []byte(s)
		if !Valid(b) {
			EachValid(b, func(start, end int) bool { // never beyond b, and it ends
				if start < 0 || end > len(b) || start > end {
					t.Fatalf("element %d:%d of %d bytes", start, end, len(b))
				}
				return true
			})
			MemberValid(b, "role")
			return
		}
		var want, got [][2]int
		_ = Each(b, func(_, start, end int) error { want = append(want, [2]int{start, end}); return nil })
		EachValid(b, func(start, end int) bool { got = append(got, [2]int{start, end}); return true })
		if len(want) != len(got) {
			t.Fatalf("%q: Each %v, EachValid %v", s, want, got)
		}
		for i := range want {
			if want[i] != got[i] {
				t.Fatalf("%q: Each %v, EachValid %v", s, want, got)
			}
		}
		for _, key := range []string{"role", "a", "k", ""} {
			ws, we, wok := Member(b, key)
			gs, ge, gok := MemberValid(b, key)
			if wok != gok || (wok && (ws != gs || we != ge)) {
				t.Fatalf("%q member %q: Member %d:%d %v, MemberValid %d:%d %v", s, key, ws, we, wok, gs, ge, gok)
			}
		}
	})
}

// TestMembersValid: every member, its key as it lies (KeyIs reads escapes), its value.
func TestMembersValid(t *testing.T) {
	t.Parallel()
	b := []byte(` { "r\u006fle" : "user" , "content":[{"a":"]}\""}],"n":-1.5e3 } `)
	var got []string
	MembersValid(b, func(k []byte, s, e int) { got = append(got, string(k)+"="+string(b[s:e])) })
	require.Equal(t, []string{`"r\u006fle"="user"`, `"content"=[{"a":"]}\""}]`, `"n"=-1.5e3`}, got)
	require.True(t, KeyIs([]byte(`"r\u006fle"`), "role"))
	require.False(t, KeyIs([]byte(`"roles"`), "role"))
}
