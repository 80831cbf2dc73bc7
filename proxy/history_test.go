package proxy

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/wsproxy/wsproxy/proxy/internal/apierr"
	"github.com/wsproxy/wsproxy/proxy/internal/testkit"
	"github.com/wsproxy/wsproxy/workspace"
)

// TestAdminHistory: the events of agent and user changes through the admin REST, filtered and
// ordered, and reverts with their errors.
func TestAdminHistory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var p workspace.Preference
	e.admin("POST", "/admin/v1/threads/h/preferences", map[string]any{"title": "Trains"}, 201, &p)
	e.admin("PATCH", "/admin/v1/threads/h/preferences/"+itoa(p.ID), map[string]any{"locked": true}, 200, nil)
	// A turn whose agent tries to remove it, and sets the objective.
	e.up.Script(reply(cmpl("", call{ID: "a", Name: "remove_preferences", Arguments: `{"indices":[1],"action_and_reasoning":"The user changed their mind about trains."}`},
		call{ID: "b", Name: "set_objective", Arguments: `{"text":"Lisbon","action_and_reasoning":"A goal."}`})), reply(cmpl("ok")))
	require.Equal(t, 200, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "h"}, `{"messages":[{"role":"user","content":"x"}]}`).StatusCode)

	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/h/events", nil, 200, &evs)
	var kinds []string
	for _, ev := range evs.Data {
		kinds = append(kinds, ev.Kind)
	}
	require.Equal(t, []string{"preference_added", "preference_locked", "locked_skip", "objective_set"}, kinds)
	skip := evs.Data[2]
	require.Equal(t, "The user changed their mind about trains.", *skip.Reason)
	require.Equal(t, "agent", skip.Actor)
	require.Equal(t, 1, *skip.Turn)
	e.admin("GET", "/admin/v1/threads/h/events?order=desc&limit=1", nil, 200, &evs)
	require.Equal(t, int64(4), evs.Data[0].ID)
	require.True(t, evs.HasMore)
	e.admin("GET", "/admin/v1/threads/h/events?target=preference:"+itoa(p.ID), nil, 200, &evs)
	require.Len(t, evs.Data, 3)
	e.admin("GET", "/admin/v1/threads/h/events?target=nope", nil, 400, nil)
	e.admin("GET", "/admin/v1/threads/h/events?order=up", nil, 400, nil)
	e.admin("GET", "/admin/v1/threads/nope/events", nil, 404, nil)

	// Revert the objective; a locked_skip is a 400; the addition is a 409 naming the lock.
	var rev workspace.Event
	e.admin("POST", "/admin/v1/threads/h/events/4/revert", nil, 200, &rev)
	require.Equal(t, "revert", rev.Kind)
	require.Equal(t, int64(4), *rev.Reverts)
	require.Nil(t, e.workspace("h").Objective)
	e.admin("POST", "/admin/v1/threads/h/events/3/revert", nil, 400, nil)
	var conflict struct{ Error apierr.Error }
	e.admin("POST", "/admin/v1/threads/h/events/1/revert", nil, 409, &conflict)
	require.Contains(t, conflict.Error.Message, "event 2")
	e.admin("POST", "/admin/v1/threads/h/events/99/revert", nil, 404, nil)

	// Threads by id prefix.
	e.admin("POST", "/admin/v1/threads/other/preferences", map[string]any{"title": "x"}, 201, nil)
	var threads page[workspace.Thread]
	e.admin("GET", "/admin/v1/threads?q=h", nil, 200, &threads)
	require.Len(t, threads.Data, 1)
	require.Equal(t, "h", threads.Data[0].ID)
}

// TestAdminApplyProposal: the agent's refused update of a locked preference keeps its proposal;
// POST …/events/{id}/apply makes it a user change with the lock kept (200 with the new event),
// then 409 as the item changed since; 400 for an event of another kind, 404 for an unknown one.
func TestAdminApplyProposal(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var p workspace.Preference
	e.admin("POST", "/admin/v1/threads/ap/preferences", map[string]any{"title": "Formal tone", "kind": "hard", "locked": true}, 201, &p)
	e.up.Script(reply(cmpl("", call{ID: "a", Name: "update_preferences",
		Arguments: `{"updates":[{"index":1,"title":"Casual tone"}],"action_and_reasoning":"The user writes casually."}`})), reply(cmpl("ok")))
	require.Equal(t, 200, e.post("/v1/chat/completions", map[string]string{"X-Thread-Id": "ap"}, `{"messages":[{"role":"user","content":"x"}]}`).StatusCode)

	var evs page[workspace.Event]
	e.admin("GET", "/admin/v1/threads/ap/events", nil, 200, &evs)
	require.Len(t, evs.Data, 2)
	skip := evs.Data[1]
	require.Equal(t, "locked_skip", skip.Kind)
	require.JSONEq(t, `{"title":"Casual tone","subtitle":"","kind":"hard"}`, string(skip.Proposed))

	var applied workspace.Event
	e.admin("POST", "/admin/v1/threads/ap/events/"+itoa(skip.ID)+"/apply", nil, 200, &applied)
	require.Equal(t, "preference_updated", applied.Kind)
	require.Equal(t, "user", applied.Actor)
	require.JSONEq(t, `{"title":"Casual tone","subtitle":"","kind":"hard","locked":true,"source":"confirmed"}`, string(applied.After),
		"an applied proposal is confirmed (docs/spec.md §19)")
	require.Equal(t, "Casual tone", e.workspace("ap").Preferences[0].Title)
	require.True(t, e.workspace("ap").Preferences[0].Locked)

	var conflict struct{ Error apierr.Error }
	e.admin("POST", "/admin/v1/threads/ap/events/"+itoa(skip.ID)+"/apply", nil, 409, &conflict)
	require.Contains(t, conflict.Error.Message, "event "+itoa(applied.ID))
	e.admin("POST", "/admin/v1/threads/ap/events/1/apply", nil, 400, nil)
	e.admin("POST", "/admin/v1/threads/ap/events/99/apply", nil, 404, nil)
}

// twoReplicas is two proxies on one database whose event streams only Postgres's
// notifications wake (no heartbeat).
func twoReplicas(t *testing.T) (*env, *env) {
	noHeartbeat := func(o *Options) { o.StreamKeepalive = time.Hour }
	e := setup(t, noHeartbeat)
	return e, setupWithPool(t, e.pool, noHeartbeat)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// openStream opens thread's event stream at base, with Last-Event-ID lastID and ?after=after
// when they are not empty.
func (e *env) openStream(base, thread, lastID, after string) *testkit.EventStream {
	e.t.Helper()
	return testkit.OpenStream(e.t, base, thread, lastID, after)
}

// panelClient is a panel client of the proxy.
func (e *env) panelClient() *testkit.PanelClient { return testkit.NewPanelClient(e.t, e.srv.URL) }
