#!/usr/bin/env bash
# Time from SIGKILL of a lock holder to the next holder's acquire, with two
# real `holdfast lock` processes on one key against a local agent.
#
# The dead holder's session lives until its TTL runs out on the server (it
# was renewed at TTL/2, so between TTL/2 and TTL after the kill), then the
# key's lock-delay (15 s, the server default) keeps it free, then the
# waiter takes it. With Consul's 2xTTL the first part would be up to twice
# as long.
#
# usage: bench/kill-handoff.sh [-r RUNS] [-t TTL]
set -euo pipefail
runs=3 ttl=10s
while getopts "r:t:" o; do case $o in r) runs=$OPTARG;; t) ttl=$OPTARG;; *) exit 2;; esac; done
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; pkill -P $$ 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/holdfast" ./cmd/holdfast
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http=127.0.0.1:$(port)
"$tmp/holdfast" agent -dev -http-addr "$http" -server-addr "127.0.0.1:$(port)" -serf-addr 127.0.0.1:0 -node kh -log-level warn >"$tmp/agent.log" 2>&1 &
export HOLDFAST_HTTP_ADDR=$http
for _ in $(seq 100); do curl -sf "http://$http/v1/status/leader" | grep -q ":" && break; sleep 0.1; done
sleep 0.5 # the leader registers its own node (serfHealth) just after the election
for r in $(seq "$runs"); do
  key=kh/run$r
  "$tmp/holdfast" lock -ttl "$ttl" "$key" "touch $tmp/held$r; sleep 600" >/dev/null 2>&1 &
  holder=$!
  for _ in $(seq 100); do [ -e "$tmp/held$r" ] && break; sleep 0.05; done
  "$tmp/holdfast" lock -ttl "$ttl" "$key" "date +%s.%N > $tmp/next$r" >/dev/null 2>&1 &
  waiter=$!
  sleep 1
  t0=$(date +%s.%N)
  kill -9 "$holder"                # the holder crashes; its session is left to expire
  wait "$waiter" || true
  pkill -f "held$r; sleep 600" || true
  t1=$(cat "$tmp/next$r")
  python3 -c "print(f'run $r: SIGKILL -> next holder {($t1 - $t0):.2f} s (session TTL $ttl, lock-delay 15s)')"
done
