package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// seen is one request as the test server received it.
type seen struct {
	Method      string
	Path        string // decoded
	Query       url.Values
	Header      http.Header
	Body        string
	ContentType string
}

// reply is a canned answer.
type reply struct {
	Code   int
	Header map[string]string
	Body   string
}

// stub is an httptest server that records every request and answers each
// with the reply chosen by its answer func (a plain 200 "true" if nil).
type stub struct {
	mu     sync.Mutex
	seen   []seen
	answer func(s seen) reply
	srv    *httptest.Server
}

func newStub(t *testing.T, answer func(s seen) reply) (*stub, *Client) {
	t.Helper()
	st := &stub{answer: answer}
	st.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s := seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Header: r.Header.Clone(),
			Body: string(b), ContentType: r.Header.Get("Content-Type")}
		st.mu.Lock()
		st.seen = append(st.seen, s)
		st.mu.Unlock()
		rp := reply{Code: 200, Body: "true"}
		if st.answer != nil {
			rp = st.answer(s)
		}
		for k, v := range rp.Header {
			w.Header().Set(k, v)
		}
		if rp.Code == 0 {
			rp.Code = 200
		}
		w.WriteHeader(rp.Code)
		io.WriteString(w, rp.Body)
	}))
	t.Cleanup(st.srv.Close)
	c, err := NewClient(&Config{Address: st.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return st, c
}

// last returns the last request seen, failing the test if there was none.
func (st *stub) last(t *testing.T) seen {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.seen) == 0 {
		t.Fatal("no request reached the server")
	}
	return st.seen[len(st.seen)-1]
}

func (st *stub) count() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.seen)
}

// readHeaders is what a holdfast read answers with besides its body.
func readHeaders(index string) map[string]string {
	return map[string]string{
		"X-Consul-Index":       index,
		"X-Consul-KnownLeader": "true",
		"X-Consul-LastContact": "0",
		"Content-Type":         "application/json",
	}
}

// queryString renders q in a stable, readable form: sorted, "k" for
// valueless parameters.
func queryString(q url.Values) string {
	parts := strings.Split(q.Encode(), "&")
	for i, p := range parts {
		parts[i] = strings.TrimSuffix(p, "=")
	}
	if len(parts) == 1 && parts[0] == "" {
		return ""
	}
	return strings.Join(parts, "&")
}

func TestQueryMetaHeaders(t *testing.T) {
	tests := []struct {
		name    string
		headers map[string]string
		want    QueryMeta
		wantErr string
	}{
		{"all", map[string]string{"X-Consul-Index": "42", "X-Consul-KnownLeader": "true", "X-Consul-LastContact": "0"},
			QueryMeta{LastIndex: 42, KnownLeader: true}, ""},
		{"stale follower", map[string]string{"X-Consul-Index": "7", "X-Consul-KnownLeader": "true", "X-Consul-LastContact": "1500"},
			QueryMeta{LastIndex: 7, KnownLeader: true, LastContact: 1500 * time.Millisecond}, ""},
		{"no leader", map[string]string{"X-Consul-Index": "1", "X-Consul-KnownLeader": "false", "X-Consul-LastContact": "20"},
			QueryMeta{LastIndex: 1, LastContact: 20 * time.Millisecond}, ""},
		{"leader not literally true", map[string]string{"X-Consul-Index": "3", "X-Consul-KnownLeader": "True", "X-Consul-LastContact": "0"},
			QueryMeta{LastIndex: 3}, ""},
		{"missing headers", map[string]string{}, QueryMeta{}, ""},
		{"bad index", map[string]string{"X-Consul-Index": "x", "X-Consul-LastContact": "0"},
			QueryMeta{}, "Failed to parse X-Consul-Index"},
		{"negative index", map[string]string{"X-Consul-Index": "-1"}, QueryMeta{}, "Failed to parse X-Consul-Index"},
		{"bad last contact", map[string]string{"X-Consul-Index": "5", "X-Consul-LastContact": "1.5"},
			QueryMeta{}, "Failed to parse X-Consul-LastContact"},
		{"index checked first", map[string]string{"X-Consul-Index": "no", "X-Consul-LastContact": "no"},
			QueryMeta{}, "Failed to parse X-Consul-Index"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, c := newStub(t, func(seen) reply {
				return reply{Header: tt.headers, Body: `[{"Key":"k","Value":"dg=="}]`}
			})
			_, qm, err := c.KV().Get(context.Background(), "k", nil)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			qm.RequestTime = 0
			if *qm != tt.want {
				t.Errorf("meta = %+v, want %+v", *qm, tt.want)
			}
		})
	}
}

