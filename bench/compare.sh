#!/usr/bin/env bash
# Side-by-side benchmark of holdfast against etcd and ZooKeeper on this
# machine: installs the peers from Debian if missing, builds holdfast and the
# load generators, starts all three on loopback with durable storage in a
# temporary directory, runs every workload against each (interleaved, so
# they share the machine's conditions), repeats, and prints the medians with
# holdfast/best-peer ratios. Everything it starts is stopped on exit.
#
# See bench/README.md. Run from anywhere: bench/compare.sh -h
# The whole script is one brace group, so bash reads all of it before running
# any: editing this file while a comparison runs cannot change that run.
{
set -euo pipefail

# An entry NAME@N runs workload NAME with N clients and is its own group in the
# table; a plain NAME runs with -c, or else the workload's default count.
WORKLOADS="session-churn@1,session-churn,lock-own@1,lock-own,lock-contend,put@1,put,get-consistent@1,get-consistent,watch-wake,sessions-keepalive"
KNOWN_WORKLOADS="session-churn,lock-own,lock-contend,put,get-consistent,watch-wake,sessions-keepalive"
TARGETS="holdfast,etcd,zk"
DURATION=10s
KA_DURATION=30s
RUNS=3
CLIENTS=0
HF_SESSIONS=100000
ETCD_SESSIONS=10000
ZK_SESSIONS=0
INSTALL=1
PIN=0
OFFERED=0
CLUSTER=1
FOLLOWER=0
OUT=""
HOLDFAST_ARGS=${HOLDFAST_ARGS:-}
REPORT=""

usage() {
	cat <<EOF
usage: bench/compare.sh [options]
  -w LIST   workloads, comma-separated; NAME@N runs NAME with N clients, shown
            as its own group NAME@N (default: $WORKLOADS)
  -t LIST   targets, comma-separated, from holdfast,etcd,zk (default: $TARGETS)
  -d DUR    measured duration of each run (default: $DURATION)
  -k DUR    measured duration of sessions-keepalive (default: $KA_DURATION)
  -r N      runs per workload and target; the median is reported (default: $RUNS)
  -c N      clients for every workload without @N (default: each workload's own, see README)
  -s N      holdfast sessions for sessions-keepalive (default: $HF_SESSIONS)
  -e N      etcd leases for sessions-keepalive (default: $ETCD_SESSIONS)
  -z N      ZooKeeper sessions (connections) for sessions-keepalive, 0 = skip (default: $ZK_SESSIONS)
  -o FILE   also append every raw result line to FILE
  -n        do not install missing packages
  -q RATE   put and get-consistent: offer RATE ops per second in all instead of
            a closed loop, each op timed from when it was due (loadgen -rate);
            compares the latencies of all targets at the same load
  -C N      run each target as a cluster of N servers (3 or 5) on this machine,
            replicating every write, with the clients on its leader: holdfast
            agents with -bootstrap-expect N, an etcd cluster, a ZooKeeper
            ensemble (default: 1, a lone server)
  -F        with -C, the clients on a follower instead of the leader (each
            target's followers pass writes and linearizable reads to it)
  -p        pin: every server to CPU 0 and every load generator to CPU 1
            (taskset), so that the two never compete for a core; without -p
            both float over all CPUs
  -R FILES  only print the table for result lines saved earlier with -o;
            several comma-separated files are pooled (their runs add up)
Environment: HOLDFAST_ARGS adds flags to 'holdfast agent'; GEN_ENV sets
variables (NAME=VALUE ...) for every load generator and no server.
EOF
}

while getopts "w:t:d:k:r:c:s:e:z:o:R:q:C:Fnph" opt; do
	case $opt in
	w) WORKLOADS=$OPTARG ;;
	t) TARGETS=$OPTARG ;;
	d) DURATION=$OPTARG ;;
	k) KA_DURATION=$OPTARG ;;
	r) RUNS=$OPTARG ;;
	c) CLIENTS=$OPTARG ;;
	s) HF_SESSIONS=$OPTARG ;;
	e) ETCD_SESSIONS=$OPTARG ;;
	z) ZK_SESSIONS=$OPTARG ;;
	o) OUT=$OPTARG ;;
	n) INSTALL=0 ;;
	p) PIN=1 ;;
	q) OFFERED=$OPTARG ;;
	C) CLUSTER=$OPTARG ;;
	F) FOLLOWER=1 ;;
	R) REPORT=$OPTARG ;;
	h) usage; exit 0 ;;
	*) usage >&2; exit 2 ;;
	esac
