// Command load measures what a proxy adds on top of an upstream. Each subcommand is a type with
// a Run method that owns its flags and usage text (load SUBCOMMAND -h); the measuring is in
// package loadbench, the fake model in proxy/upstreamtest/fake.
//
//	load run -url URL [-c 32] [-d 10s] [-stream] [-thread PREFIX [-threads N]] [-size 1024]
//	    N concurrent clients for D against URL (an OpenAI /chat/completions endpoint): prints
//	    requests/s, p50/p90/p99 latency and p50 time to first byte.
//	load upstream [-addr ADDR] [-tool-round] [-chunks 20]
//	    the fake model as fast as it can; with -tool-round it answers a turn's first call with a
//	    workspace tool call and the second with text.
//	load model [-addr ADDR] [-ttft 400ms] [-chunks 40] [-interval 25ms]
//	    the fake model at a hosted model's pace: the first chunk after -ttft, the others
//	    -interval apart, a non-streamed answer after the same total; a request with
//	    X-Load-Tool-Round gets a workspace call first, streamed at the same pace.
//	load bareproxy [-addr ADDR] -target URL
//	    a bare httputil.ReverseProxy, the baseline a proxy is compared with.
//	load floor [-addr ADDR] -target URL [-tool-round]
//	    the least a Go proxy can do for a thread turn (one statement, one upstream exchange) or a
//	    tool round (and a durable write, a second exchange): the floor under wsproxy's turns
//	    (needs DATABASE_URL; BENCHMARKS.md).
//	load suite -wsproxy BIN [-d 5s] [-rounds 3] [-size 1024]
//	    all of the above against each other, interleaved over rounds (needs DATABASE_URL and
//	    NOFSYNC_DATABASE_URL; make bench-load).
//	load latency -wsproxy BIN [-c 100,1000,5000] [-window 10s] [model flags] …
//	    streamed turns at the model's latency, open-loop at each number of concurrent streams:
//	    direct, through the bare proxy and through wsproxy (pass-through, a thread turn, one tool
//	    round), one row after the other (needs DATABASE_URL; make bench-latency).
//	load cache -wsproxy BIN
//	    what the workspace placement costs a conversation's prompt cache: scripted sessions
//	    straight to the fake model with its prompt cache and through wsproxy with each placement
//	    (needs DATABASE_URL; make bench-cache); fails when a tail target is missed.
//	load soak -wsproxy BIN [-d 10m] [-c 16] [-instances 2]
//	    mixed traffic with injected upstream and Postgres faults, then a check of every write,
//	    of memory and of goroutines (needs DATABASE_URL; make soak).
//	load writes -wsproxy BIN [-c 8,32,128] [-d 3s] [-rounds 3] [-floor]
//	    workspace writes per second (user edits, tool rounds) beside a plain durable insert at
//	    each number of concurrent writers, interleaved, and the delay of their events to a
//	    stream on a second replica (needs DATABASE_URL, durable; make bench-writes).
//	load failover -wsproxy BIN [-sync] [-lag 1s] [-c 8] [-faults 2] [-between 10s]
//	    two local clusters with streaming replication, two wsproxy instances naming both hosts,
//	    mixed traffic, and the primary stopped hard and the standby promoted, -faults times;
//	    prints per fault what failed, for how long, and what acknowledged was lost (make failover).
//
// The harness starts the fake model and the bare proxy as processes of their own (this program
// again, with upstream, model or bareproxy), so that each one's CPU time is its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/wsproxy/wsproxy/cmd/load/loadbench"
	"github.com/wsproxy/wsproxy/proxy/upstreamtest/fake"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // a second signal ends the program at once
	err := run(ctx, os.Args[1:])
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// usage lists the subcommands.
const usage = `usage: load SUBCOMMAND [flags]   (load SUBCOMMAND -h for its flags)

  run        concurrent clients against a chat completions URL
  upstream   the fake model, as fast as it can
  model      the fake model, at a hosted model's pace
  bareproxy  a bare httputil.ReverseProxy
  floor      the least a Go proxy can do for a thread turn or a tool round
  suite      the load comparison (make bench-load)
  latency    the latency table (make bench-latency)
  cache      the prompt-cache measurement (make bench-cache)
  soak       the soak (make soak)
  failover   the primary stopped hard and its standby promoted, under load (make failover)
  writes     workspace writes per second beside a plain durable insert (make bench-writes)
`

// command is a subcommand.
type command interface {
	Run(ctx context.Context, args []string) error
}

