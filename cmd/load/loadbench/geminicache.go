package loadbench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// The Gemini API's prompt-cache measurement: an agent loop shaped like Gemini CLI's (a long
// systemInstruction, the client's functionDeclarations, streamGenerateContent with alt=sse),
// straight to the fake model under Gemini's implicit caching and through wsproxy with each
// placement.

// geminiCachedPrice is the price of a token served by Gemini's implicit cache relative to an
// uncached one (Gemini 2.5 and later: 25 %).
const geminiCachedPrice = 0.25

const (
	geminiTurns     = 12 // the user's turns
	geminiTurnSteps = 3  // the agent's function calls a turn, before its answer
	geminiTool      = "run_shell_command"
	geminiStepID    = "gemini_step_"
)

// geminiCacheScript is the Gemini agent loop's model: each user turn, it calls the client's
// shell function geminiTurnSteps times (one call a request, its result in the next) and then
// answers; every third turn its first call comes with a workspace call beside it (parallel
// function calls, as Gemini makes them) that records, edits or removes a preference, as the chat
// session's model does.
func geminiCacheScript(req *fake.Request) fake.Answer {
	offered := req.ToolNames()
	users, steps := 0, 0
	for _, c := range req.Messages {
		if c.Role == "model" {
			continue
		}
		responses := 0
		for _, p := range c.GeminiParts() {
			if p.FunctionResponse != nil && p.FunctionResponse.Name == geminiTool {
				responses++
			}
		}
		if responses == 0 && !hasFunctionResponse(c) {
			users, steps = users+1, 0 // a turn of the user's: its text (and, with tail, the block)
			continue
		}
		steps += responses
	}
	if steps == geminiTurnSteps {
		return fake.Answer{Text: answer(fmt.Sprintf("Turn %d is done.", users), 1200)}
	}
	step := toolCall(fmt.Sprintf("%s%d_%d", geminiStepID, users, steps), geminiTool, map[string]any{"command": fmt.Sprintf("go test ./soil/... # turn %d step %d", users, steps)})
	if !offered["add_preferences"] || users%3 != 0 || steps != 0 {
		return fake.Answer{Calls: []fake.Call{step}}
	}
	ws := rotatingWorkspaceCall(users)
	ws.ID = fmt.Sprintf("gemini_ws_%d", users)
	return fake.Answer{Calls: []fake.Call{ws, step}}
}

func hasFunctionResponse(c fake.Message) bool {
	for _, p := range c.GeminiParts() {
		if p.FunctionResponse != nil {
			return true
		}
	}
	return false
}

