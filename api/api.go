package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultAddress is the agent address used when neither the Config nor the
// environment names one.
const DefaultAddress = "127.0.0.1:8500"

// Environment variables read by DefaultConfig, in order of preference.
const (
	HTTPAddrEnvName       = "HOLDFAST_HTTP_ADDR"
	ConsulHTTPAddrEnvName = "CONSUL_HTTP_ADDR"
)

// Header names the client reads or sends.
const (
	headerIndex       = "X-Consul-Index"
	headerLastContact = "X-Consul-LastContact"
	headerKnownLeader = "X-Consul-KnownLeader"
	headerToken       = "X-Consul-Token"
	// HeaderLockDelay is sent by holdfast (not by Consul) on a refused
	// ?acquire when the key is inside its lock-delay window. Its value is
	// the remaining delay as a Go duration string, such as "14.2s".
	HeaderLockDelay = "X-Holdfast-Lock-Delay"
)

// Config says how a Client reaches the agent. The zero value is usable:
// every empty field takes its default in NewClient.
type Config struct {
	// Address is host:port of the agent's HTTP API. It may carry a scheme
	// prefix ("http://" or "https://"), which then overrides Scheme.
	// Empty means DefaultAddress.
	Address string

	// Scheme is "http" (the default) or "https".
	Scheme string

	// Datacenter is sent as ?dc= on every request unless the request's
	// options name another.
	Datacenter string

	// HTTPClient carries the requests. Nil means a client of its own whose
	// Transport (see there) keeps up to DefaultIdleConns idle connections
	// to the server and spends less CPU per request than net/http's; the
	// standard library's would keep 2, so a client shared by a handful of
	// goroutines would open and close a connection for most requests. It
	// must not have a Timeout shorter than the longest blocking query you
	// intend to make; use contexts instead.
	HTTPClient *http.Client

	// Token is sent as X-Consul-Token unless the request's options carry one.
	Token string

	// WaitTime is the default ?wait= of blocking queries (those with a
	// WaitIndex) that set no WaitTime of their own. Zero leaves it to the
	// server (5 minutes on Consul).
	WaitTime time.Duration
}

// DefaultConfig returns a Config whose Address comes from the environment:
// HOLDFAST_HTTP_ADDR, else CONSUL_HTTP_ADDR, else DefaultAddress.
func DefaultConfig() *Config {
	return ConfigFromEnv(nil)
}

// ConfigFromEnv is DefaultConfig with the environment read through getenv
// (nil means os.Getenv). Command lines that carry their own environment,
// and tests, use it instead of DefaultConfig.
func ConfigFromEnv(getenv func(string) string) *Config {
	if getenv == nil {
		getenv = os.Getenv
	}
	addr := getenv(HTTPAddrEnvName)
	if addr == "" {
		addr = getenv(ConsulHTTPAddrEnvName)
	}
	if addr == "" {
		addr = DefaultAddress
	}
	return &Config{Address: addr, Scheme: "http"}
}

// Client talks to one agent. It is safe for concurrent use by many
// goroutines; it holds no state besides its Config.
type Client struct {
	scheme     string
	host       string
	datacenter string
	token      string
	waitTime   time.Duration
	hc         *http.Client
}

// NewClient checks cfg and returns a Client for it. A nil cfg means
// DefaultConfig(). The Config is copied: later changes to it have no effect.
func NewClient(cfg *Config) (*Client, error) {
	if cfg == nil {
		cfg = DefaultConfig()
	}
	c := &Client{
		scheme:     cfg.Scheme,
		host:       cfg.Address,
		datacenter: cfg.Datacenter,
		token:      cfg.Token,
		waitTime:   cfg.WaitTime,
		hc:         cfg.HTTPClient,
	}
	// The scheme comes off before the trailing slashes: "https://" is a
	// scheme and no host (the default one), not a host named "https:".
	if scheme, rest, ok := strings.Cut(c.host, "://"); ok {
		c.scheme, c.host = scheme, rest
	}
	c.host = strings.TrimRight(c.host, "/")
	if c.scheme == "" {
		c.scheme = "http"
	}
	if c.scheme != "http" && c.scheme != "https" {
		return nil, fmt.Errorf("api: unsupported scheme %q (want http or https)", c.scheme)
	}
	if c.host == "" {
		c.host = DefaultAddress
	}
	if !validHostPort(c.host) {
		return nil, fmt.Errorf("api: address %q is not host:port", cfg.Address)
	}
	if cfg.WaitTime < 0 {
		return nil, errors.New("api: negative WaitTime")
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: NewTransport()}
	}
	return c, nil
}

// validHostPort reports whether h can stand as the host[:port] of a URL
// as it is: no path, query or fragment, no user info, no escapes, no
// spaces or control characters.
func validHostPort(h string) bool {
	for _, r := range h {
		if r <= ' ' || r == 0x7f || strings.ContainsRune("/?#%@\\", r) {
			return false
		}
	}
	return true
}