// run builds the subcommand named by args[0] and runs it with the rest.
func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return flag.ErrHelp
	}
	var cmd command
	switch args[0] {
	case "run":
		cmd = &RunCommand{}
	case "upstream":
		cmd = &UpstreamCommand{}
	case "model":
		cmd = &ModelCommand{}
	case "bareproxy":
		cmd = &BareProxyCommand{}
	case "floor":
		cmd = &FloorCommand{}
	case "suite":
		cmd = &SuiteCommand{}
	case "latency":
		cmd = &LatencyCommand{}
	case "cache":
		cmd = &CacheCommand{}
	case "soak":
		cmd = &SoakCommand{}
	case "failover":
		cmd = &FailoverCommand{}
	case "writes":
		cmd = &WritesCommand{}
	case "-h", "-help", "--help", "help":
		fmt.Fprint(os.Stderr, usage)
		return flag.ErrHelp
	default:
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("unknown subcommand %q", args[0])
	}
	return cmd.Run(ctx, args[1:])
}

// flags is a subcommand's flag set, printing text and its flags as its usage.
func flags(name, text string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: load %s\n\n", strings.TrimSpace(text))
		fs.PrintDefaults()
	}
	return fs
}

// timingFlags registers the fake model's timing flags on fs, with t's values as their defaults.
func timingFlags(fs *flag.FlagSet, t *fake.Timing) {
	fs.DurationVar(&t.TTFT, "ttft", t.TTFT, "time to the first token")
	fs.IntVar(&t.Chunks, "chunks", t.Chunks, "chunks of a streamed answer (the first at -ttft)")
	fs.DurationVar(&t.Interval, "interval", t.Interval, "time between two chunks")
}

// RunCommand is load run.
type RunCommand struct{}

func (*RunCommand) Run(ctx context.Context, args []string) error {
	fs := flags("run", `run -url URL [flags]

N concurrent clients for D against URL (an OpenAI /chat/completions endpoint): prints
requests/s, p50/p90/p99 latency and p50 time to first byte.`)
	u := fs.String("url", "", "chat completions URL")
	clients := fs.Int("c", 32, "concurrent clients")
	d := fs.Duration("d", 10*time.Second, "duration")
	stream := fs.Bool("stream", false, "ask for a streamed response")
	thread := fs.String("thread", "", "name a thread per client: PREFIX-N")
	threads := fs.Int("threads", 1, "with -thread: each client's requests go to this many threads of its own in turn (PREFIX-N-K)")
	size := fs.Int("size", 1024, "request body size in bytes")
	keys := fs.String("keys", "", "wsproxy client keys, comma-separated: client N sends the (N mod count)th as its bearer token")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *u == "" {
		return errors.New("-url is required")
	}
	var keyList []string
	if *keys != "" {
		keyList = strings.Split(*keys, ",")
	}
	r := loadbench.Load{URL: *u, Clients: *clients, Duration: *d, Stream: *stream, ThreadPrefix: *thread, Threads: *threads,
		Keys: keyList, Body: loadbench.RequestBody(*size, *stream)}.Run(ctx)
	fmt.Println(r)
	return nil
}

// UpstreamCommand is load upstream.
type UpstreamCommand struct{}

