// Package logstore holds benchmarks that compare the candidate raft log
// stores for holdfast: hashicorp/raft-wal and hashicorp/raft-boltdb/v2 (with
// fsync enabled). The package has no code of its own; the benchmarks live in
// the _test.go files and the figures and the decision they led to are in
// README.md next to this file.
//
// Run them with:
//
//	go test -run '^$' -bench . -count 6 ./bench/logstore/
package logstore
