#!/usr/bin/env bash
# ab-agent.sh compares two ways of running the holdfast agent on the same
# workloads: it alternates them run by run (A, B, A, B, ...) on a fresh
# durable agent each time, so that both see the same machine, and prints
# every result line and then the median rate and server CPU per operation
# of each side.
#
#   bench/ab-agent.sh [-w put,get-consistent] [-r 6] [-d 8s] [-i] [-p] [-a REV] [-l 'LOADGEN FLAGS'] -- 'AGENT FLAGS A' 'AGENT FLAGS B'
#
# -l adds flags to every loadgen run of both sides (e.g. '-lock-client
# recipe', which compare.sh uses for holdfast's lock-contend).
#
# Leading NAME=VALUE words of a side's flags go into the agent's environment
# instead: -- 'GOMAXPROCS=2' 'GOMAXPROCS=4'.
#
# With -i, both agents are started once, side by side on their own ports
# and data directories, and the runs alternate between them in the order
# A B B A, A B B A, ...: with short runs (-d 3s) many pairs fit in the time
# one fresh-agent pair takes, and the slow swings of a shared machine fall
# on both sides alike. The idle agent's own timers cost next to nothing.
#
# With -p, every agent runs on CPU 0 and every load generator on CPU 1
# (taskset): the agent has one CPU to itself, as on a one-CPU host.
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

WORKLOADS=put RUNS=6 DURATION=8s REV='' LGFLAGS='' INTERLEAVE=0 ON_SRV=() ON_GEN=()
while getopts "w:r:d:a:l:ip" o; do
	case $o in
	i) INTERLEAVE=1 ;;
	p) ON_SRV=(taskset -c 0) ON_GEN=(taskset -c 1) ;;
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
	echo "usage: $0 [-w WORKLOADS] [-r RUNS] [-d DURATION] [-i] [-p] [-a REV] [-l FLAGS] -- 'FLAGS A' 'FLAGS B'" >&2
	exit 2
fi
SIDES=("$1" "$2")

TMP=$(mktemp -d)
PID=
cleanup() {
	# shellcheck disable=SC2086 # one or two pids
	[[ -n ${PID// /} ]] && kill $PID 2>/dev/null && wait $PID 2>/dev/null
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

# start_agent S: start side S's agent on its own ports and data directory,
# wait until it serves; sets PIDS[S].
PIDS=("" "")
start_agent() {
	local s=$1 env=() flags=() word
	# shellcheck disable=SC2206 # the side's flags are split on purpose
	local words=(${SIDES[$s]})
	for word in "${words[@]}"; do
		if ((${#flags[@]} == 0)) && [[ $word =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
			env+=("$word")
		else
			flags+=("$word")
		fi
	done
	rm -rf "$TMP/data$s"
	"${ON_SRV[@]}" env "${env[@]}" "${BINS[$s]}" agent -data-dir "$TMP/data$s" -node "ab$s" -http-addr "127.0.0.1:$((18500 + s))" \
		-server-addr "127.0.0.1:$((18300 + s))" -serf-addr 127.0.0.1:0 -log-level warn "${flags[@]}" \
		>"$TMP/agent$s.log" 2>&1 &
	PIDS[s]=$!
	PID="${PIDS[*]}"
	"${ON_GEN[@]}" "$TMP/loadgen" -addr "127.0.0.1:$((18500 + s))" -workload ping -duration 30s -quiet >/dev/null
}

stop_agent() {
	kill "${PIDS[$1]}"
	wait "${PIDS[$1]}" || true
	PIDS[$1]=""
	PID="${PIDS[*]}"
}

# measure S W R: one measured run of workload W on side S's agent.
measure() {
	local s=$1 w=$2 r=$3 line
	# shellcheck disable=SC2086 # the loadgen flags are split on purpose
	line=$("${ON_GEN[@]}" "$TMP/loadgen" -addr "127.0.0.1:$((18500 + s))" -workload "$w" $LGFLAGS -duration "$DURATION" -pid "${PIDS[$s]}" -name "side$s")
	echo "$line side=$s run=$r"
}

warm() {
	# shellcheck disable=SC2086
	"${ON_GEN[@]}" "$TMP/loadgen" -addr "127.0.0.1:$((18500 + $1))" -workload "$2" $LGFLAGS -duration 2s -quiet >/dev/null
}

IFS=, read -r -a wl <<<"$WORKLOADS"
for w in "${wl[@]}"; do
	if ((INTERLEAVE)); then
		start_agent 0
		start_agent 1
		warm 0 "$w"
		warm 1 "$w"
		for r in $(seq 1 "$RUNS"); do
			order="0 1"
			((r % 2 == 0)) && order="1 0"
			for s in $order; do measure "$s" "$w" "$r"; done
		done
		stop_agent 0
		stop_agent 1
		continue
	fi
	for r in $(seq 1 "$RUNS"); do
		for s in 0 1; do
			start_agent "$s"
			warm "$s" "$w"
			measure "$s" "$w" "$r"
			stop_agent "$s"
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

# Pairs: in how many runs side B did better than side A on the same run
# number (higher rate, lower CPU per op, lower p50 and p99).
echo
for w in "${wl[@]}"; do
	awk -v w="$w" '
		{ delete f; for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] } }
		f["workload"] == w && f["rate"] > 0 {
			k = f["run"] "|" f["side"]
			rate[k] = f["rate"]; cpu[k] = f["cpu_pct"] / f["rate"]; p50[k] = f["p50_ms"]; p99[k] = f["p99_ms"]
			if (f["run"] > runs) runs = f["run"]
		}
		END {
			for (r = 1; r <= runs; r++) {
				a = r "|0"; b = r "|1"
				if (!(a in rate) || !(b in rate)) continue
				n++
				wr += rate[b] > rate[a]; wc += cpu[b] < cpu[a]; w5 += p50[b] < p50[a]; w9 += p99[b] < p99[a]
			}
			if (n) printf "%-16s pairs %d, side B better in: rate %d, cpu/op %d, p50 %d, p99 %d\n", w, n, wr, wc, w5, w9
		}
	' "$TMP/lines"
done