func (*UpstreamCommand) Run(ctx context.Context, args []string) error {
	fs := flags("upstream", `upstream [flags]

The fake model (chat completions and the Messages API) as fast as it can; with -tool-round it
answers a turn's first call with a workspace tool call and the second with text. It prints the
address it listens on.`)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	toolRound := fs.Bool("tool-round", false, "answer a turn's first call with a workspace tool call")
	chunks := fs.Int("chunks", 20, "content chunks of a streamed answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return loadbench.ServeCounted(ctx, *addr, fake.New(fake.Options{ToolRound: *toolRound, Timing: fake.Timing{Chunks: *chunks}}))
}

// ModelCommand is load model.
type ModelCommand struct{}

func (*ModelCommand) Run(ctx context.Context, args []string) error {
	fs := flags("model", `model [flags]

The fake model at a hosted model's pace: the first chunk after -ttft, the others -interval
apart, a non-streamed answer after the same total; a request with `+fake.ToolRoundHeader+` gets a
workspace call first, streamed at the same pace. It prints the address it listens on.`)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	timing := fake.HostedTiming
	timingFlags(fs, &timing)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return loadbench.ServeCounted(ctx, *addr, fake.New(fake.Options{Timing: timing}))
}

// BareProxyCommand is load bareproxy.
type BareProxyCommand struct{}

func (*BareProxyCommand) Run(ctx context.Context, args []string) error {
	fs := flags("bareproxy", `bareproxy -target URL [flags]

A bare httputil.ReverseProxy to URL, the baseline a proxy is compared with. It prints the
address it listens on.`)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	target := fs.String("target", "", "upstream base URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("-target: %q is not a URL", *target)
	}
	return loadbench.ServeCounted(ctx, *addr, loadbench.BareProxy(u))
}

// FloorCommand is load floor.
type FloorCommand struct{}

func (*FloorCommand) Run(ctx context.Context, args []string) error {
	fs := flags("floor", `floor -target URL [flags]

The least a Go proxy in front of Postgres (DATABASE_URL) can do for a thread turn: one statement
that counts the turn on its thread's row (X-Thread-Id) without waiting for the disk, then the
request's body posted to URL (a chat completions endpoint) as it came. With -tool-round, a tool
round's least on top: a one-row write that waits for the disk, and the body posted again. The
floor under wsproxy's figures, as the bare proxy is under a pass-through's. It prints the
address it listens on.`)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	target := fs.String("target", "", "upstream chat completions URL")
	toolRound := fs.Bool("tool-round", false, "a durable write and a second upstream exchange per request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("-target: %q is not a URL", *target)
	}
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		return errors.New("DATABASE_URL is required")
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	if err := loadbench.FloorSchema(ctx, pool); err != nil {
		return err
	}
	return loadbench.ServeCounted(ctx, *addr, loadbench.Floor(u, pool, *toolRound))
}

// SuiteCommand is load suite.
type SuiteCommand struct{}

func (*SuiteCommand) Run(ctx context.Context, args []string) error {
	fs := flags("suite", `suite [flags]

The load comparison of make bench-load: direct, a bare reverse proxy, and wsproxy without a
thread, with one, with a tool round, streamed and not, and the floor under a thread turn and a
tool round (load floor), interleaved over rounds. It needs
DATABASE_URL (a durable Postgres) and NOFSYNC_DATABASE_URL (one with fsync off).`)
	s := loadbench.Suite{DatabaseURL: os.Getenv("DATABASE_URL"), NofsyncDatabaseURL: os.Getenv("NOFSYNC_DATABASE_URL")}
	fs.StringVar(&s.Wsproxy, "wsproxy", "bin/wsproxy", "the wsproxy binary")
	fs.DurationVar(&s.Duration, "d", 5*time.Second, "duration of each run")
	fs.IntVar(&s.Rounds, "rounds", 3, "rounds, each running every scenario once per concurrency")
	fs.IntVar(&s.Size, "size", 1024, "request body size")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s.DatabaseURL == "" || s.NofsyncDatabaseURL == "" {
		return errors.New("DATABASE_URL (a durable Postgres) and NOFSYNC_DATABASE_URL (one with fsync off) are required (make bench-load provides them)")
	}
	return s.Run(ctx)
}

// LatencyCommand is load latency.
type LatencyCommand struct{}

func (*LatencyCommand) Run(ctx context.Context, args []string) error {
	fs := flags("latency", `latency [flags]

The latency table of make bench-latency: streamed turns at the model's latency, open-loop at
each number of concurrent streams: direct, through the bare proxy and through wsproxy
(pass-through, a thread turn, one tool round), one row after the other. It needs DATABASE_URL.`)
	l := loadbench.Latency{DatabaseURL: os.Getenv("DATABASE_URL"), Timing: fake.HostedTiming}
	fs.StringVar(&l.Wsproxy, "wsproxy", "bin/wsproxy", "the wsproxy binary")
	streams := fs.String("c", "100,1000,5000", "concurrent streams of the rows, comma-separated")
	fs.DurationVar(&l.Window, "window", 10*time.Second, "the measured part of each row, after its ramp")
	fs.IntVar(&l.Size, "size", 1024, "request body size in bytes")
	only := fs.String("scenarios", "", "run only the scenarios whose names contain one of these comma-separated words")
	fs.IntVar(&l.Rounds, "rounds", 1, "rounds of the rows at each load, one after the other; the table gives each figure's median")
	fs.IntVar(&l.Pool, "pool", 0, "wsproxy's pool size (pool_max_conns in its DATABASE_URL; 0: the URL's, else pgx's default)")
	fs.StringVar(&l.Before, "before", "", "another wsproxy binary (an earlier build) whose rows run just before each wsproxy row, for a comparison")
	timingFlags(fs, &l.Timing)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if l.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required (make bench-latency provides a durable Postgres)")
	}
	for _, f := range strings.Split(*streams, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-c: %q is not a number of streams", f)
		}
		l.Streams = append(l.Streams, n)
	}
	if *only != "" {
		l.Scenarios = strings.Split(*only, ",")
	}
	return l.Run(ctx)
}

// CacheCommand is load cache.
type CacheCommand struct{}

