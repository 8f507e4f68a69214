//go:build linux

// Command fsynclat measures how long a durable append takes on a disk: it
// writes small records to a file and syncs after each, as a raft log does
// for every batch, and prints the latency distribution. It tries the ways a
// log file can be prepared and synced, so that a slow write path can be
// told apart from a slow disk:
//
//	append      the file grows with each record
//	fallocate   the file's space is reserved first (raft-wal's segments)
//	zerofill    the file is written with zeros first (no block changes state)
//
// each synced with fsync and with fdatasync. The floor of any durable
// write (holdfast's, etcd's, ZooKeeper's) on that disk is the sync's.
//
//	go run ./bench/fsynclat -dir /var/lib/holdfast -d 3s
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fsynclat:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("fsynclat", flag.ContinueOnError)
	dir := fs.String("dir", ".", "directory on the disk to measure (a temporary file is made and removed there)")
	dur := fs.Duration("d", 2*time.Second, "time spent on each way")
	size := fs.Int("size", 150, "bytes per record")
	rounds := fs.Int("rounds", 2, "times every way is measured, in turn")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *size < 1 || *rounds < 1 || *dur <= 0 {
		return fmt.Errorf("-size, -rounds and -d must be positive")
	}
	const prealloc = 64 << 20
	preps := []struct {
		name string
		prep func(f *os.File) error
	}{
		{"append", func(*os.File) error { return nil }},
		{"fallocate", func(f *os.File) error { return syscall.Fallocate(int(f.Fd()), 0, 0, prealloc) }},
		{"zerofill", func(f *os.File) error {
			zeros := make([]byte, 1<<20)
			for i := 0; i < prealloc>>20; i++ {
				if _, err := f.Write(zeros); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	syncs := []struct {
		name string
		sync func(f *os.File) error
	}{
		{"fsync", (*os.File).Sync},
		{"fdatasync", func(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }},
	}
	fmt.Fprintf(out, "%-22s %8s %9s %9s %9s %9s\n", "way", "syncs", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms")
	for r := 0; r < *rounds; r++ {
		for _, p := range preps {
			for _, s := range syncs {
				lats, err := measure(*dir, *size, *dur, p.prep, s.sync)
				if err != nil {
					return fmt.Errorf("%s+%s: %w", p.name, s.name, err)
				}
				q := func(f float64) string {
					return fmt.Sprintf("%.3f", float64(lats[int(f*float64(len(lats)-1))].Microseconds())/1000)
				}
				fmt.Fprintf(out, "%-22s %8d %9s %9s %9s %9s\n", p.name+"+"+s.name, len(lats), q(0.5), q(0.9), q(0.99), q(0.999))
			}
		}
	}
	return nil
}

// measure appends size-byte records to a fresh file in dir, prepared by
// prep, syncing each with sync, for d; it returns the sorted latencies of
// write plus sync.
func measure(dir string, size int, d time.Duration, prep, sync func(*os.File) error) ([]time.Duration, error) {
	f, err := os.CreateTemp(dir, "fsynclat-*.dat")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := prep(f); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := syncDir(filepath.Dir(f.Name())); err != nil {
		return nil, err
	}
	rec := make([]byte, size)
	var lats []time.Duration
	var off int64
	for start := time.Now(); time.Since(start) < d; {
		t := time.Now()
		if _, err := f.WriteAt(rec, off); err != nil {
			return nil, err
		}
		if err := sync(f); err != nil {
			return nil, err
		}
		lats = append(lats, time.Since(t))
		off += int64(size)
	}
	slices.Sort(lats)
	return lats, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
