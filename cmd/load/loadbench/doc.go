// Package loadbench is the measuring code of cmd/load: the closed-loop clients of a load run
// (Load), the interleaved suite of make bench-load (Suite), the open-loop latency table of
// make bench-latency (Latency), the prompt-cache measurement of make bench-cache (Cache, with
// its scripted sessions and the model's side of them), the soak of make soak (Soak), the
// workspace writes of make bench-writes (Writes) and the failover of make failover (Failover:
// two local clusters with streaming replication, the primary stopped hard and the standby
// promoted under traffic), with what they read of /proc and of the proxies' metrics.
//
// Each is a value whose Run measures and prints; cmd/load only parses flags into one and calls
// Run. The upstream is the fake model of proxy/upstreamtest/fake. The suite and the latency
// table start the fake model and the bare proxy (BareProxy) as processes of their own, so that
// each one's CPU time is its own: the running program again (os.Executable) with the
// subcommands upstream [-tool-round], model [-ttft -chunks -interval], bareproxy -target and
// floor -target [-tool-round] (Floor: the least a Go proxy in front of Postgres can do for a
// thread turn or a tool round, the reference wsproxy's turns are compared with), each serving
// with ServeCounted and printing the address it listens on, as cmd/load does.
package loadbench
