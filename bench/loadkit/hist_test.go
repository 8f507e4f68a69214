package loadkit

import (
	"math"
	"math/rand"
	"sort"
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
