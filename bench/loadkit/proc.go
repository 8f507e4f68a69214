package loadkit

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"
	"time"
)

// clockTicks is the unit of utime and stime in /proc/PID/stat (USER_HZ).
// It is 100 on every Linux architecture Go supports in practice; the
// standard library has no sysconf to ask.
const clockTicks = 100

// procSample is one reading of a process's memory and CPU time.
type procSample struct {
	at       time.Time
	rssKiB   int64
	cpuTicks int64 // utime + stime
}

func sampleProc(pid int) (procSample, error) {
	at := time.Now()
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procSample{}, err
	}
	rss, err := parseVmRSS(st)
	if err != nil {
		return procSample{}, err
	}
	sb, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, err
	}
	cpu, err := parseStatCPU(sb)
	if err != nil {
		return procSample{}, err
	}
	return procSample{at: at, rssKiB: rss, cpuTicks: cpu}, nil
}

// parseVmRSS reads the "VmRSS:  1234 kB" line of /proc/PID/status.
func parseVmRSS(b []byte) (int64, error) {
	for _, line := range bytes.Split(b, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("unexpected VmRSS line %q", line)
		}
		return strconv.ParseInt(string(f[0]), 10, 64)
	}
	return 0, errors.New("no VmRSS line (is it a kernel thread or a zombie?)")
}

// parseStatCPU returns utime+stime from /proc/PID/stat. The command name
// (field 2) is in parentheses and may itself hold spaces and parentheses,
// so fields are counted from the last ')'.
func parseStatCPU(b []byte) (int64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat: no ')'")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), so field n is f[n-3]: utime=14, stime=15.
	if len(f) < 13 {
		return 0, fmt.Errorf("malformed stat: %d fields after the name", len(f))
	}
	u, err := strconv.ParseInt(string(f[11]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	s, err := strconv.ParseInt(string(f[12]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	return u + s, nil
}

// cpuPercent is the CPU the process used between two samples, in percent of
// one core.
func cpuPercent(a, b procSample) float64 {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return 0
	}
	return float64(b.cpuTicks-a.cpuTicks) / clockTicks / wall * 100
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// ProcWatch samples the server process given with -pid around a measured
// phase and adds the fields to a Result: rss_before_mib (at the start of the
// run), rss_after_mib, rss_delta_mib, and cpu_pct over the measured phase.
// It always adds gen_gcs, the load generator's own garbage collections from
// the start of the measured phase to the result; with pid 0 nothing else.
type ProcWatch struct {
	gcStart       uint64 // the generator's own collections before the measured phase
	pid           int
	before, start procSample
	okBefore      bool
	okStart       bool
	el            *ErrLog
}

// NewProcWatch takes the "before" sample at once; failures go to el.
func NewProcWatch(pid int, el *ErrLog) *ProcWatch {
	p := &ProcWatch{pid: pid, el: el}
	if pid <= 0 {
		return p
	}
	s, err := sampleProc(pid)
	if err != nil {
		el.Add("sample -pid", err)
		return p
	}
	p.before, p.okBefore = s, true
	return p
}

// MeasureStart marks the start of the measured phase.
func (p *ProcWatch) MeasureStart() {
	p.gcStart = gcCycles()
	if p.pid <= 0 {
		return
	}
	s, err := sampleProc(p.pid)
	if err != nil {
		p.el.Add("sample -pid", err)
		return
	}
	p.start, p.okStart = s, true
}

// Finish samples again and appends the fields to r.
func (p *ProcWatch) Finish(r *Result) {
	r.Int("gen_gcs", int64(gcCycles()-p.gcStart))
	if p.pid <= 0 || !p.okBefore || !p.okStart {
		return
	}
	s, err := sampleProc(p.pid)
	if err != nil {
		p.el.Add("sample -pid", err)
		return
	}
	r.Int("pid", int64(p.pid))
	r.Float("rss_before_mib", mib(p.before.rssKiB), 1)
	r.Float("rss_after_mib", mib(s.rssKiB), 1)
	r.Float("rss_delta_mib", mib(s.rssKiB-p.before.rssKiB), 1)
	r.Float("cpu_pct", cpuPercent(p.start, s), 1)
}

// gcCycles is how many garbage collections this process has completed.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
