package loadkit

import (
	"math"
	"math/bits"
	"time"
)

// Hist is a log-linear latency histogram in the spirit of HDR histograms:
// values below 256 ns are counted exactly, larger ones fall into buckets
// whose width is 1/128 of their magnitude, so any quantile it reports is
// within 0.8% of a value that was recorded. Memory is fixed (about 35 KiB)
// however many values are recorded. It is not safe for concurrent use:
// give each goroutine its own and Merge them at the end.
type Hist struct {
	counts [histBuckets]uint64
	n      uint64
	sum    float64 // nanoseconds; float so that it cannot overflow
	min    int64
	max    int64
}

const (
	histSubBits = 8
	histSub     = 1 << histSubBits // exact region and buckets per doubling, doubled
	histHalf    = histSub / 2
	// Values up to 2^40 ns (about 18 minutes) have their own bucket;
	// anything longer lands in the last one (its exact max is still kept).
	histMaxShift = 40 - histSubBits
	histBuckets  = histSub + histMaxShift*histHalf
)

func histIndex(v int64) int {
	if v < 0 {
		v = 0
	}
	u := uint64(v)
	if u < histSub {
		return int(u)
	}
	shift := bits.Len64(u) - histSubBits
	if shift > histMaxShift {
		return histBuckets - 1
	}
	return shift*histHalf + int(u>>uint(shift))
}

// histBounds returns the smallest value of bucket i and the bucket width.
func histBounds(i int) (lo, width int64) {
	if i < histSub {
		return int64(i), 1
	}
	shift := (i-histSub)/histHalf + 1
	m := int64(i - shift*histHalf)
	return m << uint(shift), int64(1) << uint(shift)
}

// Record adds one duration. Negative durations count as zero.
func (h *Hist) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.counts[histIndex(v)]++
	h.n++
	h.sum += float64(v)
}

// Merge adds all of o's values to h.
func (h *Hist) Merge(o *Hist) {
	if o == nil || o.n == 0 {
		return
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
}

// MergeAll returns one histogram holding the values of all of hs (typically
// one per client).
func MergeAll(hs []Hist) *Hist {
	m := &Hist{}
	for i := range hs {
		m.Merge(&hs[i])
	}
	return m
}

// Count is the number of values recorded.
func (h *Hist) Count() uint64 { return h.n }

// Min and Max are exact.
func (h *Hist) Min() time.Duration { return time.Duration(h.min) }

// Max is the largest value recorded.
func (h *Hist) Max() time.Duration { return time.Duration(h.max) }

// Mean is exact up to float rounding.
func (h *Hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the value at quantile q in [0,1] (nearest-rank
// definition: the smallest recorded value such that at least q of all
// values are <= it), approximated by the middle of its bucket and clamped
// to the exact min and max. It is 0 when nothing was recorded.
func (h *Hist) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q <= 0 {
		return time.Duration(h.min)
	}
	if q >= 1 {
		return time.Duration(h.max)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		if c == 0 {
			continue
		}
		seen += c
		if seen >= rank {
			lo, w := histBounds(i)
			v := lo + (w-1)/2
			if v < h.min {
				v = h.min
			}
			if v > h.max {
				v = h.max
			}
			return time.Duration(v)
		}
	}
	return time.Duration(h.max)
}
