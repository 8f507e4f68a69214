package loadkit

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Result is what one workload run prints. Its line form is
//
//	result target=etcd workload=put clients=32 duration_s=10.00 ops=289000 errors=0 unit=ops rate=28900.0 lat=op p50_ms=1.020 p99_ms=2.300 max_ms=9.100 mean_ms=1.100 [extra key=value...]
//
// Keys never change meaning; new ones are only ever appended.
type Result struct {
	Target   string
	Workload string
	Clients  int
	Elapsed  time.Duration // the measured phase only
	Ops      int64         // units of work done, counted in Unit
	Errors   int64
	Unit     string // what Ops counts: ops, cycles, handoffs, wakes, renewals
	LatName  string // what Lat measures: op, cycle, gap, wake, renew
	Lat      *Hist
	Extra    []Field
}

// Field is one extra key=value pair; Num says whether the JSON form is a
// bare number rather than a string.
type Field struct {
	Key string
	Val string
	Num bool
}

// Int appends an integer field.
func (r *Result) Int(k string, v int64) {
	r.Extra = append(r.Extra, Field{k, strconv.FormatInt(v, 10), true})
}

// Float appends a float field with prec decimals.
func (r *Result) Float(k string, v float64, prec int) {
	r.Extra = append(r.Extra, Field{k, strconv.FormatFloat(v, 'f', prec, 64), true})
}

// Str appends a string field; spaces become underscores so the line stays
// splittable on blanks.
func (r *Result) Str(k, v string) { r.Extra = append(r.Extra, Field{k, cleanValue(v), false}) }

// Ms appends a duration field in milliseconds with 3 decimals.
func (r *Result) Ms(k string, d time.Duration) { r.Float(k, ms(d), 3) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func cleanValue(v string) string {
	if v == "" {
		return "-"
	}
	return strings.Map(func(c rune) rune {
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '=' {
			return '_'
		}
		return c
	}, v)
}

// Rate is Ops per second of Elapsed.
func (r *Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Fields lists every field in print order.
func (r *Result) Fields() []Field {
	lat := r.Lat
	if lat == nil {
		lat = &Hist{}
	}
	f := []Field{
		{"target", cleanValue(r.Target), false},
		{"workload", cleanValue(r.Workload), false},
		{"clients", strconv.Itoa(r.Clients), true},
		{"duration_s", strconv.FormatFloat(r.Elapsed.Seconds(), 'f', 2, 64), true},
		{"ops", strconv.FormatInt(r.Ops, 10), true},
		{"errors", strconv.FormatInt(r.Errors, 10), true},
		{"unit", cleanValue(r.Unit), false},
		{"rate", strconv.FormatFloat(r.Rate(), 'f', 1, 64), true},
		{"lat", cleanValue(r.LatName), false},
		{"lat_n", strconv.FormatUint(lat.Count(), 10), true},
		{"p50_ms", strconv.FormatFloat(ms(lat.Quantile(0.50)), 'f', 3, 64), true},
		{"p99_ms", strconv.FormatFloat(ms(lat.Quantile(0.99)), 'f', 3, 64), true},
		{"max_ms", strconv.FormatFloat(ms(lat.Max()), 'f', 3, 64), true},
		{"mean_ms", strconv.FormatFloat(ms(lat.Mean()), 'f', 3, 64), true},
	}
	return append(f, r.Extra...)
}

// Line is the greppable form: "result k=v k=v ...".
func (r *Result) Line() string {
	var b strings.Builder
	b.WriteString("result")
	for _, f := range r.Fields() {
		b.WriteByte(' ')
		b.WriteString(f.Key)
		b.WriteByte('=')
		b.WriteString(f.Val)
	}
	return b.String()
}

// JSON is the same fields as one flat JSON object, in the same order.
func (r *Result) JSON() string {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range r.Fields() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(jsonString(f.Key))
		b.WriteByte(':')
		if f.Num {
			b.WriteString(f.Val)
		} else {
			b.Write(jsonString(f.Val))
		}
	}
	b.WriteByte('}')
	return b.String()
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return b
}

// WakePause is how long every target's watch-wake round waits between
// arming its watchers and the write. holdfast needs it: an HTTP blocking
// query sends nothing back when the server parks it, so the load generator
// gives the server this long to park the queries it has been sent. The
// peers, whose watchers are known to be armed (ZooKeeper's GetW has
// answered, etcd's watch streams are long-lived), wait the same time so
// that every target writes from the same state: on a virtual machine,
// CPUs left idle for a millisecond wake up measurably slower (ZooKeeper's
// wake-up p50 went 1.03 -> 1.41 ms with the pause on 2026-11-21), and a
// round that starts warm would not be comparable with one that does not.
const WakePause = time.Millisecond

// WakeResult is the watch-wake result of watchers watching for elapsed:
// one latency histogram per watcher, rounds writes and missed wakes (a
// watcher that saw no change within -timeout).
func WakeResult(watchers int, hists []Hist, rounds, missed int64, elapsed time.Duration) *Result {
	lat := MergeAll(hists)
	r := &Result{Clients: watchers, Ops: int64(lat.Count()), Lat: lat, Elapsed: elapsed, Unit: "wakes", LatName: "wake"}
	r.Int("rounds", rounds)
	r.Int("missed", missed)
	return r
}