done

# With -p, what runs servers and what runs load generators.
ON_SRV=() ON_GEN=()
if ((PIN)); then
	command -v taskset >/dev/null || { echo "compare.sh: -p needs taskset (util-linux)" >&2; exit 2; }
	(($(nproc) >= 2)) || { echo "compare.sh: -p needs two CPUs" >&2; exit 2; }
	ON_SRV=(taskset -c 0) ON_GEN=(taskset -c 1)
fi
# GEN_ENV: environment for the load generators alone (every target's alike),
# e.g. GEN_ENV='GOGC=off GOMEMLIMIT=1GiB'; the servers do not see it.
if [[ -n ${GEN_ENV:-} ]]; then
	read -r -a genenv <<<"$GEN_ENV"
	for kv in "${genenv[@]}"; do
		[[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "compare.sh: GEN_ENV: want NAME=VALUE words, not '$kv'" >&2; exit 2; }
	done
	ON_GEN=(env "${genenv[@]}" "${ON_GEN[@]}")
fi

((FOLLOWER == 0 || CLUSTER > 1)) || { echo "compare.sh: -F needs -C 3 or 5" >&2; exit 2; }
[[ $CLUSTER == 1 || $CLUSTER == 3 || $CLUSTER == 5 ]] || { echo "compare.sh: -C: want 1, 3 or 5 servers, not '$CLUSTER'" >&2; exit 2; }
[[ $OFFERED =~ ^[0-9]+$ ]] || { echo "compare.sh: -q: want a whole number of ops per second, not '$OFFERED'" >&2; exit 2; }

# Check -w and -c before anything is installed, built or started.
IFS=, read -r -a wlist <<<"$WORKLOADS"
((${#wlist[@]})) || { echo "compare.sh: -w: no workloads" >&2; exit 2; }
for e in "${wlist[@]}"; do
	if [[ ! $e =~ ^[a-z-]+(@[1-9][0-9]*)?$ ]] || [[ ",$KNOWN_WORKLOADS," != *",${e%@*},"* ]]; then
		echo "compare.sh: -w: bad entry '$e' (want NAME or NAME@N, NAME one of $KNOWN_WORKLOADS)" >&2
		exit 2
	fi
done
if [[ ! $CLIENTS =~ ^[0-9]+$ ]]; then
	echo "compare.sh: -c: want a number of clients, got '$CLIENTS'" >&2
	exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/holdfast-compare.XXXXXX")
RESULTS=$TMP/results.txt
: >"$RESULTS"

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
has() { [[ ",$1," == *",$2,"* ]]; }

# Seconds in a Go-style duration like 10s, 1500ms, 2m (for timeouts only).
secs() {
	local d=$1
	case $d in
	*ms) echo $(((${d%ms} + 999) / 1000)) ;;
	*s) echo "${d%s}" ;;
	*m) echo $((${d%m} * 60)) ;;
	*) echo 60 ;;
	esac
}

# ---- processes we start, and stopping them

