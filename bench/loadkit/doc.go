// Package loadkit is what the benchmark commands bench/loadgen (holdfast
// and Consul, over Consul's HTTP API) and bench/peers (etcd and ZooKeeper)
// share, so that every target is driven, measured and reported alike:
//
//   - Config: the flags every target understands (Register, Check) and
//     the workload names (Workloads);
//   - Run: one run of a command, from parsed flags to the printed result
//     and the exit status, with a watchdog and SIGINT/SIGTERM handling;
//   - Loop: n clients doing operations until -duration or -max-ops, and
//     ErrLog, which counts their errors and prints the first few;
//   - Hist: a log-linear latency histogram (≤0.8 % error, fixed size);
//   - Result: the "result k=v ..." line and its JSON form, with WakeResult,
//     Handoffs.Result and KeepaliveResult for the workloads whose fields
//     are the same on every target;
//   - Handoffs: hand-offs and gaps of a contended lock;
//   - Keeper: the sessions-keepalive scheduler (create, renew every TTL/2,
//     destroy);
//   - ProcWatch: RSS and CPU time of the server (-pid) from /proc.
//
// It uses the standard library only: bench/peers, a module of its own so
// that the etcd and ZooKeeper clients stay out of holdfast's go.mod,
// requires the root module (with a replace to ../..) just for this
// package. See bench/README.md for the workloads and the output.
package loadkit
