#!/usr/bin/env bash
# Local PostgreSQL for wsproxy's tests and `make run`, from the installed PostgreSQL binaries.
#
#   scripts/pg.sh exec CMD...   run CMD with TEST_DATABASE_URL set: the one given
#                               (TEST_DATABASE_URL or DATABASE_URL), else a throwaway cluster
#                               that is removed when CMD exits (fsync off, unless PG_DURABLE=1;
#                               more server options from PG_OPTS, if set)
#   scripts/pg.sh start DIR     start (creating when needed) a persistent cluster in DIR/pg and
#                               print its URL on stdout (server options from PG_OPTS, if set)
#   scripts/pg.sh bouncer CMD...
#                               inside `pg.sh exec`: run CMD with TEST_PGBOUNCER_URL set to a
#                               PgBouncer in transaction mode in front of the throwaway cluster
#                               (Debian's pgbouncer, installed when missing as root)
#   scripts/pg.sh bouncer-start DIR
#                               inside `pg.sh exec`: start a PgBouncer like bouncer's in DIR (its
#                               socket, config and log) and print its URL; started again in the
#                               same DIR, it listens at the same place (a restart)
#   scripts/pg.sh bouncer-stop DIR [immediate|safe]
#                               stop the PgBouncer of DIR: at once (every connection closed), or
#                               after the transactions in flight
#   scripts/pg.sh running DIR   exit 0 when the cluster of DIR is running
#   scripts/pg.sh stop DIR [MODE]
#                               stop the cluster of DIR (pg_ctl's mode: fast, or immediate for a
#                               crash)
#
# PostgreSQL refuses to run as root, so as root the cluster belongs to the "postgres" user
# (created by Debian's packages) or "nobody"; when that user cannot enter DIR (a folder under
# /root, or made by mktemp -d), the cluster of DIR is kept in /var/lib/wsproxy/<checksum of
# DIR's path>/pg instead, and pg.sh says so. As root on Debian or Ubuntu without PostgreSQL,
# pg.sh installs it (apt-get install postgresql), saying so.
set -euo pipefail

die() { echo "pg.sh: $*" >&2; exit 1; }

bindir() {
  find_bindir && return
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "pg.sh: PostgreSQL's server binaries are missing; installing them (apt-get install postgresql)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } >&2 \
      || die "apt-get install postgresql failed"
    find_bindir && return
  fi
  die "no PostgreSQL server binaries found (initdb, pg_ctl). Install them (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql) or set DATABASE_URL."
}

find_bindir() {
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir; return
  fi
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return; }
  done
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  return 1
}

# owner: the user the cluster runs as.
owner() {
  if [ "$(id -u)" != 0 ]; then id -un; return; fi
  if id postgres >/dev/null 2>&1; then echo postgres; else echo nobody; fi
}

# as USER CMD...: run CMD as USER (directly when that is us; from / otherwise, a folder USER
# can enter: every path given is absolute).
as() {
  local u=$1; shift
  if [ "$u" = "$(id -un)" ]; then "$@"; return; fi
  if command -v runuser >/dev/null 2>&1; then (cd / && runuser -u "$u" -- "$@"); else (cd / && su -s /bin/sh "$u" -c "$(printf '%q ' "$@")"); fi
}

# init_and_start DATADIR SOCKDIR [SERVER OPTIONS]: create the cluster when missing and start it.
init_and_start() {
  local data=$1 sock=$2 extra=${3:-} bin u
  bin=$(bindir); u=$(owner)
  mkdir -p "$data" "$sock"
  [ "$(id -u)" = 0 ] && chown "$u" "$data" "$sock"
  chmod 700 "$data"
  if [ ! -f "$data/PG_VERSION" ]; then
    as "$u" "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$data.initdb.log" 2>&1 \
      || as "$u" "$bin/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C >"$data.initdb.log" 2>&1 \
      || { cat "$data.initdb.log" >&2; die "initdb failed"; }
  fi
  if ! as "$u" "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    as "$u" "$bin/pg_ctl" -D "$data" -w -t 60 -l "$data/server.log" \
      -o "-k $sock -c listen_addresses= -c max_connections=200 $extra" \
      start >/dev/null || { cat "$data/server.log" >&2; die "postgres did not start"; }
  fi
}

