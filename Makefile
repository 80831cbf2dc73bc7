# wsproxy. `make test` runs every check CI runs; `make run` starts the proxy.
SHELL := /bin/bash
GO ?= go

.PHONY: test vet check-size generate check-generated chromium buildah npm-clients jq promtool run build image release bench bench-load bench-latency bench-cache bench-writes bench-poison soak failover

## VERSION: what the binaries say they are (`wsproxy version`, the start line, wsproxy_build_info):
## the VERSION file's (CHANGELOG.md says what each version changed).
ifndef VERSION
VERSION := $(shell cat VERSION)
endif
LDFLAGS = -s -w -X main.buildVersion=$(VERSION)

## test: vet, check the generated code is current, and run every test with -race on a real
## Postgres (TEST_DATABASE_URL or DATABASE_URL, else a throwaway local cluster); then the tests of
## deploy/, a module of its own (the Helm chart rendered and decoded, the alert rules through
## promtool, every dashboard and rule query against a running wsproxy's /metrics); then the tests
## of PGBOUNCER_TESTS again through a PgBouncer in transaction mode. A package may take longer than
## go test's default 10 minutes on a machine whose Go build cache is cold (cmd/proxy cross-builds
## the release binaries): TEST_TIMEOUT bounds each package instead.
TEST_TIMEOUT ?= 30m
test: vet check-generated chromium buildah npm-clients jq promtool
	scripts/pg.sh exec sh -c '$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./... && (cd deploy && $(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...) && scripts/pg.sh bouncer $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) -run "$(PGBOUNCER_TESTS)" ./workspace ./proxy/... ./cmd/proxy'

## PGBOUNCER_TESTS: turns, tool calls, Responses continuations, events and their live stream (followed
## through the pool), the admin REST, panel sessions and links, client scoping,
## concurrency, replicas, MCP (its calls, scopes, subscriptions, replicas), a thread's scopes and
## review mode: what would meet session state or prepared statements kept across transactions.
## TestPgBouncerTestsExist fails when a name here names no test.
PGBOUNCER_TESTS = ^(TestTurns|TestConcurrentTurnStartsShareRoundTrips|TestUserPath|TestConcurrentAgentAndUserEdits|TestErrorEnvelopesWriteNothing|TestLimits|TestTurnWithToolsGoOpenAI|TestMixedCallsNonStreamed|TestStreamMixedCalls|TestConcurrentTurns|TestAdminWorkspace|TestUsagePerThread|TestThreeReplicas|TestDemoEndToEnd|TestResponsesMixedTurnContinued|TestEventStream|TestEventStreamsAcrossABurst|TestEventsUnderConcurrency|TestRevert|TestPanelSessions|TestContinuationsScopedPerClient|TestIndicesOfOneRoundNameTheListShown|TestUsageCountedOnceWhenTheAnswerIsLost|TestThreadPagesKeepTheirPlace|TestWireCorpus|TestMCPTools|TestMCPScopes|TestMCPSubscriptionAcrossReplicas|TestMCPStatelessRoundRobin|TestPanelLinkRevoked|TestMessagesTurnWithAWorkspaceCall|TestMessagesMixedRoundContinued|TestApplyProposal|TestAdminApplyProposal|TestInheritedPreferencesInTheBlock|TestReviewMode|TestScopesOnTheAdminREST|TestScopesInEveryWireAPI|TestScopeChangeWakesChildren|TestScopesOverMCP|TestHubWakesOnEveryChange|TestClientsAtRuntime|TestReplicasShareTheLimit|TestSharedScopeReachesClients|TestSharedScopeReadOnlyToClients|TestExportImportRoundTrip)$$

vet: check-size
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd deploy && $(GO) vet ./...

## check-size: no committed file over 1 MiB outside testdata/ and docs/ (a build output, a dump).
check-size:
	@big=$$(git ls-files -z 2>/dev/null | xargs -0 -r stat -c '%s %n' 2>/dev/null | \
	  awk '$$1 > 1048576 && $$2 !~ /(^|\/)(testdata|docs)\// {print $$2}'); \
	  if [ -n "$$big" ]; then echo "files over 1 MiB outside testdata/ and docs/: $$big"; exit 1; fi

## generate: regenerate db/ from queries/ and db/schema/ with the pinned sqlc.
generate:
	$(GO) tool sqlc generate

check-generated:
	@$(GO) tool sqlc diff || { echo "db/ is stale: run 'make generate' and commit the result"; exit 1; }

## build: bin/wsproxy, static (CGO_ENABLED=0) and stamped with VERSION.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/wsproxy ./cmd/proxy

## run: start wsproxy on LISTEN_ADDR (127.0.0.1:8080 unless set; a local Postgres under ./.data
## unless DATABASE_URL is set; the demo model unless UPSTREAM_BASE_URL or OPENAI_API_KEY is set).
run: build
	scripts/run.sh

