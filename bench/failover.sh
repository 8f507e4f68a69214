#!/usr/bin/env bash
# failover.sh: how long a three-server holdfast cluster takes no writes
# when its leader is killed, or stopped on purpose.
#
# Builds holdfast, starts three durable servers on loopback (free ports,
# data in a temporary directory, -bootstrap-expect 3, the default lan
# gossip profile and raft timing), then N times: sends the leader a signal
# (SIGKILL, or with -s TERM a SIGTERM: an agent stopping on purpose; with
# -s TRANSFER no signal but POST /v1/operator/raft/transfer-leader, an
# operator moving the leadership before maintenance), times from then to
# the first PUT answered "true" through another server (a PUT every 10 ms,
# each bounded at 2 s), and restarts the stopped server on its data
# directory. Prints each time and the median.
#
#   bench/failover.sh            # 8 kills
#   bench/failover.sh -n 20 -s TERM
#   bench/failover.sh -s TRANSFER
#   HOLDFAST_BIN=/path/to/holdfast bench/failover.sh   # a binary built elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local

N=8
SIG=KILL
while getopts "n:s:h" o; do
	case $o in
	n) N=$OPTARG ;;
	s) SIG=$OPTARG ;;
	*) sed -n '2,18p' "$0"; exit 2 ;;
	esac
done
command -v curl >/dev/null || { echo "failover.sh: needs curl" >&2; exit 1; }

TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	rm -rf "$TMP"
}
trap cleanup EXIT
if [[ -n ${HOLDFAST_BIN:-} ]]; then
	cp "$HOLDFAST_BIN" "$TMP/holdfast"
else
	go build -o "$TMP/holdfast" ./cmd/holdfast
fi

EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
USED=" "
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
		[[ $USED == *" $p "* ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			USED="$USED$p "
			PORT=$p
			return 0
		fi
	done
	echo "failover.sh: no free port" >&2
	return 1
}
declare -A HTTP RAFT SERF PID
for i in 1 2 3; do
	free_port; HTTP[$i]=127.0.0.1:$PORT
	free_port; RAFT[$i]=127.0.0.1:$PORT
	free_port; SERF[$i]=127.0.0.1:$PORT
done
start() {
	local i=$1
	"$TMP/holdfast" agent -node "server$i" -data-dir "$TMP/server$i" -bootstrap-expect 3 \
		-http-addr "${HTTP[$i]}" -server-addr "${RAFT[$i]}" -serf-addr "${SERF[$i]}" \
		-join "${SERF[1]}" -join "${SERF[2]}" >>"$TMP/log$i" 2>&1 &
	PID[$i]=$!
	PIDS+=("$!")
	disown "$!" # no "Killed" line from the shell when it is killed
}
# leader prints the index of the server that leads, as server1 sees it
# (or any live one); nothing while none does.
leader() {
	local i l
	for i in 1 2 3; do
		l=$(curl -s -m 1 "http://${HTTP[$i]}/v1/status/leader" 2>/dev/null | tr -d '"') || continue
		for j in 1 2 3; do
			[[ -n $l && $l == "${RAFT[$j]}" ]] && { echo "$j"; return; }
		done
	done
}
# ready waits until every server answers a consistent read (found or not).
ready() {
	for _ in $(seq 1 600); do
		local ok=0
		for i in 1 2 3; do
			local code
			code=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "http://${HTTP[$i]}/v1/kv/failover?consistent" 2>/dev/null) || true
			[[ $code == 200 || $code == 404 ]] && ok=$((ok + 1))
		done
		[[ $ok -ge 3 ]] && return 0
		sleep 0.1
	done
	echo "failover.sh: the cluster did not get ready; logs in $TMP" >&2
	trap - EXIT
	return 1
}
for i in 1 2 3; do start "$i"; done
ready
TIMES=()
for k in $(seq 1 "$N"); do
	sleep 5 # let the restarted server catch up and gossip settle
	l=$(leader)
	[[ -n $l ]] || { echo "failover.sh: no leader" >&2; exit 1; }
	s=$((l % 3 + 1))
	if [[ $SIG == TRANSFER ]]; then
		curl -s -m 10 -o /dev/null -X POST "http://${HTTP[$l]}/v1/operator/raft/transfer-leader" &
	else
		kill -s "$SIG" "${PID[$l]}"
	fi
	t0=$(date +%s%N)
	n=0
	until [[ $(curl -s -m 2 -X PUT "http://${HTTP[$s]}/v1/kv/failover" -d "$k" 2>/dev/null) == true ]]; do
		n=$((n + 1))
		sleep 0.01
	done
	t1=$(date +%s%N)
	ms=$(((t1 - t0) / 1000000))
	TIMES+=("$ms")
	if [[ $SIG == TRANSFER ]]; then
		wait
		echo "stop $k: leader server$l asked to hand the leadership over; a write through server$s answered after $ms ms ($n refused)"
		continue
	fi
	echo "stop $k: leader server$l sent SIG$SIG; a write through server$s answered after $ms ms ($n refused)"
	while kill -0 "${PID[$l]}" 2>/dev/null; do sleep 0.05; done
	start "$l"
	ready
done
printf '%s\n' "${TIMES[@]}" | sort -n | awk '{a[NR]=$1} END {m = (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "failover over %d stops ('"$SIG"'): min %d ms, median %d ms, max %d ms\n", NR, a[1], m, a[NR]}'