stop_cluster() {
  local data=$1 mode=${2:-fast} bin
  [ -f "$data/PG_VERSION" ] || return 0
  bin=$(find_bindir 2>/dev/null) || return 0
  as "$(owner)" "$bin/pg_ctl" -D "$data" -m "$mode" -w stop >/dev/null 2>&1 || true
}

url() { echo "postgres://postgres@/postgres?host=$1&sslmode=disable"; }

# sockdir DATADIR: a socket folder short enough for the 107-byte limit of a socket path.
sockdir() {
  local d
  d=$(dirname "$1")/run
  if [ ${#d} -gt 80 ]; then d=/tmp/wsproxy-pg-$(printf '%s' "$1" | cksum | cut -d' ' -f1); fi
  echo "$d"
}

# datadir DIR: where the cluster of DIR lives: DIR/pg, or as root, when the cluster's owner
# cannot enter DIR, a folder of /var/lib/wsproxy named by the checksum of DIR's path.
datadir() {
  local dir
  dir=$(cd "$1" && pwd)
  if [ "$(id -u)" = 0 ] && ! as "$(owner)" test -x "$dir"; then
    echo "/var/lib/wsproxy/$(printf '%s' "$dir" | cksum | cut -d' ' -f1)/pg"
    return
  fi
  echo "$dir/pg"
}

# bouncer_url DIR: the URL of the PgBouncer of DIR (no named prepared statements: Debian 12's
# PgBouncer, before 1.21, does not keep them across transactions).
bouncer_url() { echo "postgres://postgres@/postgres?host=$1&port=6432&sslmode=disable&default_query_exec_mode=cache_describe"; }

# start_bouncer DIR: start a PgBouncer in transaction mode in DIR (its socket, its log), in front
# of the cluster of TEST_DATABASE_URL (on a Unix socket), writing DIR/pgbouncer.ini when missing;
# it prints its URL once it listens. Started again in the same DIR, it listens where it did.
start_bouncer() {
  local dir=$1 sock port bouncer u
  sock=$(printf '%s' "$TEST_DATABASE_URL" | sed -n 's/.*[?&]host=\([^&]*\).*/\1/p')
  port=$(printf '%s' "$TEST_DATABASE_URL" | sed -n 's/.*[?&]port=\([0-9]*\).*/\1/p')
  [ -n "$sock" ] || die "pg.sh bouncer needs a cluster on a Unix socket (pg.sh exec)"
  if ! command -v pgbouncer >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "pg.sh: pgbouncer is missing; installing it (apt-get install pgbouncer)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null; } >&2 || die "apt-get install pgbouncer failed"
  fi
  bouncer=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  [ -x "$bouncer" ] || die "pgbouncer is not installed (Debian/Ubuntu: apt-get install pgbouncer)"
  mkdir -p "$dir"; chmod 755 "$dir"
  u=$(owner)
  [ "$(id -u)" = 0 ] && chown "$u" "$dir"
  [ -f "$dir/pgbouncer.ini" ] || cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=$sock port=${port:-5432} user=postgres
[pgbouncer]
listen_addr =
unix_socket_dir = $dir
listen_port = 6432
auth_type = any
pool_mode = transaction
max_client_conn = 1000
default_pool_size = 20
ignore_startup_parameters = statement_timeout,search_path,extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
INI
  as "$u" "$bouncer" -d "$dir/pgbouncer.ini" || { cat "$dir/pgbouncer.log" >&2; die "pgbouncer did not start"; }
  for _ in $(seq 100); do [ -S "$dir/.s.PGSQL.6432" ] && break; sleep 0.1; done
  [ -S "$dir/.s.PGSQL.6432" ] || { cat "$dir/pgbouncer.log" >&2; die "pgbouncer does not listen"; }
  bouncer_url "$dir"
}

# stop_bouncer DIR SIGNAL: stop the PgBouncer of DIR and wait for it to exit. Before 1.23, TERM
# is its immediate shutdown (every connection closed at once) and INT its safe one (after the
# transactions in flight); from 1.23 QUIT is the immediate one.
stop_bouncer() {
  local dir=$1 sig=$2 pid v
  pid=$(cat "$dir/pgbouncer.pid" 2>/dev/null) || return 0
  v=$(pgbouncer --version 2>/dev/null | sed -n '1s/^PgBouncer \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  if [ "$sig" = TERM ] && [ -n "$v" ] && [ "${v% *}" -ge 1 ] && { [ "${v% *}" -gt 1 ] || [ "${v#* }" -ge 23 ]; }; then sig=QUIT; fi
  kill -"$sig" "$pid" 2>/dev/null || return 0
  for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  die "pgbouncer $pid did not stop"
}

cmd=${1:-}; shift || true
case "$cmd" in
  exec)
    [ $# -gt 0 ] || die "usage: pg.sh exec CMD..."
    if [ -n "${TEST_DATABASE_URL:-}" ]; then exec "$@"; fi
    if [ -n "${DATABASE_URL:-}" ]; then TEST_DATABASE_URL=$DATABASE_URL exec "$@"; fi
    tmp=$(mktemp -d /tmp/wsproxy-test.XXXXXX)
    chmod 755 "$tmp"
    trap 'stop_cluster "$tmp/data"; rm -rf "$tmp"' EXIT
    # A throwaway cluster need not survive a crash: skip the disk flushes (PG_DURABLE=1 keeps the
    # server's defaults: fsync and synchronous_commit on, as users run it).
    opts="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    [ "${PG_DURABLE:-}" = 1 ] && opts=""
    opts="$opts ${PG_OPTS:-}"
    init_and_start "$tmp/data" "$tmp/run" "$opts"
    echo "pg.sh: throwaway PostgreSQL cluster in $tmp" >&2
    TEST_DATABASE_URL=$(url "$tmp/run") "$@"
    ;;
  start)
    [ $# -eq 1 ] || die "usage: pg.sh start DIR"
    mkdir -p "$1"; data=$(datadir "$1")
    if [ "$data" != "$(cd "$1" && pwd)/pg" ]; then
      echo "pg.sh: $(owner) cannot enter $(cd "$1" && pwd); keeping its PostgreSQL cluster in $data" >&2
      mkdir -p "$(dirname "$data")"; chmod 755 /var/lib/wsproxy "$(dirname "$data")"
    fi
    s=$(sockdir "$data")
    # The socket trusts whoever connects: only the cluster's owner may.
    init_and_start "$data" "$s" "-c unix_socket_permissions=0700 ${PG_OPTS:-}"
    url "$s"
    ;;
  running)
    [ $# -eq 1 ] || die "usage: pg.sh running DIR"
    [ -d "$1" ] || exit 1
    data=$(datadir "$1")
    [ -f "$data/PG_VERSION" ] || exit 1
    bin=$(find_bindir) || exit 1
    as "$(owner)" "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1
    ;;
  bouncer)
    [ $# -gt 0 ] && [ -n "${TEST_DATABASE_URL:-}" ] || die "usage: pg.sh exec scripts/pg.sh bouncer CMD..."
    dir=$(mktemp -d /tmp/wsproxy-bouncer.XXXXXX)
    trap 'stop_bouncer "$dir" TERM; rm -rf "$dir"' EXIT
    start_bouncer "$dir" >/dev/null
    echo "pg.sh: PgBouncer (transaction pooling) in $dir" >&2
    TEST_PGBOUNCER_URL=$(bouncer_url "$dir") "$@"
    ;;
  bouncer-start)
    [ $# -eq 1 ] && [ -n "${TEST_DATABASE_URL:-}" ] || die "usage: pg.sh exec scripts/pg.sh bouncer-start DIR"
    start_bouncer "$1"
    ;;
  bouncer-stop)
    [ $# -ge 1 ] || die "usage: pg.sh bouncer-stop DIR [immediate|safe]"
    [ "${2:-immediate}" = safe ] && sig=INT || sig=TERM
    stop_bouncer "$1" "$sig"
    ;;
  stop)
    [ $# -ge 1 ] || die "usage: pg.sh stop DIR [fast|immediate]"
    stop_cluster "$(datadir "$1")" "${2:-fast}"
    ;;
  *) die "usage: pg.sh exec CMD... | bouncer CMD... | bouncer-start DIR | bouncer-stop DIR [immediate|safe] | start DIR | running DIR | stop DIR [fast|immediate]" ;;
esac