// geminiAgentLoop is a multi-turn agent conversation shaped like Gemini CLI's: a ~2K-token
// systemInstruction, three client functions with long descriptions, and geminiTurns user turns,
// each followed by the agent's function calls, each call's ~700-token functionResponse in a user
// content of its own, until the model answers in text.
func geminiAgentLoop(post func(body map[string]any) ([]map[string]any, error)) error {
	system := map[string]any{"parts": []map[string]any{{"text": "You are an interactive CLI agent specializing in software engineering tasks. " +
		strings.Repeat("Follow the project's conventions, read before you edit, verify with the tests, and explain critical commands first. ", 72)}}}
	var decls []map[string]any
	for _, n := range []string{geminiTool, "read_file", "replace"} {
		decls = append(decls, map[string]any{"name": n, "description": "The client's " + n + " function. " + strings.Repeat("It acts on the files of the working folder. ", 12),
			"parametersJsonSchema": map[string]any{"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}}})
	}
	tools := []map[string]any{{"functionDeclarations": decls}}
	var contents []map[string]any
	for turn := 1; turn <= geminiTurns; turn++ {
		contents = append(contents, map[string]any{"role": "user", "parts": []map[string]any{{"text": fmt.Sprintf("Turn %d: ", turn) +
			strings.Repeat("Make the soil carbon model's tests pass and keep its code style. ", 6)}}})
		for i := 0; ; i++ {
			if i > geminiTurnSteps+1 {
				return fmt.Errorf("turn %d of the Gemini agent loop did not end", turn)
			}
			parts, err := post(map[string]any{"contents": contents, "systemInstruction": system, "tools": tools})
			if err != nil {
				return err
			}
			contents = append(contents, map[string]any{"role": "model", "parts": parts})
			var results []map[string]any
			for _, p := range parts {
				fc, ok := p["functionCall"].(map[string]any)
				if !ok {
					continue
				}
				fr := map[string]any{"name": fc["name"], "response": map[string]any{"output": "exit 0\n" +
					strings.Repeat("ok   soil/model  0.12s  measured carbon matches the reference cores\n", 30)}}
				if id, ok := fc["id"]; ok {
					fr["id"] = id
				}
				results = append(results, map[string]any{"functionResponse": fr})
			}
			if len(results) == 0 {
				break
			}
			contents = append(contents, map[string]any{"role": "user", "parts": results})
		}
	}
	return nil
}

// geminiStream reads a streamGenerateContent?alt=sse answer: its parts (adjacent text parts
// joined, as a client keeps them) and its last usageMetadata.
func geminiStream(body []byte) (parts []map[string]any, prompt, cached int, err error) {
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	seen := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimRight(sc.Text(), "\r"), "data: ")
		if !ok {
			continue
		}
		var chunk struct {
			Candidates []struct {
				Content struct {
					Parts []map[string]any `json:"parts"`
				} `json:"content"`
			} `json:"candidates"`
			UsageMetadata *struct {
				Prompt int `json:"promptTokenCount"`
				Cached int `json:"cachedContentTokenCount"`
			} `json:"usageMetadata"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil {
			return nil, 0, 0, fmt.Errorf("not a Gemini chunk: %s", line)
		}
		seen = true
		if u := chunk.UsageMetadata; u != nil {
			prompt, cached = u.Prompt, u.Cached
		}
		for _, c := range chunk.Candidates {
			for _, p := range c.Content.Parts {
				if t, ok := p["text"].(string); ok && len(p) == 1 && len(parts) > 0 {
					if prev, ok := parts[len(parts)-1]["text"].(string); ok && len(parts[len(parts)-1]) == 1 {
						parts[len(parts)-1]["text"] = prev + t
						continue
					}
				}
				parts = append(parts, p)
			}
		}
	}
	if !seen {
		return nil, 0, 0, errors.New("no Gemini chunk")
	}
	return parts, prompt, cached, sc.Err()
}

// geminiFigures is what a Gemini session cost one way.
type geminiFigures struct{ cacheFigures }

func (f geminiFigures) cost() float64 {
	return float64(f.uncached()) + geminiCachedPrice*float64(f.Cached)
}
func (f geminiFigures) String() string {
	return fmt.Sprintf("%9d %9d %9d %7.1f%% %10.0f", f.Prompt, f.Cached, f.uncached(), 100*f.hitRate(), f.cost())
}

// runGeminiSession runs the Gemini agent loop one way (base: the fake's or wsproxy's URL) and
// sums the usage the client was told. Each way names a model of its own: the ways do not share
// a cache.
func runGeminiSession(base string, way cacheWay, thread string) (geminiFigures, error) {
	var f geminiFigures
	way.url = base + "/v1beta/models/gemini-cache-" + way.name + ":streamGenerateContent?alt=sse"
	err := geminiAgentLoop(func(body map[string]any) ([]map[string]any, error) {
		out, err := way.post(thread, body, "X-Goog-Api-Key", "k")
		if err != nil {
			return nil, err
		}
		parts, prompt, cached, err := geminiStream(out)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", way.name, err)
		}
		f.add(prompt, cached)
		return parts, nil
	})
	return f, err
}

// measureGeminiCache runs the Gemini agent loop three ways and reports the figures and the
// target.
func measureGeminiCache(b *strings.Builder, directBase, wsproxyBase string) (bool, error) {
	fmt.Fprintf(b, "\nPrompt cache model of the Gemini API: implicit caching (the longest common prefix with an earlier\n"+
		"request to the same model, nothing under %d tokens: Flash's minimum), cached input at %.0f%% of the price.\n", fake.GeminiMinTokens, 100*geminiCachedPrice)
	run := time.Now().UnixNano()
	ways := []cacheWay{{"direct", "", "", ""}, {"system", "", "system", ""}, {"tail", "", "tail", ""}}
	figs := map[string]geminiFigures{}
	for _, way := range ways {
		base := wsproxyBase
		if way.placement == "" {
			base = directBase
		}
		f, err := runGeminiSession(base, way, fmt.Sprintf("cache-gemini-%s-%d", way.name, run))
		if err != nil {
			return false, err
		}
		figs[way.name] = f
	}
	fmt.Fprintf(b, "\nGemini agent loop like Gemini CLI's (%d turns of %d function calls, a preference change beside a call every third)\n%-8s %9s %9s %9s %8s %10s %9s\n",
		geminiTurns, geminiTurnSteps, "way", "prompt", "cached", "uncached", "hit rate", "input cost", "vs direct")
	for _, way := range ways {
		f := figs[way.name]
		fmt.Fprintf(b, "%-8s %s %8.2fx\n", way.name, f, f.cost()/figs["direct"].cost())
	}
	d, tail := figs["direct"], figs["tail"]
	return cacheCheck(b, "Gemini agent loop: tail's input cost at most 1.15x direct's", tail.cost() <= 1.15*d.cost(),
		fmt.Sprintf("%.2fx", tail.cost()/d.cost())), nil
}