## image: the container image $(IMAGE):$(VERSION) and $(IMAGE):latest (Containerfile): from
## scratch, bin/wsproxy and the CA certificates of this machine (CA_CERTS), built with podman or
## buildah without any registry.
IMAGE ?= localhost/wsproxy
CA_CERTS ?= /etc/ssl/certs/ca-certificates.crt
CONTAINER_TOOL ?= $(shell command -v podman || command -v buildah)
image: build
	@[ -n "$(CONTAINER_TOOL)" ] || { echo "make image needs podman or buildah (Debian/Ubuntu: apt-get install buildah)" >&2; exit 1; }
	@[ -s "$(CA_CERTS)" ] || { echo "make image: no CA certificates in $(CA_CERTS) (Debian/Ubuntu: apt-get install ca-certificates; or set CA_CERTS)" >&2; exit 1; }
	mkdir -p bin/image
	cp bin/wsproxy bin/image/wsproxy
	cp "$(CA_CERTS)" bin/image/ca-certificates.crt
	$(CONTAINER_TOOL) build --pull=never -f Containerfile -t $(IMAGE):$(VERSION) -t $(IMAGE):latest bin/image

## release: static binaries in dist/ for PLATFORMS, named wsproxy-VERSION-OS-ARCH and stamped
## with VERSION, and their SHA-256 checksums (dist/SHA256SUMS, for sha256sum -c).
PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
release:
	mkdir -p dist
	rm -f dist/wsproxy-* dist/SHA256SUMS
	for p in $(PLATFORMS); do \
	  CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags '$(LDFLAGS)' \
	    -o dist/wsproxy-$(VERSION)-$${p%/*}-$${p#*/} ./cmd/proxy || exit 1; \
	done
	cd dist && if command -v sha256sum >/dev/null; then sha256sum wsproxy-*; else shasum -a 256 wsproxy-*; fi > SHA256SUMS

## bench: the Go benchmarks of the hot paths (on a real Postgres), 6 runs each for benchstat.
bench:
	scripts/pg.sh exec $(GO) test -run '^$$' -bench . -benchmem -count 6 ./proxy ./workspace

## bench-load: the load comparison of BENCHMARKS.md: direct, a bare reverse proxy, and wsproxy
## without a thread, with a thread, with a tool round, streamed and not, and the floor under a
## thread turn and a tool round (load floor), printed beside the targets; interleaved rounds. Its
## Postgres runs with the server's default durability (fsync on); a second cluster with fsync
## off runs the thread turn again, for comparison; a wsproxy with CLIENT_KEYS and limits set and
## its twin without clients (each on a database of its own in the durable cluster) run the thread
## turn and the pass-through again, the two at the same time.
bench-load: build
	$(GO) build -o bin/load ./cmd/load
	PG_DURABLE=1 scripts/pg.sh exec sh -c 'DURABLE_URL=$$TEST_DATABASE_URL TEST_DATABASE_URL= PG_DURABLE= scripts/pg.sh exec sh -c "DATABASE_URL=\$$DURABLE_URL NOFSYNC_DATABASE_URL=\$$TEST_DATABASE_URL bin/load suite -wsproxy bin/wsproxy $(LOAD_FLAGS)"'

## bench-latency: streamed turns at a hosted model's latency (400 ms to the first token, then 40
## chunks at 25 ms), open-loop at 100, 1,000 and 5,000 concurrent streams: direct, through the bare
## reverse proxy and through wsproxy (pass-through, a thread turn, one tool round), each row a fresh
## proxy; prints the table of BENCHMARKS.md. Its Postgres is a throwaway cluster with the server's
## default durability (fsync on), whatever TEST_DATABASE_URL says. LATENCY_FLAGS="-c 100 -window 3s"
## for a short run.
bench-latency: build
	$(GO) build -o bin/load ./cmd/load
	TEST_DATABASE_URL= DATABASE_URL= PG_DURABLE=1 scripts/pg.sh exec sh -c 'DATABASE_URL=$$TEST_DATABASE_URL bin/load latency -wsproxy bin/wsproxy $(LATENCY_FLAGS)'

## bench-writes: workspace writes per second — user edits (the admin REST) and agent tool rounds,
## each writer on a thread of its own — beside a plain durable one-row insert, at 8, 32 and 128
## concurrent writers, interleaved over rounds, wsproxy's pool one connection a writer; with a
## second replica holding a stream of each writer's thread, the delay of the events to it (p50,
## p99); and the same edits through the workspace package in this process (the floor). Its
## Postgres is a throwaway cluster with the server's default durability (fsync on).
## WRITES_FLAGS="-c 8,32 -d 2s -rounds 1" for a short run; WRITES_FLAGS="-wsproxy OTHER -floor=false"
## measures another build of wsproxy with the same harness (the floor is this build's).
bench-writes: build
	$(GO) build -o bin/load ./cmd/load
	TEST_DATABASE_URL= DATABASE_URL= PG_DURABLE=1 PG_OPTS='-c max_connections=400' scripts/pg.sh exec sh -c 'DATABASE_URL=$$TEST_DATABASE_URL bin/load writes -wsproxy bin/wsproxy $(WRITES_FLAGS)'

