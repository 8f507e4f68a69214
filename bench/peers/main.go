// Command peers runs bench/loadgen's workloads against etcd and ZooKeeper,
// the systems holdfast is measured against, with the same flags and the
// same result line. It is its own module so that the etcd and ZooKeeper
// clients never become dependencies of holdfast.
//
//	cd bench/peers && go run . -target etcd -addr 127.0.0.1:2379 -workload put
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	cfg.register(fs, 10_000)
	fs.StringVar(&cfg.target, "target", "", "etcd or zk")
	fs.StringVar(&cfg.addr, "addr", "", "server client address (default 127.0.0.1:2379 for etcd, 127.0.0.1:2181 for zk)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	switch cfg.target {
	case "etcd":
		if cfg.addr == "" {
			cfg.addr = "127.0.0.1:2379"
		}
	case "zk":
		if cfg.addr == "" {
			cfg.addr = "127.0.0.1:2181"
		}
	default:
		fmt.Fprintln(stderr, "peers: -target must be etcd or zk")
		return 2
	}
	if err := cfg.check(); err != nil {
		fmt.Fprintln(stderr, "peers:", err)
		return 2
	}
	startWatchdog("peers", cfg.watchdogLimit())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	el := &errLog{w: stderr}
	if cfg.quiet {
		el.w = nil
	}
	pw := newProcWatch(cfg.pid, el)
	var r *Result
	var err error
	if cfg.target == "etcd" {
		r, err = runEtcd(ctx, &cfg, el, pw)
	} else {
		r, err = runZK(ctx, &cfg, el, pw)
	}
	if r != nil {
		r.Target = cfg.target
		r.Workload = cfg.workload
		r.Errors = el.count()
		pw.finish(r)
		fmt.Fprintln(stdout, r.Line())
		if cfg.jsonOut {
			fmt.Fprintln(stdout, r.JSON())
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "peers:", err)
		return 1
	}
	if r.Ops == 0 {
		fmt.Fprintln(stderr, "peers: no operation succeeded")
		return 1
	}
	return 0
}
