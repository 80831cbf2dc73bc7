package proxy

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest"
)

// TestResponseIDs: the ids of a Responses answer, JSON or streamed (each server's flavour),
// however its bytes are split, and none from anywhere else in it (text, metadata, tools, an
// id that is not a string).
func TestResponseIDs(t *testing.T) {
	t.Parallel()
	items := []upstreamtest.Item{upstreamtest.Reasoning("rs_1", "think"), upstreamtest.Message("msg_1", `say "id":"resp_fake" \u0041`),
		upstreamtest.FunctionCall("fc_1", "call_1", "f", `{"id":"resp_fake2"}`)}
	want := []string{"resp_1", "rs_1", "msg_1", "fc_1"}
	hostile := `{"metadata":{"id":"resp_meta"},"id":"resp_1","tools":[{"id":"resp_tool"}],"output":[{"id":"msg_1","content":[{"id":"resp_deep","text":"\"id\":\"resp_text\""}]},` +
		`{"id":{"x":"resp_obj"}},{"id":12},{"type":"x","id":"fc_\u0031"}],"output_text":"x","text":{"format":{"id":"resp_fmt"}}}`
	cases := []struct {
		name string
		sse  bool
		body string
		want []string
	}{
		{"hostile", false, hostile, []string{"resp_1", "msg_1", "fc_1"}},
		{"crlf stream", true, "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\",\"output\":[]}}\r\n\r\n" +
			": comment\r\ndata: {\"type\":\"response.output_item.added\",\r\ndata: \"item\":{\"id\":\"msg_9\"}}\r\n\r\ndata: [DONE]\r\n\r\n", []string{"resp_9", "msg_9"}},
	}
	for _, flavor := range []string{upstreamtest.OpenAI, upstreamtest.Ollama, upstreamtest.VLLM} {
		spec := upstreamtest.ResponseSpec{ID: "resp_1", Flavor: flavor, Items: items}
		cases = append(cases, struct {
			name string
			sse  bool
			body string
			want []string
		}{flavor + " json", false, spec.JSON(), want}, struct {
			name string
			sse  bool
			body string
			want []string
		}{flavor + " stream", true, strings.Join(spec.Events(), ""), want})
	}
	for _, c := range cases {
		for _, size := range []int{1, 2, 3, 7, 64, len(c.body)} {
			x := newResponseIDs(c.sse)
			for b := c.body; b != ""; {
				n := min(size, len(b))
				_, _ = x.Write([]byte(b[:n]))
				b = b[n:]
			}
			require.ElementsMatch(t, c.want, x.ids, "%s, split %d", c.name, size)
		}
	}
}
