#!/usr/bin/env bash
# `make run`: start wsproxy in one step.
#   - Postgres: DATABASE_URL when set, else a local cluster under ./.data (created on first run,
#     stopped when the proxy stops, its data kept for the next run).
#   - Upstream: UPSTREAM_BASE_URL when set; else OpenAI when OPENAI_API_KEY is set; else the
#     built-in demo model.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p .data
started_pg=""
if [ -z "${DATABASE_URL:-}" ]; then
  DATABASE_URL=$(scripts/pg.sh start .data)
  started_pg=1
  export DATABASE_URL
fi
if [ -z "${UPSTREAM_BASE_URL:-}" ]; then
  if [ -n "${OPENAI_API_KEY:-}" ]; then
    export UPSTREAM_BASE_URL=https://api.openai.com/v1
    export UPSTREAM_API_KEY=${UPSTREAM_API_KEY:-$OPENAI_API_KEY}
  else
    export UPSTREAM_BASE_URL=demo
  fi
fi
if [ -z "${ADMIN_TOKEN:-}" ]; then
  [ -s .data/admin-token ] || { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | sed 's/^/wsp_/' > .data/admin-token; }
  ADMIN_TOKEN=$(cat .data/admin-token)
  export ADMIN_TOKEN
fi
export LISTEN_ADDR=${LISTEN_ADDR:-:8080}

go build -o bin/wsproxy ./cmd/proxy

port=${LISTEN_ADDR##*:}
base="http://localhost:${port}"
cat <<MSG

  wsproxy on ${base}   (upstream: ${UPSTREAM_BASE_URL})
  OpenAI base URL for a thread:  ${base}/threads/my-thread/v1
  workspace panel:               ${base}/ui/   (sign in with the admin token)
  admin token:                   ${ADMIN_TOKEN}   (kept in .data/admin-token)

  Try it:
    curl -s ${base}/v1/chat/completions -H 'X-Thread-Id: demo' -H 'Content-Type: application/json' \\
      -d '{"model":"wsproxy-demo","messages":[{"role":"user","content":"My goal is to plan a trip to Lisbon. It must be by train. I prefer small hotels."}]}'
    curl -s ${base}/admin/v1/threads/demo -H "Authorization: Bearer ${ADMIN_TOKEN}"

MSG

stop_pg() { [ -n "$started_pg" ] && scripts/pg.sh stop .data || true; }
trap stop_pg EXIT
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM
bin/wsproxy &
pid=$!
wait "$pid" || wait "$pid" || true