## bench-cache: what each workspace placement costs a conversation's upstream prompt cache
## (scripted chat and agent sessions under OpenAI's caching rule, a Messages agent loop shaped
## like Claude Code's under Anthropic's, and a Gemini agent loop shaped like Gemini CLI's under
## Gemini's implicit caching; direct and through wsproxy with each placement); fails when a tail
## target is missed.
bench-cache: build
	$(GO) build -o bin/load ./cmd/load
	scripts/pg.sh exec sh -c 'DATABASE_URL=$$TEST_DATABASE_URL bin/load cache -wsproxy bin/wsproxy'

## bench-poison: the memory-poisoning scorecard of BENCHMARKS.md (docs/spec.md §19): the corpus
## of proxy/testdata/poison in every untrusted channel of every wire API and over MCP, written by
## a scripted model that always obeys, under each untrusted_writes, streamed and not; a benign
## corpus and an adaptive attacker beside it. Fails when a poisoned write changes a block under
## the default or a locked item changes; prints the tables.
bench-poison:
	scripts/pg.sh exec env POISON_SCORECARD=1 $(GO) test -count=1 -timeout 30m -run '^TestPoisonScorecard$$' -v ./proxy

## soak: ten minutes of mixed traffic against two wsproxy instances on one Postgres, with injected
## upstream and Postgres faults; fails unless every recorded preference is stored exactly once and
## memory and goroutines come back (SOAK_FLAGS="-d 1m -instances 1" for a shorter run on one).
soak: build
	$(GO) build -o bin/load ./cmd/load
	scripts/pg.sh exec sh -c 'DATABASE_URL=$$TEST_DATABASE_URL bin/load soak -wsproxy bin/wsproxy $(SOAK_FLAGS)'

## failover: Postgres failing over under load, twice a run: two local clusters with streaming
## replication (the installed server binaries, loopback only, in a temporary folder), two wsproxy
## instances whose DATABASE_URL names both hosts with target_session_attrs=read-write, mixed
## traffic and event streams; the primary stopped hard and the standby promoted, the old primary
## rebuilt as a standby in between. One synchronous run, then one asynchronous; before each fault
## the primary's WAL sender is held for a second (a standby behind: FAILOVER_FLAGS="-lag 0" for
## none). Prints per fault what failed, for how long, and what acknowledged was lost; fails on a
## write stored twice, or with synchronous replication on an acknowledged write missing or a
## stream's gap.
FAILOVER_FLAGS ?= -lag 1s
failover: build
	$(GO) build -o bin/load ./cmd/load
	bin/load failover -wsproxy bin/wsproxy -sync $(FAILOVER_FLAGS)
	bin/load failover -wsproxy bin/wsproxy $(FAILOVER_FLAGS)

## chromium: the panel's browser tests need Chromium (or CHROMIUM_PATH); as root on Debian or
## Ubuntu it is installed when missing, saying so; elsewhere the tests fail and say what to install.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || [ -n "$$CHROMIUM_PATH" ] || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "make: Chromium is missing; installing it (apt-get install chromium) for the panel's browser tests" >&2 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	echo "make: no Chromium found: the panel's browser tests will fail (Debian/Ubuntu: apt-get install chromium)" >&2

## buildah: the image's test builds it with podman or buildah; as root on Debian or Ubuntu buildah
## is installed when neither is there, saying so; elsewhere that test fails and says what to install.
buildah:
	@command -v podman >/dev/null 2>&1 || command -v buildah >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "make: podman and buildah are missing; installing buildah (apt-get install buildah) for the image's test" >&2 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >/dev/null; } || \
	echo "make: neither podman nor buildah found: the image's test will fail (Debian/Ubuntu: apt-get install buildah)" >&2

## npm-clients: the end-to-end tests drive official npm clients (scripts/npm, pinned), installed
## into .cache/npm; as root on Debian or Ubuntu Node.js and npm are installed when missing, saying
## so; elsewhere the tests that need them fail and say what to install.
npm-clients:
	@command -v npm >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "make: npm is missing; installing Node.js and npm (apt-get install nodejs npm) for the end-to-end tests" >&2 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null; } || \
	echo "make: no npm found: the end-to-end tests will fail (Debian/Ubuntu: apt-get install nodejs npm)" >&2
	@command -v npm >/dev/null 2>&1 && scripts/npm-clients.sh >/dev/null || true

## jq: the documentation's examples use it (TestDocsSnippets runs them); as root on Debian or
## Ubuntu it is installed when missing, saying so.
jq:
	@command -v jq >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "make: jq is missing; installing it (apt-get install jq) for the documentation's examples" >&2 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >/dev/null; } || \
	echo "make: no jq found: the documentation's examples will fail (Debian/Ubuntu: apt-get install jq)" >&2

## promtool: the alert rules' tests (deploy/) check and run the rules with it, and fail without
## it; as root on Debian or Ubuntu it is installed when missing (apt-get install prometheus),
## saying so.
promtool:
	@command -v promtool >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  echo "make: promtool is missing; installing it (apt-get install prometheus) for the alert rules' tests" >&2 && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; } || \
	echo "make: no promtool found: the alert rules' tests will fail (Debian/Ubuntu: apt-get install prometheus)" >&2
