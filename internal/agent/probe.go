package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/holdfast/holdfast/internal/state"
)

// userAgent is sent by HTTP checks that set no User-Agent of their own.
const userAgent = "holdfast health check"

// probe runs one HTTP or TCP check and returns its status and output. Its
// timeout runs on the agent's clock; ctx ends it early (the check stopped).
func (a *Agent) probe(ctx context.Context, def *state.CheckDefinition, kind checkKind) checkStatus {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var timedOut atomic.Bool
	t := a.cfg.Clock.AfterFunc(def.Timeout, func() {
		timedOut.Store(true)
		cancel()
	})
	defer t.Stop()
	var st checkStatus
	if kind == kindHTTP {
		st = a.probeHTTP(pctx, def)
	} else {
		st = a.probeTCP(pctx, def)
	}
	if st.Status == noVerdict {
		return st
	}
	if st.Status == state.HealthCritical && timedOut.Load() {
		target := def.TCP
		if kind == kindHTTP {
			target = def.Method + " " + def.HTTP
		}
		st.Output = fmt.Sprintf("%s %s: timed out after %v", strings.ToUpper(string(kind)), target, def.Timeout)
	}
	return st
}

// probeHTTP: any 2xx is passing, 429 Too Many Requests is warning,
// anything else (or no answer) is critical.
func (a *Agent) probeHTTP(ctx context.Context, def *state.CheckDefinition) checkStatus {
	var body io.Reader
	if def.Body != "" {
		body = strings.NewReader(def.Body)
	}
	req, err := http.NewRequestWithContext(ctx, def.Method, def.HTTP, body)
	if err != nil {
		return checkStatus{state.HealthCritical, fmt.Sprintf("HTTP %s %s: %v", def.Method, def.HTTP, err)}
	}
	for k, vs := range def.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", userAgent)
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "text/plain, text/*, */*")
	}
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
	}
	client := a.http
	if def.TLSSkipVerify {
		client = a.insecure
	}
	resp, err := client.Do(req)
	if err != nil {
		return failed(fmt.Sprintf("HTTP %s %s", def.Method, def.HTTP), err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, MaxOutput))
	out := fmt.Sprintf("HTTP %s %s: %s Output: %s", def.Method, def.HTTP, resp.Status, b)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		return checkStatus{state.HealthPassing, out}
	case resp.StatusCode == http.StatusTooManyRequests:
		return checkStatus{state.HealthWarning, out}
	default:
		return checkStatus{state.HealthCritical, out}
	}
}

// failed is the status of a probe of what that got err: critical, or no
// verdict if err is this process running out of file descriptors (EMFILE,
// or ENFILE for the whole system), which says nothing of the service.
func failed(what string, err error) checkStatus {
	out := fmt.Sprintf("%s: %v", what, err)
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return checkStatus{noVerdict, out}
	}
	return checkStatus{state.HealthCritical, out}
}

// probeTCP: a connection made is passing, anything else critical.
func (a *Agent) probeTCP(ctx context.Context, def *state.CheckDefinition) checkStatus {
	conn, err := a.cfg.Dialer.DialContext(ctx, "tcp", def.TCP)
	if err != nil {
		return failed("TCP connect "+def.TCP, err)
	}
	conn.Close()
	return checkStatus{state.HealthPassing, fmt.Sprintf("TCP connect %s: Success", def.TCP)}
}
