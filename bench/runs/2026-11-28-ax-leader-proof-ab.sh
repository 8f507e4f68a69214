#!/usr/bin/env bash
# ableader.sh ROUNDS: alternates hf-old and hf-new clusters of three, loadgen on the leader.
cd /tmp/c3
for r in $(seq 1 "$1"); do
  for b in old new; do
    pkill -f "hf-(old|new) agent" ; sleep 0.5
    rm -rf d1 d2 d3
    for i in 1 2 3; do ./hf-$b agent -node hf$i -data-dir d$i -http-addr 127.0.0.1:1960$i -server-addr 127.0.0.1:1961$i -serf-addr 127.0.0.1:1962$i -bootstrap-expect 3 -join 127.0.0.1:19621 > log$i 2>&1 & done
    for _ in $(seq 1 100); do l=$(curl -s 127.0.0.1:19601/v1/status/leader | tr -d '"'); [[ -n $l ]] && break; sleep 0.1; done
    sleep 1; l=$(curl -s 127.0.0.1:19601/v1/status/leader | tr -d '"')
    li=$(( ${l: -1} - 1 )); li=${li#-}; 
    # raft port 1961x -> http 1960x
    n=${l: -1}
    ./loadgen -addr 127.0.0.1:1960$n -workload ping -duration 3s -quiet >/dev/null
    fp=$(pgrep -f "hf-$b agent -node hf$n ")
    for w in "get-consistent 1" "get-consistent 32" "lock-contend 32"; do
      set -- $w
      line=$(./loadgen -addr 127.0.0.1:1960$n -workload $1 -clients $2 -duration 5s -pid $fp -quiet 2>/dev/null | grep "^result")
      echo "bin=$b round=$r leader=hf$n $line"
    done
    # reads while 32 writers run
    ./loadgen -addr 127.0.0.1:1960$n -workload put -clients 32 -duration 7s -quiet >/dev/null 2>&1 & wp=$!
    sleep 1
    line=$(./loadgen -addr 127.0.0.1:1960$n -workload get-consistent -clients 8 -duration 5s -quiet 2>/dev/null | grep "^result")
    echo "bin=$b round=$r leader=hf$n mixed $line"
    wait $wp
  done
done
pkill -f "hf-(old|new) agent"