// DefaultIdleConns is how many idle connections to its server a Client
// made without an HTTPClient keeps for reuse.
const DefaultIdleConns = 64

// QueryOptions tune a read. A nil *QueryOptions means all defaults.
type QueryOptions struct {
	// Datacenter overrides Config.Datacenter.
	Datacenter string

	// AllowStale (?stale) lets any server answer from its own state;
	// QueryMeta.LastContact then says how far behind it may be.
	AllowStale bool

	// RequireConsistent (?consistent) makes the leader confirm its
	// leadership with a quorum before answering. Setting both AllowStale and
	// RequireConsistent sends both; the server refuses that with a 400.
	RequireConsistent bool

	// WaitIndex makes the read blocking (?index=): the server answers once
	// the result's index exceeds WaitIndex or WaitTime passes, whichever is
	// first. A return is no proof of change: compare QueryMeta.LastIndex.
	WaitIndex uint64

	// WaitTime bounds a blocking read (?wait=, sent in milliseconds such as
	// "15000ms"). Zero means Config.WaitTime, and if that is zero too the
	// server's default. It is only sent when non-zero.
	WaitTime time.Duration

	// Token overrides Config.Token.
	Token string
}

// QueryMeta is what a read learns besides its result.
type QueryMeta struct {
	// LastIndex is X-Consul-Index: the index to pass as the next WaitIndex.
	LastIndex uint64

	// LastContact is X-Consul-LastContact: how long since the answering
	// server heard from the leader (0 on the leader itself).
	LastContact time.Duration

	// KnownLeader is X-Consul-KnownLeader.
	KnownLeader bool

	// RequestTime is how long the round trip took, as seen by the client.
	RequestTime time.Duration
}

// WriteOptions tune a write. A nil *WriteOptions means all defaults.
type WriteOptions struct {
	// Datacenter overrides Config.Datacenter.
	Datacenter string
	// Token overrides Config.Token.
	Token string
}

// WriteMeta is what a write learns besides its result.
type WriteMeta struct {
	// RequestTime is how long the round trip took, as seen by the client.
	RequestTime time.Duration

	// LastIndex is X-Consul-Index when the server sends one on a write.
	// Consul never does, so it is usually 0.
	LastIndex uint64

	// LockDelayRemaining is set when a KV acquire was refused because the
	// key is in its lock-delay window and the server said how much of it
	// remains (holdfast's X-Holdfast-Lock-Delay header). Zero means the
	// server did not say: the refusal may be a lost race or a lock-delay
	// from a server that does not send the header (Consul).
	LockDelayRemaining time.Duration
}

// StatusError is a response whose status code is not 2xx. Body is the
// response body with surrounding white space removed; holdfast and Consul
// send plain-text error messages.
type StatusError struct {
	Code int
	Body string
}

// Error reads like the error of Consul's Go client, so that code matching
// on its text keeps working.
func (e *StatusError) Error() string {
	return fmt.Sprintf("Unexpected response code: %d (%s)", e.Code, e.Body)
}

// IsRetryable reports whether err is worth retrying later as it stands: a
// network error, or a 500 from the server (no leader, an election under
// way, a failed apply). Errors from a cancelled or expired context are not.
// It does not retry anything itself.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.Code == http.StatusInternalServerError
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// request is one HTTP call being put together.
type request struct {
	method      string
	path        string
	params      url.Values
	header      http.Header
	body        io.Reader
	contentType string
}

func (c *Client) newRequest(method, path string) *request {
	r := &request{method: method, path: path, params: url.Values{}, header: http.Header{}}
	if c.datacenter != "" {
		r.params.Set("dc", c.datacenter)
	}
	if c.token != "" {
		r.header.Set(headerToken, c.token)
	}
	return r
}

func (c *Client) setQueryOptions(r *request, q *QueryOptions) error {
	var wait time.Duration
	if q != nil && q.WaitIndex != 0 {
		// Config.WaitTime is the default of blocking reads only.
		wait = c.waitTime
	}
	if q != nil {
		if q.Datacenter != "" {
			r.params.Set("dc", q.Datacenter)
		}
		if q.AllowStale {
			r.params.Set("stale", "")
		}
		if q.RequireConsistent {
			r.params.Set("consistent", "")
		}
		if q.WaitIndex != 0 {
			r.params.Set("index", strconv.FormatUint(q.WaitIndex, 10))
		}
		if q.WaitTime < 0 {
			// Dropped, it would have the server wait its longest.
			return fmt.Errorf("api: negative QueryOptions.WaitTime %v", q.WaitTime)
		}
		if q.WaitTime != 0 {
			wait = q.WaitTime
		}
		if q.Token != "" {
			r.header.Set(headerToken, q.Token)
		}
	}
	if wait > 0 {
		r.params.Set("wait", durationToMillis(wait))
	}
	return nil
}

func setWriteOptions(r *request, w *WriteOptions) {
	if w == nil {
		return
	}
	if w.Datacenter != "" {
		r.params.Set("dc", w.Datacenter)
	}
	if w.Token != "" {
		r.header.Set(headerToken, w.Token)
	}
}

