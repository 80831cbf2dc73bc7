#!/usr/bin/env bash
# `make run`: start wsproxy (bin/wsproxy, built by make) in one step.
#   - Listens on LISTEN_ADDR, 127.0.0.1:8080 unless set; refuses to start when that port is in
#     use (another make run?).
#   - Postgres: DATABASE_URL when set, else the cluster of ./.data. A cluster already running
#     (started by another make run of this folder, or by hand) is used and left running; one
#     this run started (creating it on the first run) is stopped when the proxy stops, unless
#     another make run of this folder still uses it.
#   - Upstream: UPSTREAM_BASE_URL when set; else OpenAI when OPENAI_API_KEY is set; else the
#     built-in demo model.
#   - Prints where to reach it once /readyz answers, and exits with the proxy's status.
set -euo pipefail
cd "$(dirname "$0")/.."

export LISTEN_ADDR=${LISTEN_ADDR:-127.0.0.1:8080}
port=${LISTEN_ADDR##*:}
host=${LISTEN_ADDR%:*}
host=${host#[}
host=${host%]}
case "$host" in "" | 0.0.0.0 | :: | localhost) host=127.0.0.1 ;; esac # reached from here over loopback

# connects: whether something accepts connections on host:port.
connects() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }
# readyz: whether /readyz on host:port answers 200.
readyz() (
  exec 3<>"/dev/tcp/$host/$port" || exit 1
  printf 'GET /readyz HTTP/1.0\r\nHost: %s\r\n\r\n' "$host" >&3
  read -r _ code _ <&3 && [ "$code" = 200 ]
) 2>/dev/null

if connects; then
  echo "run.sh: $LISTEN_ADDR is in use (another make run?): stop it, or set LISTEN_ADDR to another address" >&2
  exit 1
fi

mkdir -p .data
runs=.data/runs # one file per make run using the cluster of .data, named by its pid
started_pg=""
# release: on exit, stop the cluster this run started unless another make run still uses it.
release() {
  [ -e "$runs/$$" ] || return 0
  rm -f "$runs/$$"
  [ -n "$started_pg" ] || return 0
  local f
  for f in "$runs"/*; do
    [ -e "$f" ] || continue
    if kill -0 "${f##*/}" 2>/dev/null; then
      echo "run.sh: leaving the PostgreSQL cluster of .data running: make run (pid ${f##*/}) still uses it (scripts/pg.sh stop .data stops it)" >&2
      return 0
    fi
    rm -f "$f" # a make run that was killed
  done
  scripts/pg.sh stop .data
}
if [ -z "${DATABASE_URL:-}" ]; then
  mkdir -p "$runs"
  : >"$runs/$$"
  trap release EXIT
  if scripts/pg.sh running .data; then
    echo "run.sh: using the PostgreSQL cluster already running for .data (left running when this make run stops; scripts/pg.sh stop .data stops it)" >&2
  else
    started_pg=1
  fi
  DATABASE_URL=$(scripts/pg.sh start .data)
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
  [ -s .data/admin-token ] || (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' | sed 's/^/wsp_/' >.data/admin-token)
  chmod 600 .data/admin-token
  ADMIN_TOKEN=$(cat .data/admin-token)
  export ADMIN_TOKEN
fi

interrupted=""
trap 'interrupted=1; kill -TERM "${pid:-}" 2>/dev/null || true' INT TERM
bin/wsproxy &
pid=$!
until readyz; do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done

if kill -0 "$pid" 2>/dev/null; then
  case "$host" in 127.0.0.1) shown=localhost ;; *:*) shown="[$host]" ;; *) shown=$host ;; esac
  base="http://${shown}:${port}"
  # With CLIENT_KEYS every /v1 request needs a client's key, and a client's threads are stored
  # under its name (alice~demo): the examples name the first client and take its key from KEY,
  # never printing a key.
  note=""
  key=""
  thread=demo
  if [ -n "${CLIENT_KEYS:-}" ]; then
    keys=$CLIENT_KEYS
    case "$keys" in @*) keys=$(cat "${keys#@}" 2>/dev/null || true) ;; esac
    client=$(printf '%s\n' "$keys" | awk '{
      n = split($0, entry, ",")
      for (i = 1; i <= n; i++) {
        e = entry[i]; sub(/^[ \t\r]+/, "", e)
        if (name == "" && e !~ /^#/ && index(e, "=") > 1) { name = substr(e, 1, index(e, "=") - 1); sub(/[ \t]+$/, "", name) }
      }
    } END { print name }') || client=""
    client=${client:-client}
    note="
    # CLIENT_KEYS is set: each /v1 request needs a client's key. First: KEY=<${client}'s key>"
    key="-H \"Authorization: Bearer \$KEY\" "
    thread="${client}~demo"
  fi
  cat <<MSG

  wsproxy on ${base}   (upstream: ${UPSTREAM_BASE_URL})
  OpenAI base URL for a thread:  ${base}/threads/my-thread/v1
  workspace panel:               ${base}/ui/   (sign in with the admin token)
  admin token:                   ${ADMIN_TOKEN}   (kept in .data/admin-token)

  Try it:${note}
    curl -s ${base}/v1/chat/completions ${key}-H 'X-Thread-Id: demo' -H 'Content-Type: application/json' \\
      -d '{"model":"wsproxy-demo","messages":[{"role":"user","content":"My goal is to plan a trip to Lisbon. It must be by train. I prefer small hotels."}]}'
    curl -s ${base}/admin/v1/threads/${thread} -H "Authorization: Bearer ${ADMIN_TOKEN}"

MSG
fi

status=0
wait "$pid" || status=$?
while [ -n "$interrupted" ]; do # that wait returned at a signal: wait for the proxy's own status
  interrupted=""
  status=0
  wait "$pid" || status=$?
done
exit "$status"
