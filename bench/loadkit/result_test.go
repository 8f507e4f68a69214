package loadkit

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

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