func (*CacheCommand) Run(ctx context.Context, args []string) error {
	fs := flags("cache", `cache [flags]

What each workspace placement costs a conversation's upstream prompt cache (make bench-cache):
scripted chat, agent and Messages agent sessions straight to the fake model with its prompt
cache and through wsproxy with each placement; fails when a tail target is missed. It needs
DATABASE_URL.`)
	c := loadbench.Cache{DatabaseURL: os.Getenv("DATABASE_URL")}
	fs.StringVar(&c.Wsproxy, "wsproxy", "bin/wsproxy", "the wsproxy binary")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required (make bench-cache provides one)")
	}
	return c.Run(ctx)
}

// SoakCommand is load soak.
type SoakCommand struct{}

func (*SoakCommand) Run(ctx context.Context, args []string) error {
	fs := flags("soak", `soak [flags]

Mixed traffic against wsproxy instances on one Postgres with injected upstream and Postgres
faults, then a check of every write, of memory and of goroutines (make soak). It needs
DATABASE_URL.`)
	s := loadbench.Soak{DatabaseURL: os.Getenv("DATABASE_URL")}
	fs.StringVar(&s.Wsproxy, "wsproxy", "bin/wsproxy", "the wsproxy binary")
	fs.DurationVar(&s.Duration, "d", 10*time.Minute, "duration")
	fs.IntVar(&s.Clients, "c", 16, "concurrent clients")
	fs.IntVar(&s.Instances, "instances", 2, "wsproxy instances on the one Postgres, reached round-robin")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if s.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required (make soak provides one)")
	}
	return s.Run(ctx)
}

// FailoverCommand is load failover.
type FailoverCommand struct{}

func (*FailoverCommand) Run(ctx context.Context, args []string) error {
	fs := flags("failover", `failover [flags]

Two local PostgreSQL clusters (the installed server binaries, loopback only) with streaming
replication, synchronous with -sync; two wsproxy instances whose DATABASE_URL names both hosts
with target_session_attrs=read-write; mixed traffic; and -faults times the primary stopped hard
(pg_ctl stop -m immediate) and the standby promoted, the old primary rebuilt as a standby of
the new one in between (make failover). Prints per fault the requests failed, the longest time
to a client's first good request, the acknowledged writes missing, the writes stored twice and
whether the event streams resumed without a gap; fails on a duplicate, on an acknowledged write
missing with -sync, or on a stream's gap with -sync.`)
	f := loadbench.Failover{}
	fs.StringVar(&f.Wsproxy, "wsproxy", "bin/wsproxy", "the wsproxy binary")
	fs.BoolVar(&f.Synchronous, "sync", false, "synchronous replication (synchronous_standby_names = '*')")
	fs.IntVar(&f.Clients, "c", 8, "concurrent clients")
	fs.IntVar(&f.Faults, "faults", 2, "failovers in the run")
	fs.DurationVar(&f.Between, "between", 10*time.Second, "traffic before the first fault and after each one's recovery")
	fs.DurationVar(&f.Lag, "lag", 0, "hold the standby's WAL receiver this long before each fault (a standby behind)")
	fs.StringVar(&f.Dir, "dir", "", "work folder of the clusters (default: a temporary one, removed after)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return f.Run(ctx)
}

// WritesCommand is load writes.
type WritesCommand struct{}

func (*WritesCommand) Run(ctx context.Context, args []string) error {
	fs := flags("writes", `writes [flags]

Workspace writes per second beside a plain durable one-row insert, at each number of concurrent
writers (-c), each writer on a thread of its own, in one run, interleaved over rounds (make
bench-writes): the plain insert from a pool of one connection a writer; user edits (the admin
REST) and agent tool rounds (thread turns whose fake model calls update_preferences with a new
subtitle) through a wsproxy with a pool of one connection a writer, while a second wsproxy on
the same database holds an event stream of each writer's thread and times each event's delivery;
with -floor, the user edits through the workspace package in this process (no HTTP). It needs
DATABASE_URL, a durable Postgres, that accepts 2 x the most writers + 10 connections.`)
	w := loadbench.Writes{DatabaseURL: os.Getenv("DATABASE_URL")}
	fs.StringVar(&w.Wsproxy, "wsproxy", "bin/wsproxy", "the wsproxy binary")
	writers := fs.String("c", "8,32,128", "concurrent writers of the rows, comma-separated")
	fs.DurationVar(&w.Duration, "d", 3*time.Second, "duration of each row's run")
	fs.IntVar(&w.Rounds, "rounds", 3, "rounds, each running every row once per number of writers; the table gives each figure's median")
	fs.BoolVar(&w.Floor, "floor", true, "also the user edits through the workspace package in this process (this build's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if w.DatabaseURL == "" {
		return errors.New("DATABASE_URL is required (make bench-writes provides a durable Postgres)")
	}
	for _, f := range strings.Split(*writers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-c: %q is not a number of writers", f)
		}
		w.Writers = append(w.Writers, n)
	}
	return w.Run(ctx)
}
