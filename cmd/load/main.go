// Command load measures what a proxy adds on top of an upstream. Subcommands:
//
//	load run -url URL [-c 32] [-d 10s] [-stream] [-thread PREFIX] [-size 1024]
//	    N concurrent clients for D against URL (an OpenAI /chat/completions endpoint): prints
//	    requests/s, p50/p90/p99 latency and p50 time to first byte.
//	load upstream -addr ADDR [-tool-round] [-chunks 20]
//	    a fast fake OpenAI upstream; with -tool-round it answers a turn's first call with a
//	    workspace tool call and the second with text.
//	load model -addr ADDR [-ttft 400ms] [-chunks 40] [-interval 25ms]
//	    a fake OpenAI upstream with a hosted model's timing: the first chunk after -ttft, the
//	    others -interval apart, a non-streamed answer after the same total; a request with
//	    X-Load-Tool-Round gets a workspace call first, streamed at the same pace.
//	load bareproxy -addr ADDR -target URL
//	    a bare httputil.ReverseProxy, the baseline a proxy is compared with.
//	load suite -wsproxy BIN [-d 5s] [-rounds 3]
//	    all of the above against each other, interleaved over rounds (needs DATABASE_URL).
//	load latency -wsproxy BIN [-c 100,1000,5000] [-window 10s] [model flags]
//	    streamed turns at the model's latency, open-loop at each number of concurrent streams:
//	    direct, through the bare proxy and through wsproxy (pass-through, a thread turn, one tool
//	    round), one row after the other (needs DATABASE_URL).
//	load cache -wsproxy BIN
//	    what the workspace placement costs a conversation's prompt cache: two scripted sessions
//	    straight to a cache-modelling upstream and through wsproxy with each placement (needs
//	    DATABASE_URL); fails when a tail target is missed.
//	load soak -wsproxy BIN [-d 10m] [-c 16] [-instances 1]
//	    mixed traffic with injected upstream and Postgres faults, then a check of every write,
//	    of memory and of goroutines (needs DATABASE_URL).
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: load run|upstream|model|bareproxy|suite|latency|cache|soak [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runCmd(os.Args[2:])
	case "upstream":
		err = upstreamCmd(os.Args[2:])
	case "model":
		err = modelCmd(os.Args[2:])
	case "bareproxy":
		err = bareProxyCmd(os.Args[2:])
	case "suite":
		err = suiteCmd(os.Args[2:])
	case "latency":
		err = latencyCmd(os.Args[2:])
	case "cache":
		err = cacheCmd(os.Args[2:])
	case "soak":
		err = soakCmd(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}