func TestQueryOptionsSent(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		q         *QueryOptions
		wantQuery string
		wantToken string
	}{
		{"nil options", Config{}, nil, "", ""},
		{"blocking", Config{}, &QueryOptions{WaitIndex: 5, WaitTime: 15 * time.Second}, "index=5&wait=15000ms", ""},
		{"index without wait", Config{}, &QueryOptions{WaitIndex: 9}, "index=9", ""},
		{"wait from config", Config{WaitTime: 10 * time.Second}, &QueryOptions{WaitIndex: 9}, "index=9&wait=10000ms", ""},
		{"options override config wait", Config{WaitTime: 10 * time.Second}, &QueryOptions{WaitTime: 2 * time.Minute}, "wait=120000ms", ""},
		{"sub-millisecond wait", Config{}, &QueryOptions{WaitIndex: 1, WaitTime: time.Microsecond}, "index=1&wait=1ms", ""},
		{"stale", Config{}, &QueryOptions{AllowStale: true}, "stale", ""},
		{"consistent", Config{}, &QueryOptions{RequireConsistent: true}, "consistent", ""},
		{"both are sent, server refuses", Config{}, &QueryOptions{AllowStale: true, RequireConsistent: true}, "consistent&stale", ""},
		{"dc from config", Config{Datacenter: "dc1"}, nil, "dc=dc1", ""},
		{"dc from options", Config{Datacenter: "dc1"}, &QueryOptions{Datacenter: "dc2"}, "dc=dc2", ""},
		{"token from config", Config{Token: "t1"}, nil, "", "t1"},
		{"token from options", Config{Token: "t1"}, &QueryOptions{Token: "t2"}, "", "t2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, _ := newStub(t, func(seen) reply { return reply{Header: readHeaders("3"), Body: "[]"} })
			cfg := tt.cfg
			cfg.Address = st.srv.URL
			c, err := NewClient(&cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.Session().List(context.Background(), tt.q); err != nil {
				t.Fatal(err)
			}
			got := st.last(t)
			if q := queryString(got.Query); q != tt.wantQuery {
				t.Errorf("query = %q, want %q", q, tt.wantQuery)
			}
			if tok := got.Header.Get("X-Consul-Token"); tok != tt.wantToken {
				t.Errorf("token = %q, want %q", tok, tt.wantToken)
			}
		})
	}
}

func TestStatusError(t *testing.T) {
	tests := []struct {
		code int
		body string
		want string
	}{
		{500, "No cluster leader", "Unexpected response code: 500 (No cluster leader)"},
		{400, "Missing key name\n", "Unexpected response code: 400 (Missing key name)"},
		{405, "method POST not allowed", "Unexpected response code: 405 (method POST not allowed)"},
		{413, "", "Unexpected response code: 413 ()"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.code), func(t *testing.T) {
			_, c := newStub(t, func(seen) reply { return reply{Code: tt.code, Body: tt.body} })
			_, err := c.KV().Put(context.Background(), &KVPair{Key: "k"}, nil)
			var se *StatusError
			if !errors.As(err, &se) {
				t.Fatalf("err = %#v, want *StatusError", err)
			}
			if se.Code != tt.code || err.Error() != tt.want {
				t.Errorf("err = %q (code %d), want %q", err, se.Code, tt.want)
			}
		})
	}
}

