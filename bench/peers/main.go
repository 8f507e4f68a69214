// Command peers runs bench/loadgen's workloads against etcd and ZooKeeper,
// the systems holdfast is measured against, with the same flags and the
// same result line: both are built on bench/loadkit. It is its own module
// so that the etcd and ZooKeeper clients never become dependencies of
// holdfast; it takes loadkit from this checkout (see go.mod).
//
//	cd bench/peers && go run . -target etcd -addr 127.0.0.1:2379 -workload put
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/holdfast/holdfast/bench/loadkit"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg loadkit.Config
	cfg.Register(fs, 10_000)
	fs.StringVar(&cfg.Target, "target", "", "etcd or zk")
	fs.StringVar(&cfg.Addr, "addr", "", "server client address (default 127.0.0.1:2379 for etcd, 127.0.0.1:2181 for zk)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var drive func(context.Context, *loadkit.Config, *loadkit.ErrLog, *loadkit.ProcWatch) (*loadkit.Result, error)
	switch cfg.Target {
	case "etcd":
		drive = runEtcd
		if cfg.Addr == "" {
			cfg.Addr = "127.0.0.1:2379"
		}
	case "zk":
		drive = runZK
		if cfg.Addr == "" {
			cfg.Addr = "127.0.0.1:2181"
		}
	default:
		fmt.Fprintln(stderr, "peers: -target must be etcd or zk")
		return 2
	}
	if err := cfg.Check(); err != nil {
		fmt.Fprintln(stderr, "peers:", err)
		return 2
	}
	return loadkit.Run("peers", &cfg, stdout, stderr,
		func(ctx context.Context, el *loadkit.ErrLog, pw *loadkit.ProcWatch) (*loadkit.Result, error) {
			return drive(ctx, &cfg, el, pw)
		})
}
