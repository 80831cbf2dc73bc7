package loadbench

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

// The Messages API's prompt-cache measurement: an agent loop shaped like Claude Code's, straight
// to the fake model under Anthropic's cache rule and through wsproxy with each placement.

// The prices of Anthropic's cache: tokens written at 1.25 times the input price, read at 0.1.
const (
	anthropicWritePrice  = 1.25
	anthropicReadPrice   = 0.10
	messagesAgentSteps   = agentSteps
	messagesAgentTool    = "Bash"
	messagesRoundsTool   = "Exec"
	messagesStepIDPrefix = "toolu_step_"
)

// messagesCacheScript is the Messages agent loop's model: it calls the client's tool step after
// step, twice with a workspace call (beside the step with Bash, in a round of its own before it
// with Exec), and answers once the steps are done.
func messagesCacheScript(req *fake.Request) fake.Answer {
	offered := req.ToolNames()
	steps, afterWorkspace := 0, false
	for i, msg := range req.Messages {
		for _, b := range msg.Blocks() {
			if b.Type != "tool_result" {
				continue
			}
			if strings.HasPrefix(b.ToolUseID, messagesStepIDPrefix) {
				steps++
			} else if i == len(req.Messages)-1 {
				afterWorkspace = true
			}
		}
	}
	tool := messagesAgentTool
	if offered[messagesRoundsTool] {
		tool = messagesRoundsTool
	}
	if steps == messagesAgentSteps {
		return fake.Answer{Text: answer("The task is done.", 1)}
	}
	step := toolCall(fmt.Sprintf("%s%d", messagesStepIDPrefix, steps), tool, map[string]any{"command": fmt.Sprintf("run step %d", steps)})
	if !offered["add_preferences"] || (steps != 10 && steps != 20) {
		return fake.Answer{Calls: []fake.Call{step}}
	}
	ws := toolCall(fmt.Sprintf("toolu_ws_%d", steps), "add_preferences",
		map[string]any{"items": []map[string]any{{"title": fmt.Sprintf("Convention %d", steps)}}, "action_and_reasoning": "The user stated it."})
	switch {
	case tool == messagesAgentTool:
		return fake.Answer{Calls: []fake.Call{ws, step}}
	case !afterWorkspace:
		return fake.Answer{Calls: []fake.Call{ws}}
	}
	return fake.Answer{Calls: []fake.Call{step}}
}

