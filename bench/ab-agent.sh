#!/usr/bin/env bash
# ab-agent.sh compares two ways of running the holdfast agent on the same
# workloads: it alternates them run by run (A, B, A, B, ...) on a fresh
# durable agent each time, so that both see the same machine, and prints
# every result line and then the median rate and server CPU per operation
# of each side.
#
#   bench/ab-agent.sh [-w put,get-consistent] [-r 6] [-d 8s] [-a REV] [-l 'LOADGEN FLAGS'] -- 'AGENT FLAGS A' 'AGENT FLAGS B'
#
# -l adds flags to every loadgen run of both sides (e.g. '-lock-client
# recipe', which compare.sh uses for holdfast's lock-contend).
#
# With -a REV, side A runs the agent built from git revision REV and side B
# the one built from the working tree: a before/after comparison of a code
# change (the flags may then be the same, or both empty).
#
# Examples (bench/README.md):
#
#   bench/ab-agent.sh -w put -r 6 -- '-http-server stdlib' '-http-server holdfast'
#   bench/ab-agent.sh -w put,get-consistent -r 6 -a a54365c -- '' ''
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

WORKLOADS=put RUNS=6 DURATION=8s REV= LGFLAGS=
while getopts "w:r:d:a:l:" o; do
	case $o in
	l) LGFLAGS=$OPTARG ;;
	w) WORKLOADS=$OPTARG ;;
	r) RUNS=$OPTARG ;;
	d) DURATION=$OPTARG ;;
	a) REV=$OPTARG ;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
if (($# != 2)); then
	echo "usage: $0 [-w WORKLOADS] [-r RUNS] [-d DURATION] -- 'FLAGS A' 'FLAGS B'" >&2
	exit 2
fi
SIDES=("$1" "$2")

TMP=$(mktemp -d)
PID=
cleanup() {
	[[ -n $PID ]] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
go build -o "$TMP/holdfast" ./cmd/holdfast
go build -o "$TMP/loadgen" ./bench/loadgen
BINS=("$TMP/holdfast" "$TMP/holdfast")
if [[ -n $REV ]]; then
	git worktree add -q --detach "$TMP/rev" "$REV"
	(cd "$TMP/rev" && go build -o "$TMP/holdfast-rev" ./cmd/holdfast)
	git worktree remove --force "$TMP/rev"
	BINS[0]="$TMP/holdfast-rev"
fi
LABELS=("${SIDES[0]}" "${SIDES[1]}")
if [[ -n $REV ]]; then
	LABELS=("$REV: ${SIDES[0]}" "working tree: ${SIDES[1]}")
fi
ADDR=127.0.0.1:18500

IFS=, read -r -a wl <<<"$WORKLOADS"
for w in "${wl[@]}"; do
	for r in $(seq 1 "$RUNS"); do
		for s in 0 1; do
			rm -rf "$TMP/data"
			# shellcheck disable=SC2086 # the side's flags are split on purpose
			"${BINS[$s]}" agent -data-dir "$TMP/data" -node ab -http-addr "$ADDR" \
				-server-addr 127.0.0.1:18300 -serf-addr 127.0.0.1:0 -log-level warn ${SIDES[$s]} \
				>"$TMP/agent.log" 2>&1 &
			PID=$!
			"$TMP/loadgen" -addr "$ADDR" -workload ping -duration 30s -quiet >/dev/null
			# shellcheck disable=SC2086 # the loadgen flags are split on purpose
			"$TMP/loadgen" -addr "$ADDR" -workload "$w" $LGFLAGS -duration 2s -quiet >/dev/null # warm up
			# shellcheck disable=SC2086
			line=$("$TMP/loadgen" -addr "$ADDR" -workload "$w" $LGFLAGS -duration "$DURATION" -pid "$PID" -name "side$s")
			echo "$line side=$s run=$r"
			kill "$PID"
			wait "$PID" || true
			PID=
		done
	done
done | tee "$TMP/lines"

echo
printf '%-16s %-28s %10s %14s %9s %9s\n' workload side "rate/s" "cpu us/op" "p50 ms" "p99 ms"
for w in "${wl[@]}"; do
	for s in 0 1; do
		awk -v w="$w" -v s="$s" '
			{ delete f; for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] } }
			f["workload"] == w && f["side"] == s {
				n++; rate[n] = f["rate"] + 0; cpu[n] = f["cpu_pct"] * 1e4 / f["rate"]
				p50[n] = f["p50_ms"] + 0; p99[n] = f["p99_ms"] + 0
			}
			function median(a, n,   i, j, t) {
				for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
				return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
			}
			END { if (n) printf "%.0f %.1f %.3f %.3f\n", median(rate, n), median(cpu, n), median(p50, n), median(p99, n) }
		' "$TMP/lines" | while read -r rate cpu p50 p99; do
			printf '%-16s %-28s %10s %14s %9s %9s\n' "$w" "'${LABELS[$s]}'" "$rate" "$cpu" "$p50" "$p99"
		done
	done
done
