package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/api"
)

// consul is a minimal client for the parts of Consul's HTTP API the
// workloads use. All requests go through one keep-alive transport.
type consul struct {
	base    string
	hc      *http.Client
	timeout time.Duration
}

func newConsul(addr string, conns int, timeout time.Duration) *consul {
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return &consul{base: strings.TrimRight(base, "/"), hc: &http.Client{Transport: newTransport(conns)}, timeout: timeout}
}

// newTransport returns the client transport -transport names, keeping
// enough idle connections for conns concurrent requests.
func newTransport(conns int) http.RoundTripper {
	idle := 2*conns + 16
	if transport == "stdlib" {
		return &http.Transport{
			Proxy:                 nil, // load goes to the address given, never via a proxy
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:          idle,
			MaxIdleConnsPerHost:   idle,
			IdleConnTimeout:       90 * time.Second,
			DisableCompression:    true,
			ForceAttemptHTTP2:     false,
			ExpectContinueTimeout: 0,
		}
	}
	return &api.Transport{MaxIdleConnsPerHost: idle}
}

func (c *consul) close() { c.hc.CloseIdleConnections() }

// statusError is a non-2xx answer.
type statusError struct {
	code int
	body string
}

func (e *statusError) Error() string {
	b := e.body
	if len(b) > 200 {
		b = b[:200] + "..."
	}
	return fmt.Sprintf("HTTP %d: %s", e.code, strings.TrimSpace(b))
}

// do sends one request and reads the whole response. extra is added to
// the request timeout (for blocking queries).
func (c *consul) do(ctx context.Context, method, path string, q url.Values, body []byte, extra time.Duration) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout+extra)
	defer cancel()
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, b, nil
}

func (c *consul) createSession(ctx context.Context, ttl time.Duration) (string, error) {
	body := fmt.Sprintf(`{"TTL":"%ds","LockDelay":"0s","Behavior":"release"}`, int64(ttl/time.Second))
	code, _, b, err := c.do(ctx, http.MethodPut, "/v1/session/create", nil, []byte(body), 0)
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", &statusError{code, string(b)}
	}
	var out struct{ ID string }
	if err := json.Unmarshal(b, &out); err != nil {
		return "", fmt.Errorf("session create: %w", err)
	}
	if out.ID == "" {
		return "", fmt.Errorf("session create: no ID in %q", b)
	}
	return out.ID, nil
}

func (c *consul) destroySession(ctx context.Context, id string) error {
	code, _, b, err := c.do(ctx, http.MethodPut, "/v1/session/destroy/"+id, nil, nil, 0)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return &statusError{code, string(b)}
	}
	return nil
}

// renewSession reports false, nil when the session no longer exists.
func (c *consul) renewSession(ctx context.Context, id string) (bool, error) {
	code, _, b, err := c.do(ctx, http.MethodPut, "/v1/session/renew/"+id, nil, nil, 0)
	if err != nil {
		return false, err
	}
	switch code {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	}
	return false, &statusError{code, string(b)}
}

func parseBool(code int, b []byte) (bool, error) {
	if code != http.StatusOK {
		return false, &statusError{code, string(b)}
	}
	switch strings.TrimSpace(string(b)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("expected true or false, got %q", b)
}

func (c *consul) kvPut(ctx context.Context, key string, q url.Values, val []byte) (bool, error) {
	if val == nil {
		val = []byte{}
	}
	code, _, b, err := c.do(ctx, http.MethodPut, "/v1/kv/"+key, q, val, 0)
	if err != nil {
		return false, err
	}
	return parseBool(code, b)
}

func (c *consul) put(ctx context.Context, key string, val []byte) error {
	ok, err := c.kvPut(ctx, key, nil, val)
	if err == nil && !ok {
		err = fmt.Errorf("PUT %s answered false", key)
	}
	return err
}

func (c *consul) acquire(ctx context.Context, key, session string) (bool, error) {
	return c.kvPut(ctx, key, url.Values{"acquire": {session}}, nil)
}

func (c *consul) release(ctx context.Context, key, session string) (bool, error) {
	return c.kvPut(ctx, key, url.Values{"release": {session}}, nil)
}

// kvEntry is what a single-key GET tells the workloads.
type kvEntry struct {
	found   bool
	session string
	value   []byte
	index   uint64 // X-Consul-Index
}

// get reads one key. index > 0 makes it a blocking query with the given wait.
func (c *consul) get(ctx context.Context, key string, consistent bool, index uint64, wait time.Duration) (kvEntry, error) {
	q := url.Values{}
	if consistent {
		q.Set("consistent", "")
	}
	var extra time.Duration
	if index > 0 {
		q.Set("index", strconv.FormatUint(index, 10))
		q.Set("wait", fmt.Sprintf("%dms", wait.Milliseconds()))
		extra = wait + wait/16 + time.Second // the server may add up to wait/16 of jitter
	}
	code, h, b, err := c.do(ctx, http.MethodGet, "/v1/kv/"+key, q, nil, extra)
	if err != nil {
		return kvEntry{}, err
	}
	var e kvEntry
	if s := h.Get("X-Consul-Index"); s != "" {
		e.index, err = strconv.ParseUint(s, 10, 64)
		if err != nil {
			return kvEntry{}, fmt.Errorf("bad X-Consul-Index %q", s)
		}
	}
	switch code {
	case http.StatusNotFound:
		return e, nil
	case http.StatusOK:
	default:
		return kvEntry{}, &statusError{code, string(b)}
	}
	var ents []struct {
		Session string
		Value   []byte
	}
	if err := json.Unmarshal(b, &ents); err != nil {
		return kvEntry{}, fmt.Errorf("GET %s: %w", key, err)
	}
	if len(ents) == 0 {
		return e, nil
	}
	e.found = true
	e.session = ents[0].Session
	e.value = ents[0].Value
	return e, nil
}
