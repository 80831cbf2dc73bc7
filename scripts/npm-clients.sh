#!/usr/bin/env bash
# Installs the official npm clients the end-to-end tests drive (scripts/npm/package.json, pinned
# by its package-lock.json) into .cache/npm of the repository, once: a second run with the same
# lock file does nothing. Prints the node_modules folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$root/.cache/npm"
command -v npm >/dev/null || { echo "npm-clients: npm is missing (Debian/Ubuntu: apt-get install nodejs npm)" >&2; exit 1; }
mkdir -p "$root/.cache"
exec 9>"$root/.cache/npm.lock"
flock 9 # one install at a time (test packages run in parallel)
if ! cmp -s "$root/scripts/npm/package-lock.json" "$dir/package-lock.json" || [ ! -d "$dir/node_modules" ]; then
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$root/scripts/npm/package.json" "$root/scripts/npm/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
echo "$dir/node_modules"