func TestIsRetryable(t *testing.T) {
	// A server that is closed gives a real network error.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	c, err := NewClient(&Config{Address: dead.URL})
	if err != nil {
		t.Fatal(err)
	}
	_, netErr := c.KV().Put(context.Background(), &KVPair{Key: "k"}, nil)
	if netErr == nil {
		t.Fatal("expected an error from a closed server")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, cancelErr := c.KV().Put(ctx, &KVPair{Key: "k"}, nil)

	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"network", netErr, true},
		{"500", &StatusError{Code: 500, Body: "No cluster leader"}, true},
		{"wrapped 500", fmt.Errorf("acquire: %w", &StatusError{Code: 500}), true},
		{"503", &StatusError{Code: 503}, false},
		{"404", &StatusError{Code: 404}, false},
		{"400", &StatusError{Code: 400, Body: "Invalid wait time"}, false},
		{"cancelled", cancelErr, false},
		{"plain", errors.New("boom"), false},
		{"session gone", ErrSessionNotFound, false},
	}
	for _, tt := range tests {
		if got := IsRetryable(tt.err); got != tt.want {
			t.Errorf("%s: IsRetryable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "127.0.0.1:8500"},
		{map[string]string{"CONSUL_HTTP_ADDR": "c:1"}, "c:1"},
		{map[string]string{"HOLDFAST_HTTP_ADDR": "h:2", "CONSUL_HTTP_ADDR": "c:1"}, "h:2"},
	}
	for _, tt := range tests {
		cfg := ConfigFromEnv(func(k string) string { return tt.env[k] })
		if cfg.Address != tt.want {
			t.Errorf("env %v: Address = %q, want %q", tt.env, cfg.Address, tt.want)
		}
	}
}

func TestNewClientAddress(t *testing.T) {
	tests := []struct {
		cfg        Config
		wantScheme string
		wantHost   string
		wantErr    bool
	}{
		{Config{}, "http", "127.0.0.1:8500", false},
		{Config{Address: "10.0.0.1:8500"}, "http", "10.0.0.1:8500", false},
		{Config{Address: "https://h:8501"}, "https", "h:8501", false},
		{Config{Address: "http://h:8500/"}, "http", "h:8500", false},
		{Config{Address: "h:8501", Scheme: "https"}, "https", "h:8501", false},
		{Config{Address: "ftp://h:21"}, "", "", true},
		{Config{Address: "h:1/v1"}, "", "", true},
		{Config{Address: "not a host"}, "", "", true},
		{Config{Address: "user@h:1"}, "", "", true},
		{Config{Address: "h%20:1"}, "", "", true},
		{Config{Address: "[::1]:8500"}, "http", "[::1]:8500", false},
		{Config{WaitTime: -time.Second}, "", "", true},
	}
	for _, tt := range tests {
		c, err := NewClient(&tt.cfg)
		if tt.wantErr {
			if err == nil {
				t.Errorf("%+v: want error", tt.cfg)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", tt.cfg, err)
			continue
		}
		if c.scheme != tt.wantScheme || c.host != tt.wantHost {
			t.Errorf("%+v: got %s://%s, want %s://%s", tt.cfg, c.scheme, c.host, tt.wantScheme, tt.wantHost)
		}
	}
}

func TestNilContext(t *testing.T) {
	st, c := newStub(t, nil)
	var ctx context.Context
	if _, err := c.KV().Put(ctx, &KVPair{Key: "k"}, nil); err == nil {
		t.Fatal("want an error for a nil context")
	}
	if st.count() != 0 {
		t.Fatal("request sent despite nil context")
	}
}

func TestContextCancelsBlockingQuery(t *testing.T) {
	release := make(chan struct{})
	_, c := newStub(t, func(s seen) reply {
		<-release
		return reply{Header: readHeaders("2"), Body: "[]"}
	})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err := c.KV().Get(ctx, "k", &QueryOptions{WaitIndex: 1, WaitTime: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
}

// mustJSON marshals v or fails.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDefaultClientReusesConnections: a Client made without an HTTPClient
// keeps its connections when several goroutines share it, instead of the
// standard library's 2 idle connections per host.
func TestDefaultClientReusesConnections(t *testing.T) {
	ts, opened := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Consul-Index", "1")
		io.WriteString(w, "[]")
	})
	c, err := NewClient(&Config{Address: strings.TrimPrefix(ts.URL, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, rounds = 8, 20
	for r := 0; r < rounds; r++ {
		var wg sync.WaitGroup
		for g := 0; g < goroutines; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, _, err := c.KV().List(context.Background(), "k", nil); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	// A connection goes back to the pool just after its caller has its
	// answer, so a round now and then opens one more; the standard
	// library's 2 idle connections would open about 6 per round.
	if n, limit := opened.Load(), int64(2*goroutines); n > limit {
		t.Fatalf("%d connections opened for %d rounds of %d concurrent requests, want at most %d", n, rounds, goroutines, limit)
	}
}
