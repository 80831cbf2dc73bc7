// Package tools is the five tools the model calls: their names and JSON schemas, the envelope of
// their results, the plan of a call on the view of the list the model was shown (pure: its
// result, its events and what it writes), and the call itself, Run(ctx, ws, call), which gives
// the plan to the workspace to commit (package workspace). It knows neither Postgres nor HTTP.
package tools

import (
	"encoding/json"
)

// Tool names: the five tools the proxy serves. A client may not declare a tool of these names.
const (
	AddPreferences    = "add_preferences"
	ListPreferences   = "list_preferences"
	UpdatePreferences = "update_preferences"
	RemovePreferences = "remove_preferences"
	SetObjective      = "set_objective"
)

// Names lists the five tools in the order their schemas are appended to a request.
var Names = []string{AddPreferences, ListPreferences, UpdatePreferences, RemovePreferences, SetObjective}

// IsTool reports whether name is one of the proxy's tools.
func IsTool(name string) bool {
	switch name {
	case AddPreferences, ListPreferences, UpdatePreferences, RemovePreferences, SetObjective:
		return true
	}
	return false
}

// reasoningProperty is the argument every tool requires: recorded with the call, never needed to
// run it.
var reasoningProperty = obj{
	"type":        "string",
	"description": "One sentence, in your own words, of what you are doing with this call and why.",
}

type obj = map[string]any

var kindProperty = obj{
	"type":        "string",
	"enum":        []string{"hard", "soft"},
	"description": "'hard' for must-haves, 'soft' for preferences.",
}

// Definition is one of the five tools: its name, its description, and its parameters' JSON
// schema; each wire API's tool entry is built from it.
type Definition struct {
	Name, Description string
	Parameters        json.RawMessage
}

func function(name, description string, properties obj, required ...string) Definition {
	properties["action_and_reasoning"] = reasoningProperty
	return Definition{Name: name, Description: description, Parameters: mustEncode(obj{
		"type":       "object",
		"properties": properties,
		"required":   append(required, "action_and_reasoning"),
	})}
}

// All are the five tools, in the order of Names, their schemas encoded once. The descriptions
// carry the instructions of the tools' original documents.
var All = []Definition{
	function(AddPreferences,
		"Record one or more decoded user preferences (hard or soft constraints) that the user explicitly stated, "+
			"in the user's own words. Use this for every add — pass a one-element list to record a single preference. "+
			"A title already recorded is not recorded twice.",
		obj{"items": obj{
			"type":        "array",
			"minItems":    1,
			"description": "The explicitly-stated preferences to record, in order. Pass a single preference as a one-element list.",
			"items": obj{
				"type": "object",
				"properties": obj{
					"title":    obj{"type": "string", "description": "Short label in the user's own words, e.g. 'Academic tone'."},
					"subtitle": obj{"type": "string", "description": "Free-text qualifier in the user's own words, e.g. 'Formal and objective'."},
					"kind":     kindProperty,
				},
				"required": []string{"title"},
			},
		}},
		"items"),
	function(ListPreferences, "List the current preferences / constraints.", obj{}),
	function(UpdatePreferences,
		"Edit the title, subtitle, or kind of one or more existing preferences by their 1-based indices. "+
			"Pass a list of {index, title?, subtitle?, kind?}. Locked preferences are skipped and reported "+
			"so you can tell the user.",
		obj{"updates": obj{
			"type":     "array",
			"minItems": 1,
			"description": "The preferences to edit, each as {index, title?, subtitle?, kind?}; omit a field to keep " +
				"its current value. Pass a single edit as a one-element list.",
			"items": obj{
				"type": "object",
				"properties": obj{
					"index": obj{"type": "integer", "minimum": 1,
						"description": "1-based position of the preference within this conversation (as shown by list_preferences)."},
					"title":    obj{"type": "string", "description": "New short label in the user's own words; omit to keep the current value."},
					"subtitle": obj{"type": "string", "description": "New qualifier in the user's own words; omit to keep the current value."},
					"kind":     kindProperty,
				},
				"required": []string{"index"},
			},
		}},
		"updates"),
	function(RemovePreferences,
		"Remove one or more preferences by their 1-based indices (as shown by list_preferences; pass a list). "+
			"Locked preferences are skipped and reported. Call list_preferences first to confirm the indices, "+
			"and remove only when the user explicitly asks you to drop a preference.",
		obj{"indices": obj{
			"type":        "array",
			"minItems":    1,
			"description": "1-based positions of the preferences to remove (as shown by list_preferences). Pass one or several.",
			"items":       obj{"type": "integer", "minimum": 1},
		}},
		"indices"),
	function(SetObjective,
		"Set or update the Objective — your concise understanding of what the user is trying to achieve. "+
			"Call it on the first substantive turn and whenever your understanding of the goal changes.",
		obj{"text": obj{
			"type": "string",
			"description": "One or two sentences capturing the user's goal as you currently understand it, written " +
				"from the user's perspective in the user's own words (the outcome they want), not a description of your own steps.",
		}},
		"text"),
}

// Definitions are the five tools as chat completions' `tools` entries, in the order of Names,
// encoded once.
var Definitions = func() []json.RawMessage {
	out := make([]json.RawMessage, len(All))
	for i, d := range All {
		out[i] = mustEncode(obj{"type": "function", "function": obj{"name": d.Name, "description": d.Description, "parameters": d.Parameters}})
	}
	return out
}()

func mustEncode(v obj) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
