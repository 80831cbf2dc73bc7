package turn

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/workspace"
)

// TestResponsesStreamTerminalAfterUndecidedCall: a call whose name came empty is still undecided
// when the terminal event arrives; the events held behind it go out, then the terminal event as
// the upstream sent it, with the turn's response.
func TestResponsesStreamTerminalAfterUndecidedCall(t *testing.T) {
	t.Parallel()
	up := &script{replies: bodies(sseEvents(
		`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}`,
		`{"type":"response.output_item.added","sequence_number":1,"output_index":0,`+
			`"item":{"id":"fc_1","type":"function_call","call_id":"call_1","name":"","arguments":"","status":"in_progress"}}`,
		`{"type":"response.function_call_arguments.delta","sequence_number":2,"item_id":"fc_1","output_index":0,"delta":"{}"}`,
		`{"type":"response.completed","sequence_number":3,"response":{"id":"resp_1","object":"response","status":"completed",`+
			`"output":[{"id":"fc_1","type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{}","status":"completed"}],`+
			`"usage":{"input_tokens":10,"output_tokens":5}}}`,
	))}
	req, err := ParseResponsesRequest([]byte(`{"model":"m","stream":true,"input":"hi","tools":[{"type":"function","name":"get_weather","parameters":{}}]}`))
	require.NoError(t, err)
	tt := newTurn(t, workspace.Limits{}, up)
	out := &recorder{}
	_, err = (&Runner{}).Run(context.Background(), tt, req.Stream(tt, out))
	require.NoError(t, err)
	events := out.decoded(t)
	types := make([]any, len(events))
	for i, e := range events {
		types[i] = e["type"]
	}
	require.Equal(t, []any{"response.created", "response.output_item.added", "response.function_call_arguments.delta", "response.completed"}, types)
	last := events[len(events)-1]
	require.NotContains(t, last, "output_index")
	require.NotContains(t, last, "delta")
	require.EqualValues(t, 3, last["sequence_number"])
	require.Equal(t, "resp_1", last["response"].(map[string]any)["id"])
}

// TestResponsesStreamHoldsBoundedEvents: the events behind a call whose owner is not known yet
// are held up to a bound; past it the call is the client's: its events go out at once, and it is
// not run even though the terminal response names a workspace tool.
func TestResponsesStreamHoldsBoundedEvents(t *testing.T) {
	t.Parallel()
	events := []string{
		`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}`,
		`{"type":"response.output_item.added","sequence_number":1,"output_index":0,` +
			`"item":{"id":"fc_1","type":"function_call","call_id":"call_1","name":"","arguments":"","status":"in_progress"}}`,
	}
	piece := strings.Repeat("x", 1024)
	for i := range 9000 {
		events = append(events, fmt.Sprintf(`{"type":"response.function_call_arguments.delta","sequence_number":%d,"item_id":"fc_1","output_index":0,"delta":"%s"}`, i+2, piece))
	}
	events = append(events, `{"type":"response.completed","sequence_number":9002,"response":{"id":"resp_1","object":"response","status":"completed",`+
		`"output":[{"id":"fc_1","type":"function_call","call_id":"call_1","name":"set_objective","arguments":"{\"text\":\"x\"}","status":"completed"}],`+
		`"usage":{"input_tokens":10,"output_tokens":5}}}`)
	body := sseEvents(events...)
	answer := sseEvents(`{"type":"response.completed","sequence_number":0,"response":{"id":"resp_2","object":"response","status":"completed","output":[]}}`)
	up := &script{replies: bodies(body, answer)}
	req, err := ParseResponsesRequest([]byte(`{"model":"m","stream":true,"input":"hi","tools":[{"type":"function","name":"get_weather","parameters":{}}]}`))
	require.NoError(t, err)
	tt := newTurn(t, workspace.Limits{}, up)
	readAtFirstDelta := -1
	out := &recorder{}
	out.onEmit = func(e event) {
		if readAtFirstDelta < 0 && strings.Contains(string(e.data), "function_call_arguments.delta") {
			readAtFirstDelta = up.read.n
		}
	}
	rounds, err := (&Runner{}).Run(context.Background(), tt, req.Stream(tt, out))
	require.NoError(t, err)
	require.Equal(t, 1, rounds, "the call is the client's")
	require.Positive(t, readAtFirstDelta)
	require.Less(t, readAtFirstDelta, len(body)-len(piece)*100, "the held events went out before the round ended")
	last := out.decoded(t)[len(out.events)-1]
	require.Equal(t, "response.completed", last["type"])
	require.Len(t, last["response"].(map[string]any)["output"], 1, "the client's call")
	d, err := tt.Workspace.Get(context.Background())
	require.NoError(t, err)
	require.Nil(t, d.Objective, "not run")
}

// TestResponsesStreamCallWithoutItemID: a workspace call whose item has no id hides its own
// events, and no other event of the round: the message beside it, whose item_added event names
// no item_id, reaches the client.
func TestResponsesStreamCallWithoutItemID(t *testing.T) {
	t.Parallel()
	up := &script{replies: bodies(sseEvents(
		`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}`,
		`{"type":"response.output_item.added","sequence_number":1,"output_index":0,`+
			`"item":{"type":"function_call","call_id":"call_1","name":"set_objective","arguments":"","status":"in_progress"}}`,
		`{"type":"response.function_call_arguments.delta","sequence_number":2,"output_index":0,"delta":"{\"text\":\"A goal\",\"action_and_reasoning\":\"Said so.\"}"}`,
		`{"type":"response.output_item.added","sequence_number":3,"output_index":1,`+
			`"item":{"id":"msg_1","type":"message","role":"assistant","status":"in_progress","content":[]}}`,
		`{"type":"response.output_text.delta","sequence_number":4,"item_id":"msg_1","output_index":1,"content_index":0,"delta":"Noted."}`,
		`{"type":"response.completed","sequence_number":5,"response":{"id":"resp_1","object":"response","status":"completed",`+
			`"output":[{"type":"function_call","call_id":"call_1","name":"set_objective","arguments":"{\"text\":\"A goal\",\"action_and_reasoning\":\"Said so.\"}","status":"completed"},`+
			`{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Noted.","annotations":[]}]}],`+
			`"usage":{"input_tokens":10,"output_tokens":5}}}`,
	), sseEvents(
		`{"type":"response.created","sequence_number":0,"response":{"id":"resp_2","object":"response","status":"in_progress","output":[]}}`,
		`{"type":"response.completed","sequence_number":1,"response":{"id":"resp_2","object":"response","status":"completed",`+
			`"output":[],"usage":{"input_tokens":10,"output_tokens":1}}}`,
	))}
	req, err := ParseResponsesRequest([]byte(`{"model":"m","stream":true,"input":"hi"}`))
	require.NoError(t, err)
	tt := newTurn(t, workspace.Limits{}, up)
	out := &recorder{}
	_, err = (&Runner{}).Run(context.Background(), tt, req.Stream(tt, out))
	require.NoError(t, err)
	var added []any
	for _, e := range out.decoded(t) {
		if e["type"] == "response.output_item.added" {
			added = append(added, e["item"].(map[string]any)["type"])
		}
	}
	require.Equal(t, []any{"message"}, added, "the message beside the workspace call")
}