// messagesAgentLoop is a loop shaped like Claude Code's: a system of three text blocks with a
// breakpoint on the last, the client's tools, one user message, then each request resends the
// history with one more tool_use and its tool_result, its breakpoint on the last user block
// (moved there from the one before, as Claude Code does).
func messagesAgentLoop(post func(body map[string]any) (map[string]any, error), tool, model string) error {
	system := []map[string]any{
		{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli;"},
		{"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.", "cache_control": map[string]any{"type": "ephemeral"}},
		{"type": "text", "text": strings.Repeat("Work toward the user's goals with care: read before you edit, run the tests, keep the code style. ", 80),
			"cache_control": map[string]any{"type": "ephemeral"}},
	}
	var tools []any
	for _, n := range []string{tool, "Read", "Edit", "Write", "Grep"} {
		tools = append(tools, map[string]any{"name": n, "description": "The client's " + n + " tool. " + strings.Repeat("It acts on the working folder. ", 20),
			"input_schema": map[string]any{"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}}})
	}
	msgs := []map[string]any{{"role": "user", "content": []map[string]any{
		{"type": "text", "text": "Fix the failing tests of the soil carbon model and keep the code style."}}}}
	mark := func() {
		for _, m := range msgs {
			for _, b := range m["content"].([]map[string]any) {
				delete(b, "cache_control")
			}
		}
		last := msgs[len(msgs)-1]["content"].([]map[string]any)
		last[len(last)-1]["cache_control"] = map[string]any{"type": "ephemeral"}
	}
	for range messagesAgentSteps + 1 {
		mark()
		reply, err := post(map[string]any{"model": model, "max_tokens": 4096, "system": system, "tools": tools, "messages": msgs})
		if err != nil {
			return err
		}
		var content []map[string]any
		var results []map[string]any
		blocks, _ := reply["content"].([]any)
		for _, b := range blocks {
			block := b.(map[string]any)
			content = append(content, block)
			if block["type"] == "tool_use" {
				results = append(results, map[string]any{"type": "tool_result", "tool_use_id": block["id"],
					"content": "exit 0\n" + strings.Repeat("ok   soil/model  0.12s  measured carbon matches the reference cores\n", 30)})
			}
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": content})
		if len(results) == 0 {
			return nil
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": results})
	}
	return errors.New("the Messages agent loop did not end")
}

// messagesFigures is what a Messages session cost one way.
type messagesFigures struct {
	Input, Written, Read int
}

func (f messagesFigures) prompt() int { return f.Input + f.Written + f.Read }
func (f messagesFigures) cost() float64 {
	return float64(f.Input) + anthropicWritePrice*float64(f.Written) + anthropicReadPrice*float64(f.Read)
}
func (f messagesFigures) String() string {
	return fmt.Sprintf("%9d %9d %9d %9d %7.1f%% %10.0f", f.prompt(), f.Input, f.Written, f.Read,
		100*float64(f.Read)/float64(max(f.prompt(), 1)), f.cost())
}

// runMessagesSession runs the Messages agent loop one way and sums the usage the client was told.
// Each way names a model of its own: the ways do not share a cache.
func runMessagesSession(tool string, way cacheWay, thread string) (messagesFigures, error) {
	var f messagesFigures
	err := messagesAgentLoop(func(body map[string]any) (map[string]any, error) {
		out, err := way.post(thread, body, "Anthropic-Version", "2023-06-01")
		if err != nil {
			return nil, err
		}
		var m struct {
			Usage struct {
				Input   int `json:"input_tokens"`
				Written int `json:"cache_creation_input_tokens"`
				Read    int `json:"cache_read_input_tokens"`
			} `json:"usage"`
		}
		var msg map[string]any
		if json.Unmarshal(out, &m) != nil || json.Unmarshal(out, &msg) != nil {
			return nil, fmt.Errorf("%s: not a message: %s", way.name, out)
		}
		f.Input, f.Written, f.Read = f.Input+m.Usage.Input, f.Written+m.Usage.Written, f.Read+m.Usage.Read
		return msg, nil
	}, tool, "claude-cache-"+way.name)
	return f, err
}

// measureMessagesCache runs the Messages agent loops three ways and reports the figures and the
// target.
func measureMessagesCache(b *strings.Builder, direct, wsproxy string) (bool, error) {
	fmt.Fprintf(b, "\nPrompt cache model of the Messages API: Anthropic's rule (the longest prefix written before that ends\n"+
		"at a block boundary up to %d blocks before a breakpoint, at most %d breakpoints, nothing under %d tokens),\n"+
		"writes at %.2fx and reads at %.2fx of the input price.\n", fake.AnthropicLookback, fake.AnthropicMaxBreaks, fake.AnthropicMinTokens, anthropicWritePrice, anthropicReadPrice)
	ok, run := true, time.Now().UnixNano() // threads of their own on every run
	for n, s := range []struct{ name, tool string }{
		{"Messages agent loop like Claude Code's (30 tool_use steps, 2 workspace changes beside them)", messagesAgentTool},
		{"Messages agent loop, the 2 workspace changes in rounds of their own (no target)", messagesRoundsTool},
	} {
		ways := []cacheWay{{"direct", direct, "", ""}, {"system", wsproxy, "system", ""}, {"tail", wsproxy, "tail", ""}}
		figs := map[string]messagesFigures{}
		for _, way := range ways {
			f, err := runMessagesSession(s.tool, way, fmt.Sprintf("cache-messages-%s-%d-%d", way.name, n, run))
			if err != nil {
				return false, err
			}
			figs[way.name] = f
		}
		fmt.Fprintf(b, "\n%s\n%-8s %9s %9s %9s %9s %8s %10s %9s\n", s.name, "way", "prompt", "input", "written", "read", "hit rate", "input cost", "vs direct")
		for _, way := range ways {
			f := figs[way.name]
			fmt.Fprintf(b, "%-8s %s %8.2fx\n", way.name, f, f.cost()/figs["direct"].cost())
		}
		if s.tool == messagesAgentTool {
			d, tail := figs["direct"], figs["tail"]
			ok = cacheCheck(b, "Messages agent loop: tail's input cost at most 1.15x direct's", tail.cost() <= 1.15*d.cost(),
				fmt.Sprintf("%.2fx", tail.cost()/d.cost())) && ok
		}
	}
	return ok, nil
}