// durationToMillis renders d as whole milliseconds ("15000ms"), the form
// Consul's client uses for ?wait= and LockDelay. A positive d shorter than
// a millisecond becomes "1ms" rather than "0ms".
func durationToMillis(d time.Duration) string {
	ms := d / time.Millisecond
	if d > 0 && ms == 0 {
		ms = 1
	}
	return strconv.FormatInt(int64(ms), 10) + "ms"
}

func (c *Client) url(r *request) string {
	u := url.URL{Scheme: c.scheme, Host: c.host, Path: r.path, RawQuery: r.params.Encode()}
	return u.String()
}

// do sends r and returns the response with its body unread when the status
// is 2xx. For any other status it reads the body, closes it, and returns
// the response (for its headers) together with a *StatusError.
func (c *Client) do(ctx context.Context, r *request) (*http.Response, time.Duration, error) {
	if ctx == nil {
		return nil, 0, errors.New("api: nil Context")
	}
	req, err := http.NewRequestWithContext(ctx, r.method, c.url(r), r.body)
	if err != nil {
		return nil, 0, err
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	start := time.Now()
	resp, err := c.hc.Do(req)
	rtt := time.Since(start)
	if err != nil {
		return nil, rtt, err
	}
	if resp.StatusCode/100 != 2 {
		body, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if rerr != nil {
			return resp, rtt, rerr
		}
		return resp, rtt, &StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(string(body))}
	}
	return resp, rtt, nil
}

// query runs a GET of path and decodes a 2xx JSON body into out (unless out
// is nil). The QueryMeta is returned whenever a response arrived, also
// alongside a *StatusError, so that callers treating 404 as "absent" still
// get the index to block on.
func (c *Client) query(ctx context.Context, path string, params url.Values, q *QueryOptions, out any) (*QueryMeta, error) {
	r := c.newRequest(http.MethodGet, path)
	for k, v := range params {
		r.params[k] = v
	}
	if err := c.setQueryOptions(r, q); err != nil {
		return nil, err
	}
	resp, rtt, err := c.do(ctx, r)
	if resp == nil {
		return nil, err
	}
	qm := &QueryMeta{RequestTime: rtt}
	if perr := parseQueryMeta(resp.Header, qm); perr != nil {
		if err == nil {
			closeBody(resp)
		}
		return nil, perr
	}
	if err != nil {
		return qm, err
	}
	defer closeBody(resp)
	if out != nil {
		if err := decodeJSON(resp.Body, out); err != nil {
			return nil, err
		}
	}
	return qm, nil
}

// write sends a PUT or DELETE and decodes a 2xx JSON body into out (unless
// out is nil). Like query, it returns the WriteMeta alongside a
// *StatusError.
func (c *Client) write(ctx context.Context, r *request, w *WriteOptions, out any) (*WriteMeta, error) {
	setWriteOptions(r, w)
	resp, rtt, err := c.do(ctx, r)
	if resp == nil {
		return nil, err
	}
	wm := &WriteMeta{RequestTime: rtt}
	parseWriteMeta(resp.Header, wm)
	if err != nil {
		return wm, err
	}
	defer closeBody(resp)
	if out != nil {
		if err := decodeJSON(resp.Body, out); err != nil {
			return nil, err
		}
	}
	return wm, nil
}

// parseQueryMeta reads the index, last-contact and known-leader headers in
// that order and stops at the first malformed one. A missing header leaves
// its field zero (Consul's client, stricter, fails on a missing
// X-Consul-LastContact; holdfast always sends all three).
func parseQueryMeta(h http.Header, qm *QueryMeta) error {
	if v := h.Get(headerIndex); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("Failed to parse %s: %v", headerIndex, err)
		}
		qm.LastIndex = n
	}
	if v := h.Get(headerLastContact); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fmt.Errorf("Failed to parse %s: %v", headerLastContact, err)
		}
		if n > uint64(1<<63-1)/uint64(time.Millisecond) {
			return fmt.Errorf("%s header value is out of range: %d", headerLastContact, n)
		}
		qm.LastContact = time.Duration(n) * time.Millisecond
	}
	qm.KnownLeader = h.Get(headerKnownLeader) == "true"
	return nil
}

// parseWriteMeta reads the optional headers of a write. Both are advisory,
// so a malformed value is ignored rather than failing a write that has
// already happened.
func parseWriteMeta(h http.Header, wm *WriteMeta) {
	if v := h.Get(headerIndex); v != "" {
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			wm.LastIndex = n
		}
	}
	if v := h.Get(HeaderLockDelay); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			wm.LockDelayRemaining = d
		}
	}
}

// closeBody drains a little of what is left so the connection can be
// reused, then closes it.
func closeBody(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
}

// jsonBody encodes v for a request body.
func jsonBody(r *request, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	r.body = bytes.NewReader(b)
	r.contentType = "application/json"
	return nil
}
