package loadkit

import (
	"math"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
)

func TestParseProcFiles(t *testing.T) {
	status := "Name:\tetcd\nVmPeak:\t  99 kB\nVmRSS:\t   52340 kB\nRssAnon:\t 1 kB\n"
	if v, err := parseVmRSS([]byte(status)); err != nil || v != 52340 {
		t.Fatalf("VmRSS = %d, %v", v, err)
	}
	if _, err := parseVmRSS([]byte("Name: x\n")); err == nil {
		t.Fatal("missing VmRSS must be an error")
	}
	// A command name with spaces and parentheses must not shift the fields.
	stat := "4242 (we(ird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 12 0 100 1000 500\n"
	if v, err := parseStatCPU([]byte(stat)); err != nil || v != 1234+567 {
		t.Fatalf("cpu = %d, %v", v, err)
	}
	if _, err := parseStatCPU([]byte("1 (x) S 1 2")); err == nil {
		t.Fatal("short stat must be an error")
	}
	a := procSample{at: time.Unix(0, 0), cpuTicks: 100}
	b := procSample{at: time.Unix(2, 0), cpuTicks: 250}
	if p := cpuPercent(a, b); math.Abs(p-75) > 1e-9 {
		t.Fatalf("cpu%% = %v", p)
	}
	// The real thing, on ourselves.
	s, err := sampleProc(os.Getpid())
	if err != nil || s.rssKiB <= 0 {
		t.Fatalf("sampleProc(self) = %+v, %v", s, err)
	}
}

func TestProcWatchCountsGeneratorGCs(t *testing.T) {
	pw := NewProcWatch(0, &ErrLog{})
	pw.MeasureStart()
	runtime.GC()
	runtime.GC()
	var r Result
	pw.Finish(&r)
	f := r.Fields()
	var got string
	for _, x := range f {
		if x.Key == "gen_gcs" {
			got = x.Val
		}
	}
	if n, err := strconv.Atoi(got); err != nil || n < 2 {
		t.Fatalf("gen_gcs %q after two collections, want at least 2 (fields %v)", got, f)
	}
}