# PID[t] is the server the load generator samples (in a cluster, the one it
# talks to), MORE[t] the other servers of a cluster.
declare -A PID=() MORE=()
CPORTS=() CPIDS=() HF_DIR=""
stop() {
	local t=$1 p
	# shellcheck disable=SC2206
	local all=(${PID[$1]:-} ${MORE[$1]:-})
	((${#all[@]})) || return 0
	for p in "${all[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${all[@]}"; do
		for _ in $(seq 1 100); do
			kill -0 "$p" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	PID[$t]="" MORE[$t]=""
}
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	for t in "${!PID[@]}"; do stop "$t"; done
	if [[ -n ${KEEP_TMP:-} ]]; then
		log "kept $TMP"
	else
		rm -rf "$TMP"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Ports are drawn below the kernel's range for outgoing connections: a port
# in it that is free to connect to can still be the local end of one of the
# load generators' connections a moment later, and a server started on it
# then fails to bind (seen: a holdfast restart in sessions-keepalive lost
# holdfast for the rest of a run).
EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
((EPHEMERAL_LOW > 12000)) || EPHEMERAL_LOW=32768
# free_port sets PORT to a port on 127.0.0.1 that nothing answers on and
# that this script has not handed out before.
USED_PORTS=" "
free_port() {
	local p
	for _ in $(seq 1 200); do
		p=$((10000 + RANDOM % (EPHEMERAL_LOW - 10000)))
		[[ $USED_PORTS == *" $p "* ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			USED_PORTS="$USED_PORTS$p "
			PORT=$p
			return 0
		fi
	done
	log "no free port found"
	return 1
}

# ---- install

install_pkgs() {
	local need=()
	if has "$TARGETS" etcd && ! command -v etcd >/dev/null; then need+=(etcd-server); fi
	if ((CLUSTER > 1)) && ! command -v curl >/dev/null; then need+=(curl); fi
	if has "$TARGETS" zk; then
		[[ -f /usr/share/java/zookeeper.jar ]] || need+=(zookeeper)
		command -v java >/dev/null || need+=(default-jre-headless)
	fi
	((${#need[@]})) || return 0
	if ((!INSTALL)); then
		log "missing packages ${need[*]} and -n given"
		exit 1
	fi
	local sudo=""
	[[ $(id -u) == 0 ]] || sudo=sudo
	log "installing ${need[*]}"
	# Keep the packages' own services (a system etcd on :2379) from starting.
	local policy=/usr/sbin/policy-rc.d made_policy=0
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
		$sudo chmod +x "$policy"
		made_policy=1
	fi
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
	((made_policy)) && $sudo rm -f "$policy"
	return 0
}

# ---- build

build() {
	log "building load generators"
	(cd "$ROOT" && go build -o "$TMP/loadgen" ./bench/loadgen)
	(cd "$ROOT/bench/peers" && go build -o "$TMP/peers" .)
	if has "$TARGETS" holdfast; then
		log "building holdfast"
		if ! (cd "$ROOT" && go build -o "$TMP/holdfast" ./cmd/holdfast) >"$TMP/holdfast-build.log" 2>&1; then
			log "holdfast does not build (see below): unavailable"
			sed 's/^/  /' "$TMP/holdfast-build.log" >&2
			TARGETS=$(echo ",$TARGETS," | sed 's/,holdfast,/,/; s/^,//; s/,$//')
			UNAVAILABLE="${UNAVAILABLE:-} holdfast"
		fi
	fi
}

# ---- servers: start_<t> starts a fresh one (new data dir) and waits until it serves

ADDR_holdfast="" ADDR_etcd="" ADDR_zk=""
GEN=0

# With -C N, each start_<t> starts N servers that form one cluster (logs in
# $dir/log, $dir/log.2, ...), waits until it serves, and points the load
# generator at its leader (or with -F a follower), whose pid it samples
# (pick_server).

# logname DIR I: the log of server I (from 1) of a target.
logname() {
	if (($2 > 1)); then echo "$1/log.$2"; else echo "$1/log"; fi
}

# pick_server T: the load generator's server of T's cluster, whose client
# ports and pids are CPORTS and CPIDS: the one leads_T says leads, or with
# -F the first that does not. It becomes ADDR_T and PID[T].
pick_server() {
	local t=$1 i j
	for ((i = 1; i <= CLUSTER; i++)); do
		if "leads_$t" "$i"; then
			if ((FOLLOWER)); then
				i=$((i % CLUSTER + 1))
			fi
			eval "ADDR_$t=127.0.0.1:${CPORTS[i - 1]}"
			PID[$t]=${CPIDS[i - 1]} MORE[$t]=""
			for ((j = 1; j <= CLUSTER; j++)); do
				((j == i)) || MORE[$t]="${MORE[$t]} ${CPIDS[j - 1]}"
			done
			return 0
		fi
	done
	log "$t: no server says it leads"
	return 1
}

start_etcd() {
	GEN=$((GEN + 1))
	local dir=$TMP/etcd-$GEN cps=() pps=() pids=() initial="" name i
	for ((i = 1; i <= CLUSTER; i++)); do
		free_port && cps+=("$PORT") && free_port && pps+=("$PORT") || return 1
		name=bench && ((CLUSTER > 1)) && name=e$i
		initial+="${initial:+,}$name=http://127.0.0.1:${pps[i - 1]}"
	done
	mkdir -p "$dir"
	for ((i = 1; i <= CLUSTER; i++)); do
		name=bench && ((CLUSTER > 1)) && name=e$i
		"${ON_SRV[@]}" etcd --name "$name" --data-dir "$dir/data$i" \
			--listen-client-urls "http://127.0.0.1:${cps[i - 1]}" --advertise-client-urls "http://127.0.0.1:${cps[i - 1]}" \
			--listen-peer-urls "http://127.0.0.1:${pps[i - 1]}" --initial-advertise-peer-urls "http://127.0.0.1:${pps[i - 1]}" \
			--initial-cluster "$initial" --initial-cluster-state new \
			--quota-backend-bytes 8589934592 --logger zap --log-outputs stderr --log-level warn \
			>"$(logname "$dir" "$i")" 2>&1 &
		pids+=($!)
	done
	PID[etcd]=${pids[0]} MORE[etcd]="${pids[*]:1}"
	ADDR_etcd=127.0.0.1:${cps[0]}
	"${ON_GEN[@]}" "$TMP/peers" -target etcd -addr "$ADDR_etcd" -workload ping -duration 60s -quiet >/dev/null
	CPORTS=("${cps[@]}") CPIDS=("${pids[@]}")
	((CLUSTER == 1)) || pick_server etcd
}

# leads_etcd I: member I's status names itself as leader.
leads_etcd() {
	local st
	st=$(curl -s -m 5 -X POST "http://127.0.0.1:${CPORTS[$1 - 1]}/v3/maintenance/status" -d '{}') || return 1
	[[ $st =~ \"member_id\":\"([0-9]+)\" ]] && [[ $st == *"\"leader\":\"${BASH_REMATCH[1]}\""* ]]
}

start_zk() {
	GEN=$((GEN + 1))
	local dir=$TMP/zk-$GEN cps=() servers="" pids=() i q e sd
	for ((i = 1; i <= CLUSTER; i++)); do
		free_port && cps+=("$PORT") || return 1
		if ((CLUSTER > 1)); then
			free_port && q=$PORT && free_port && e=$PORT || return 1
			servers+="server.$i=127.0.0.1:$q:$e"$'\n'
		fi
	done
	for ((i = 1; i <= CLUSTER; i++)); do
		sd=$dir
		((CLUSTER > 1)) && sd=$dir/$i
		mkdir -p "$sd/data"
		((CLUSTER > 1)) && echo "$i" >"$sd/data/myid"
		cat >"$sd/zoo.cfg" <<ZOOCFG
tickTime=2000
initLimit=10
syncLimit=5
dataDir=$sd/data
clientPort=${cps[i - 1]}
clientPortAddress=127.0.0.1
maxClientCnxns=0
maxSessionTimeout=120000
admin.enableServer=false
autopurge.purgeInterval=1
4lw.commands.whitelist=srvr
$servers
ZOOCFG
		# -Xmx as zkEnv.sh's default; forceSync (fsync per commit) is on by default.
		"${ON_SRV[@]}" java -Xmx1000m -Dzookeeper.log.dir="$sd" -Djava.io.tmpdir="$sd" \
			-cp "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar" \
			org.apache.zookeeper.server.quorum.QuorumPeerMain "$sd/zoo.cfg" >"$(logname "$dir" "$i")" 2>&1 &
		pids+=($!)
	done
	PID[zk]=${pids[0]} MORE[zk]="${pids[*]:1}"
	ADDR_zk=127.0.0.1:${cps[0]}
	"${ON_GEN[@]}" "$TMP/peers" -target zk -addr "$ADDR_zk" -workload ping -duration 60s -quiet >/dev/null
	CPORTS=("${cps[@]}") CPIDS=("${pids[@]}")
	((CLUSTER == 1)) || pick_server zk
}

# leads_zk I: server I's srvr command says "Mode: leader".
leads_zk() {
	(exec 3<>"/dev/tcp/127.0.0.1/${CPORTS[$1 - 1]}" && printf srvr >&3 && timeout 5 cat <&3) 2>/dev/null | grep -q '^Mode: leader'
}

start_holdfast() {
	GEN=$((GEN + 1))
	local dir=$TMP/holdfast-$GEN hps=() pids=() more=() joinaddr="" i m c help
	# The agent's other listeners (raft, gossip) get free ports too, when it has them.
	help=$("$TMP/holdfast" agent -h 2>&1 || true)
	for ((i = 1; i <= CLUSTER; i++)); do
		free_port && hps+=("$PORT") || return 1
		m=""
		if [[ $help == *-server-addr* ]]; then
			free_port || return 1
			m+=" -server-addr 127.0.0.1:$PORT"
		fi
		if [[ $help == *-serf-addr* ]]; then
			free_port || return 1
			m+=" -serf-addr 127.0.0.1:$PORT"
			[[ -n $joinaddr ]] || joinaddr=127.0.0.1:$PORT
		fi
		more+=("$m")
	done
	for ((i = 1; i <= CLUSTER; i++)); do
		mkdir -p "$dir/data$i"
		c=""
		((CLUSTER > 1)) && c="-node hf$i -bootstrap-expect $CLUSTER -join $joinaddr"
		# shellcheck disable=SC2086
		"${ON_SRV[@]}" "$TMP/holdfast" agent -data-dir "$dir/data$i" -http-addr "127.0.0.1:${hps[i - 1]}" ${more[i - 1]} $c $HOLDFAST_ARGS \
			>"$(logname "$dir" "$i")" 2>&1 &
		pids+=($!)
	done
	PID[holdfast]=${pids[0]} MORE[holdfast]="${pids[*]:1}"
	ADDR_holdfast=127.0.0.1:${hps[0]}
	sleep 0.3
	for ((i = 1; i <= CLUSTER; i++)); do
		if ! kill -0 "${pids[i - 1]}" 2>/dev/null; then
			log "holdfast agent $i exited at once: $(head -c 300 "$(logname "$dir" "$i")")"
			return 1
		fi
	done
	"${ON_GEN[@]}" "$TMP/loadgen" -addr "$ADDR_holdfast" -workload ping -duration 60s -quiet >/dev/null
	CPORTS=("${hps[@]}") CPIDS=("${pids[@]}") HF_DIR=$dir
	((CLUSTER == 1)) || pick_server holdfast
}

# leads_holdfast I: agent I's raft address (its banner's) is the one its
# /v1/status/leader names.
leads_holdfast() {
	local lead raft
	lead=$(curl -s -m 5 "http://127.0.0.1:${CPORTS[$1 - 1]}/v1/status/leader" | tr -d '"')
	raft=$(sed -n 's/^  raft: *//p' "$(logname "$HF_DIR" "$1")")
	[[ -n $lead && $raft == "$lead" ]]
}

# start T: (re)start target T fresh; on failure drop it from TARGETS.
start() {
	local t=$1
	stop "$t"
	log "starting $t"
	if ! "start_$t"; then
		log "$t did not come up: unavailable (log: $(ls -d "$TMP/$t-$GEN" 2>/dev/null))"
		tail -n 20 "$TMP/$t-$GEN/log" >&2 2>/dev/null || true
		stop "$t"
		TARGETS=$(echo ",$TARGETS," | sed "s/,$t,/,/; s/^,//; s/,\$//")
		UNAVAILABLE="${UNAVAILABLE:-} $t"
		return 1
	fi
	log "$t ready on $(eval echo "\$ADDR_$t") (pid ${PID[$t]})"
}

# ---- one run

# run_one T W N: workload W against target T with N clients (0 = W's default).
run_one() {
	local t=$1 w=$2 clients=$3 dur=$DURATION extra=() line
	local addr
	addr=$(eval echo "\$ADDR_$t")
	if [[ $w == sessions-keepalive ]]; then
		dur=$KA_DURATION
		case $t in
		holdfast) extra=(-sessions "$HF_SESSIONS") ;;
		etcd) extra=(-sessions "$ETCD_SESSIONS") ;;
		zk) extra=(-sessions "$ZK_SESSIONS" -session-ttl 60s) ;;
		esac
		# The server is restarted before the next use: skip destroying 100k sessions.
		extra+=(-no-cleanup)
	fi
	local cmd=("${ON_GEN[@]}" "$TMP/peers" -target "$t")
	[[ $t == holdfast ]] && cmd=("${ON_GEN[@]}" "$TMP/loadgen")
	# Each target contends for a lock with its own standard recipe: ZooKeeper's
	# and etcd's queue their waiters, and so does holdfast's api/recipe.Lock
	# (HF_LOCK_CLIENT=consul measures the racing style of Consul's Go client).
	if [[ $OFFERED != 0 && ($w == put || $w == get-consistent) ]]; then extra+=(-rate "$OFFERED"); fi
	if [[ $t == holdfast && $w == lock-contend ]]; then extra+=(-lock-client "${HF_LOCK_CLIENT:-recipe}"); fi
	local limit=$(($(secs "$dur") + 900))
	line=$(timeout --kill-after=10 "$limit" "${cmd[@]}" -addr "$addr" -workload "$w" -duration "$dur" \
		-clients "$clients" -pid "${PID[$t]}" -quiet "${extra[@]}" 2>>"$TMP/errors.log" | grep '^result ' || true)
	if [[ -z $line ]]; then
		line="result target=$t workload=$w clients=$clients failed=1"
	fi
	echo "$line" >>"$RESULTS"
	if [[ -n $OUT ]]; then echo "$line" >>"$OUT"; fi
	echo "$line" >&2
}

# ---- table: median per (workload, target, metric), ratio to the best peer
#
# Lines are grouped by the -w entries: a line "workload=W clients=N" belongs
# to the group W@N if that entry is listed, else to the plain group W if N is
# that group's count (-c, or else W's default), else to no group: a saved
# put@1 line does not land among the 32-client puts of "-w put".

# header FILE: the table's first line. A saved file (-R) is described by
# what its lines say (runs = most lines of one target, workload and client
# count; lengths from duration_s), not by this invocation's options.
header() {
	if [[ -z $REPORT ]]; then
		local how=""
		((PIN)) && how="; servers on CPU 0, load generators on CPU 1"
		((CLUSTER > 1)) && how="$how; each target a cluster of $CLUSTER servers, the clients on its $( ((FOLLOWER)) && echo follower || echo leader)"
		[[ $OFFERED != 0 ]] && how="$how; put and get-consistent offered $OFFERED ops/s"
		[[ -n ${GEN_ENV:-} ]] && how="$how; load generators with $GEN_ENV"
		echo "holdfast vs peers: median of $RUNS runs, ${DURATION} each (sessions-keepalive: $KA_DURATION)$how"
		return
	fi
	awk '
/^result / {
	t = w = c = d = ""
	for (i = 2; i <= NF; i++) {
		split($i, kv, "=")
		if (kv[1] == "target") t = kv[2]; else if (kv[1] == "workload") w = kv[2]
		else if (kv[1] == "clients") c = kv[2]; else if (kv[1] == "duration_s") d = kv[2] + 0
	}
	n[t " " w " " c]++
	if (w == "sessions-keepalive") { if (d > ka) ka = d } else if (d > dur) dur = d
}
END {
	for (k in n) if (n[k] > runs) runs = n[k]
	printf "holdfast vs peers (saved lines): median of up to %d runs, %.0fs each", runs, dur
	if (ka > 0) printf " (sessions-keepalive: %.0fs)", ka
	printf "\n"
}' "$1"
}

report() {
	echo
	header "$1"
	if [[ -n ${UNAVAILABLE:-} ]]; then echo "unavailable:${UNAVAILABLE}"; fi
	awk -v workloads="$WORKLOADS" -v clients="$CLIENTS" '
function med(key,   n, i, j, t, a) {
	n = split(vals[key], a, " ")
	if (n == 0 || vals[key] == "") return ""
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
	return (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
}
# plain(w): the client count of the plain group w: -c, or else the default
# of bench/loadkit/config.go (keep the two in step).
function plain(w) {
	if (clients > 0) return clients
	if (w == "lock-contend" || w == "put" || w == "get-consistent" || w == "sessions-keepalive") return 32
	return 8
}
BEGIN {
	nw = split(workloads, wl, ",")
	for (wi = 1; wi <= nw; wi++) listed[wl[wi]] = 1
}
/^result / {
	delete f
	for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
	w = f["workload"]; t = f["target"]
	g = (f["clients"] != "" && ((w "@" f["clients"]) in listed)) ? w "@" f["clients"] : w
	if (g == w && f["clients"] != "" && f["clients"] != plain(w)) next
	if (f["failed"] == 1) { failed[g "|" t]++; next }
	if (w == "sessions-keepalive") {
		if (f["sessions"] > 0 && f["rss_delta_mib"] != "") f["mib_per_10k"] = f["rss_delta_mib"] * 10000 / f["sessions"]
	}
	for (k in f) vals[g "|" t "|" k] = vals[g "|" t "|" k] (vals[g "|" t "|" k] == "" ? "" : " ") f[k]
}
END {
	# metric list per workload: name:direction (+ higher is better, - lower is better)
	m["session-churn"] = "rate:+ p50_ms:- p99_ms:-"
	m["lock-own"] = "rate:+ p50_ms:- p99_ms:-"
	m["lock-contend"] = "rate:+ acquires_per_s:+ p50_ms:- p99_ms:-"
	m["put"] = "rate:+ p50_ms:- p99_ms:-"
	m["get-consistent"] = "rate:+ p50_ms:- p99_ms:-"
	m["watch-wake"] = "p50_ms:- p99_ms:-"
	m["sessions-keepalive"] = "sessions:= rss_delta_mib:- mib_per_10k:- cpu_pct:- create_per_s:+ p99_ms:-"
	label["rate"] = "rate/s"; label["p50_ms"] = "p50 ms"; label["p99_ms"] = "p99 ms"
	split("holdfast etcd zk", tg, " ")
	printf "%-19s %-15s %12s %12s %12s %12s %9s %6s\n", "workload", "metric", "holdfast", "etcd", "zk", "best peer", "hf/best", "won"
	for (wi = 1; wi <= nw; wi++) {
		g = wl[wi]
		if (g in shown) continue
		shown[g] = 1
		# A group W@N has the metrics, names and directions of W.
		w = g; sub(/@.*/, "", w)
		if (!(w in m)) continue
		nm = split(m[w], ml, " ")
		for (mi = 1; mi <= nm; mi++) {
			split(ml[mi], md, ":"); k = md[1]; dir = md[2]
			name = (k in label) ? label[k] : k
			if (w == "lock-contend" && k == "rate") name = "handoffs/s"
			if (w == "lock-contend" && k ~ /_ms$/) name = "gap " name
			best = ""
			for (ti = 1; ti <= 3; ti++) {
				v[ti] = med(g "|" tg[ti] "|" k)
				if (ti > 1 && v[ti] != "" && dir != "=") {
					if (best == "" || (dir == "+" && v[ti] + 0 > best + 0) || (dir == "-" && v[ti] + 0 < best + 0)) best = v[ti]
				}
			}
			ratio = (v[1] != "" && best != "" && best + 0 != 0) ? sprintf("%.2f", v[1] / best) : "-"
			if (v[1] == "" && v[2] == "" && v[3] == "") continue
			printf "%-19s %-15s %12s %12s %12s %12s %9s %6s\n", g, name, fmt(v[1]), fmt(v[2]), fmt(v[3]), fmt(best), ratio, won(g, k, dir)
		}
	}
	for (k in failed) printf "failed runs: %s x%d\n", k, failed[k]
	print "hf/best: holdfast divided by the best peer; for rates above 1 is better, for ms, MiB and cpu% below 1 is."
	print "won: in how many runs holdfast beat the best peer of the same run (the i-th result of each target is one run)."
}
# won(g, k, dir): "W/N", holdfast'"'"'s wins over the best peer of each run, pairing
# the i-th value of every target; "-" when no run has holdfast and a peer.
function won(g, k, dir,   h, e, z, nh, ne, nz, i, b, w, n) {
	if (dir == "=") return "-"
	nh = split(vals[g "|holdfast|" k], h, " ")
	ne = split(vals[g "|etcd|" k], e, " ")
	nz = split(vals[g "|zk|" k], z, " ")
	for (i = 1; i <= nh; i++) {
		b = ""
		if (i <= ne) b = e[i]
		if (i <= nz && (b == "" || (dir == "+" && z[i] + 0 > b + 0) || (dir == "-" && z[i] + 0 < b + 0))) b = z[i]
		if (b == "") continue
		n++
		if ((dir == "+" && h[i] + 0 > b + 0) || (dir == "-" && h[i] + 0 < b + 0)) w++
	}
	return n ? (w + 0) "/" n : "-"
}
function fmt(x) { if (x == "") return "-"; return (x + 0 >= 100) ? sprintf("%.0f", x) : sprintf("%.3g", x) }
' "$1"
}

# ---- main

if [[ -n $REPORT ]]; then
	IFS=, read -r -a rfiles <<<"$REPORT"
	cat "${rfiles[@]}" >"$TMP/pooled" || exit 2
	REPORT=$TMP/pooled
	report "$REPORT"
	exit 0
fi
install_pkgs
build
IFS=, read -r -a tlist <<<"$TARGETS"
for t in "${tlist[@]}"; do start "$t" || true; done

DIRTY=0
for e in "${wlist[@]}"; do
	# e is NAME or NAME@N; w is the workload, nc its client count (0 = default).
	w=${e%@*} nc=$CLIENTS
	[[ $e == *@* ]] && nc=${e#*@}
	if [[ $w == sessions-keepalive ]]; then
		DIRTY=1
	elif ((DIRTY)); then
		# Left with many sessions by sessions-keepalive: start afresh.
		IFS=, read -r -a tl <<<"$TARGETS"
		for t in "${tl[@]}"; do start "$t" || true; done
		DIRTY=0
	fi
	for r in $(seq 1 "$RUNS"); do
		IFS=, read -r -a tl <<<"$TARGETS"
		((${#tl[@]})) || break 2
		# Rotate the order every run so that no target always goes first.
		n=${#tl[@]}
		for i in $(seq 0 $((n - 1))); do
			t=${tl[$(((i + r) % n))]}
			if [[ $w == sessions-keepalive ]]; then
				[[ $t == zk && $ZK_SESSIONS == 0 ]] && continue
				# Memory is measured from a freshly started, empty server.
				start "$t" || continue
			fi
			log "run $r/$RUNS: $e on $t"
			run_one "$t" "$w" "$nc"
		done
	done
done

if [[ -s $TMP/errors.log ]]; then
	log "some runs reported errors; first lines:"
	sort "$TMP/errors.log" | uniq -c | sort -rn | head -n 10 >&2
	if [[ -n $OUT ]]; then cp "$TMP/errors.log" "$OUT.errors"; fi
fi
report "$RESULTS"

exit 0
}
