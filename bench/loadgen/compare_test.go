package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// compareLines are three interleaved runs of put against the three targets,
// in the format loadgen prints and bench/compare.sh saves with -o. The run
// winners are known: the rate goes to zk in run 1 and to holdfast in runs 2
// and 3; the p99 to zk in run 1 and to holdfast in runs 2 and 3 (etcd is
// never the best peer on either).
const compareLines = `result target=holdfast workload=put clients=32 duration_s=10.00 rate=100 p50_ms=1 p99_ms=5
result target=etcd workload=put clients=32 duration_s=10.00 rate=50 p50_ms=2 p99_ms=9
result target=zk workload=put clients=32 duration_s=10.00 rate=120 p50_ms=1.5 p99_ms=4
result target=etcd workload=put clients=32 duration_s=10.00 rate=60 p50_ms=2 p99_ms=9
result target=zk workload=put clients=32 duration_s=10.00 rate=110 p50_ms=1.5 p99_ms=4
result target=holdfast workload=put clients=32 duration_s=10.00 rate=130 p50_ms=1 p99_ms=3
result target=zk workload=put clients=32 duration_s=10.00 rate=100 p50_ms=0.5 p99_ms=3
result target=holdfast workload=put clients=32 duration_s=10.00 rate=140 p50_ms=1 p99_ms=2
result target=etcd workload=put clients=32 duration_s=10.00 rate=70 p50_ms=2 p99_ms=9
`

// compareTable runs compare.sh -R on the files (a leading "-w", LIST pair
// is passed on) and returns its table's put lines by metric.
func compareTable(t *testing.T, files ...string) map[string][]string {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	args := []string{"../compare.sh"}
	if len(files) > 2 && files[0] == "-w" {
		args, files = append(args, "-w", files[1]), files[2:]
	}
	out, err := exec.Command("bash", append(args, "-R", strings.Join(files, ","))...).CombinedOutput()
	if err != nil {
		t.Fatalf("compare.sh -R: %v\n%s", err, out)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && (f[0] == "put" || f[0] == "put@1") {
			// "rate/s", or "p99" "ms": the metric name is one or two words.
			name, rest := f[1], f[2:]
			if rest[0] == "ms" {
				name, rest = name+" ms", rest[1:]
			}
			rows[name] = rest
		}
	}
	return rows
}

func TestCompareReportCountsRunsWon(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.txt")
	b := filepath.Join(dir, "b.txt")
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, []byte(compareLines), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Columns: holdfast, etcd, zk, best peer, hf/best, won.
	for _, tc := range []struct {
		files []string
		want  map[string][]string
	}{
		{[]string{a}, map[string][]string{
			"rate/s": {"130", "60", "110", "110", "1.18", "2/3"},
			"p50 ms": {"1", "2", "1.5", "1.5", "0.67", "2/3"},
			"p99 ms": {"3", "9", "4", "4", "0.75", "2/3"},
		}},
		// Pooled: the runs of both files add up.
		{[]string{a, b}, map[string][]string{
			"rate/s": {"130", "60", "110", "110", "1.18", "4/6"},
			"p99 ms": {"3", "9", "4", "4", "0.75", "4/6"},
		}},
	} {
		rows := compareTable(t, tc.files...)
		for metric, want := range tc.want {
			if got := rows[metric]; strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("%d file(s), put %s: got %q, want %q", len(tc.files), metric, got, want)
			}
		}
	}
}

// TestCompareReportKeepsClientCountsApart: a saved line with a client count
// that is neither a listed NAME@N nor the plain group's count is left out,
// so that put@1 lines in a file do not pool into "-w put".
func TestCompareReportKeepsClientCountsApart(t *testing.T) {
	one := `result target=holdfast workload=put clients=1 duration_s=10.00 rate=5 p50_ms=7 p99_ms=70
result target=etcd workload=put clients=1 duration_s=10.00 rate=4 p50_ms=8 p99_ms=80
result target=zk workload=put clients=1 duration_s=10.00 rate=3 p50_ms=9 p99_ms=90
`
	p := filepath.Join(t.TempDir(), "mixed.txt")
	if err := os.WriteFile(p, []byte(compareLines+one+one+one), 0o644); err != nil {
		t.Fatal(err)
	}
	rows := compareTable(t, "-w", "put", p)
	want := []string{"130", "60", "110", "110", "1.18", "2/3"}
	if got := rows["rate/s"]; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("-w put over 32- and 1-client lines: rate row %q, want %q (the 32-client runs alone)", got, want)
	}
	rows = compareTable(t, "-w", "put@1", p)
	want = []string{"5", "4", "3", "4", "1.25", "3/3"}
	if got := rows["rate/s"]; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("-w put@1: rate row %q, want %q", got, want)
	}
}

// TestCompareRefusesBadClusterFlags: compare.sh checks -C and -F before it
// installs, builds or starts anything, and says what was wrong.
func TestCompareRefusesBadClusterFlags(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-C", "4"}, "compare.sh: -C: want 1, 3 or 5 servers, not '4'"},
		{[]string{"-C", "x"}, "compare.sh: -C: want 1, 3 or 5 servers, not 'x'"},
		{[]string{"-F"}, "compare.sh: -F needs -C 3 or 5"},
	} {
		cmd := exec.Command("bash", append([]string{"../compare.sh", "-n"}, tc.args...)...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || strings.TrimSpace(string(out)) != tc.want {
			t.Errorf("compare.sh %v: %v\n%s\nwant exit 2 and %q", tc.args, err, out, tc.want)
		}
	}
}
