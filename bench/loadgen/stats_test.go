package main

import (
	"encoding/json"
	"math"
	"math/rand"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

func TestHistBucketsCoverEveryValue(t *testing.T) {
	check := func(v int64) {
		i := histIndex(v)
		lo, w := histBounds(i)
		if v < lo || v >= lo+w {
			t.Fatalf("value %d in bucket %d = [%d,%d)", v, i, lo, lo+w)
		}
		if v >= histSub && float64(w)/float64(lo) > 1.0/64+1e-12 {
			t.Fatalf("bucket %d too wide: [%d,+%d)", i, lo, w)
		}
		if histIndex(lo) != i || histIndex(lo+w-1) != i {
			t.Fatalf("bucket %d bounds do not map back", i)
		}
	}
	for v := int64(0); v < 5000; v++ {
		check(v)
	}
	rnd := rand.New(rand.NewSource(1))
	for i := 0; i < 100000; i++ {
		check(rnd.Int63n(1 << uint(1+rnd.Intn(39))))
	}
	for s := 1; s < 40; s++ {
		check(1<<uint(s) - 1)
		check(1 << uint(s))
	}
	// Beyond the range: everything shares the last bucket.
	if histIndex(1<<50) != histBuckets-1 || histIndex(math.MaxInt64) != histBuckets-1 {
		t.Fatal("huge values must land in the last bucket")
	}
	if histIndex(-5) != 0 {
		t.Fatal("negative values count as zero")
	}
}

func exactQuantile(sorted []int64, q float64) int64 {
	rank := int(math.Ceil(q * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

func TestHistQuantilesMatchSortedSamples(t *testing.T) {
	rnd := rand.New(rand.NewSource(42))
	for _, n := range []int{1, 2, 7, 100, 12345} {
		var h Hist
		vals := make([]int64, n)
		for i := range vals {
			// Log-normal around 1 ms, like request latencies.
			v := int64(math.Exp(rnd.NormFloat64()*1.2) * float64(time.Millisecond))
			vals[i] = v
			h.Record(time.Duration(v))
		}
		sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
		for _, q := range []float64{0.001, 0.25, 0.5, 0.9, 0.99, 0.999} {
			want := float64(exactQuantile(vals, q))
			got := float64(h.Quantile(q))
			if math.Abs(got-want)/want > 0.008 {
				t.Errorf("n=%d q=%v: got %v want %v", n, q, time.Duration(got), time.Duration(want))
			}
		}
		if h.Min() != time.Duration(vals[0]) || h.Max() != time.Duration(vals[n-1]) {
			t.Errorf("n=%d: min/max %v/%v, want %v/%v", n, h.Min(), h.Max(), vals[0], vals[n-1])
		}
		if h.Count() != uint64(n) {
			t.Errorf("count %d want %d", h.Count(), n)
		}
	}
}

func TestHistSmallValuesExactAndEmpty(t *testing.T) {
	var h Hist
	if h.Quantile(0.5) != 0 || h.Mean() != 0 || h.Max() != 0 {
		t.Fatal("empty histogram must report zeros")
	}
	for v := 1; v <= 100; v++ {
		h.Record(time.Duration(v))
	}
	if h.Quantile(0.5) != 50 || h.Quantile(0.99) != 99 || h.Quantile(1) != 100 || h.Quantile(0) != 1 {
		t.Fatalf("p50=%d p99=%d", h.Quantile(0.5), h.Quantile(0.99))
	}
	if h.Mean() != 50 { // 50.5 truncated
		t.Fatalf("mean %d", h.Mean())
	}
	h.Record(-time.Second)
	if h.Min() != 0 {
		t.Fatal("negative durations count as zero")
	}
}

func TestHistMergeEqualsRecordingAll(t *testing.T) {
	rnd := rand.New(rand.NewSource(7))
	var all, a, b Hist
	for i := 0; i < 5000; i++ {
		d := time.Duration(rnd.Int63n(int64(50 * time.Millisecond)))
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var m Hist
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(nil)
	m.Merge(&Hist{})
	if m != all {
		t.Fatal("merged histogram differs from one fed every value")
	}
}

func TestHandoffGaps(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms float64) time.Time { return base.Add(time.Duration(ms * float64(time.Millisecond))) }
	h := &handoffs{measure: true}
	// Client 0 holds, releases at 1.0; client 1 acquires at 1.5.
	g := h.acquired(0, at(0))
	h.released(0, g, at(1))
	g = h.acquired(1, at(1.5))
	// Client 1's release response is seen after client 2's acquire: early.
	g2 := h.acquired(2, at(2.0))
	h.released(1, g, at(2.2))
	// Client 2 re-acquires itself: no hand-off, no gap.
	h.released(2, g2, at(3))
	g = h.acquired(2, at(3.1))
	// A release whose response never came (error): the next acquire pairs with nothing.
	g = h.acquired(0, at(5))
	h.released(0, g, at(6))
	h.acquired(1, at(6.25))

	if h.acquires != 6 || h.reacquires != 1 {
		t.Fatalf("acquires=%d reacquires=%d", h.acquires, h.reacquires)
	}
	if h.handoffs != 3 || h.early != 1 {
		t.Fatalf("handoffs=%d early=%d", h.handoffs, h.early)
	}
	if h.gap.Count() != 3 || h.gap.Min() != 0 || h.gap.Max() != 500*time.Microsecond {
		t.Fatalf("gaps n=%d min=%v max=%v", h.gap.Count(), h.gap.Min(), h.gap.Max())
	}
	if q := h.gap.Quantile(0.5); math.Abs(float64(q-250*time.Microsecond)) > 0.008*float64(250*time.Microsecond) {
		t.Fatalf("median gap %v", h.gap.Quantile(0.5))
	}
}

func TestResultLineAndJSON(t *testing.T) {
	lat := &Hist{}
	for i := 1; i <= 1000; i++ {
		lat.Record(time.Duration(i) * time.Microsecond)
	}
	r := &Result{Target: "holdfast", Workload: "put", Clients: 32, Elapsed: 2 * time.Second, Ops: 1000,
		Unit: "ops", LatName: "op", Lat: lat}
	r.Str("note", "two words")
	r.Int("extra", 7)
	line := r.Line()
	head := "result target=holdfast workload=put clients=32 duration_s=2.00 ops=1000 errors=0 unit=ops rate=500.0 lat=op lat_n=1000 p50_ms="
	tail := " max_ms=1.000 mean_ms=0.500 note=two_words extra=7"
	if !strings.HasPrefix(line, head) || !strings.HasSuffix(line, tail) {
		t.Fatalf("line %s", line)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(r.JSON()), &m); err != nil {
		t.Fatal(err)
	}
	if p50 := m["p50_ms"].(float64); math.Abs(p50-0.5) > 0.005 {
		t.Fatalf("p50 %v", p50)
	}
	if m["rate"] != 500.0 || m["target"] != "holdfast" || m["extra"] != 7.0 || m["note"] != "two_words" {
		t.Fatalf("json %v", m)
	}
	for _, f := range strings.Fields(line)[1:] {
		if strings.Count(f, "=") != 1 {
			t.Fatalf("field %q is not key=value", f)
		}
	}
}

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

func TestConfigCheck(t *testing.T) {
	c := config{workload: "put", duration: time.Second, timeout: time.Second, setupTimeout: time.Second,
		keys: 10, sessions: 1, maxOps: 1, sessionTTL: time.Minute}
	if err := c.check(); err != nil || c.clients != 32 || c.watchers != 32 {
		t.Fatalf("check: %v clients=%d", err, c.clients)
	}
	c.workload = "nope"
	if err := c.check(); err == nil {
		t.Fatal("unknown workload accepted")
	}
	c.workload = wLockContend
	c.clients = 0
	c.watchers = 0
	if err := c.check(); err != nil || c.clients != 8 {
		t.Fatalf("lock-contend default clients %d", c.clients)
	}
}
