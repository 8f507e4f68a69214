package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/clock"
	"github.com/holdfast/holdfast/internal/logsample"
)

// Defaults for Options.
const (
	DefaultMaxValueSize = 512 * 1024
	DefaultMaxTxnSize   = 512 * 1024
	DefaultWait         = 5 * time.Minute
	DefaultMaxWait      = 10 * time.Minute
)

// Options configure the handler. The zero value is usable: every zero field
// takes its default.
type Options struct {
	// Clock drives blocking-query timeouts. Default clock.Real().
	Clock clock.Clock
	// MaxValueSize bounds a KV value (PUT body, txn value). Default 512 KiB.
	MaxValueSize int64
	// MaxTxnSize bounds the body of PUT /v1/txn. Default 512 KiB.
	MaxTxnSize int64
	// DefaultWait is a blocking query's wait when the client gives none.
	// Default 5m.
	DefaultWait time.Duration
	// MaxWait caps a blocking query's wait. Default 10m.
	MaxWait time.Duration
	// Jitter returns a random duration in [0, max); it is added to each
	// blocking query's wait (max = wait/16) so that many clients do not
	// wake together. Nil adds nothing.
	Jitter func(max time.Duration) time.Duration
	// Logger receives internal errors (5xx). Nil discards.
	Logger *slog.Logger
	// Agent runs this node's checks and keeps its services, for
	// /v1/agent/check* and /v1/agent/service*. Nil answers those 501.
	Agent AgentBackend
	// Stop, if not nil, is done when the server shuts down: blocking
	// queries then answer at once with what they have, as when their
	// wait runs out, so that they do not hold up the shutdown.
	Stop context.Context
}

func (o Options) withDefaults() Options {
	if o.Clock == nil {
		o.Clock = clock.Real()
	}
	if o.MaxValueSize <= 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.MaxTxnSize <= 0 {
		o.MaxTxnSize = DefaultMaxTxnSize
	}
	if o.DefaultWait <= 0 {
		o.DefaultWait = DefaultWait
	}
	if o.MaxWait <= 0 {
		o.MaxWait = DefaultMaxWait
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return o
}

// handler serves the API over a Backend. It holds no mutable state of its
// own, so it is safe for concurrent use.
type handler struct {
	b      Backend
	opts   Options
	routes []*route

	noLeader logsample.Sampler // refusals for want of a leader
}

// noLeaderEvery is the least time between two log lines about requests
// refused because no leader is known: a client polling every 20 ms through
// a 3 s start made 168 error lines saying the same thing.
const noLeaderEvery = 10 * time.Second

// endpoint serves one method of one route. arg is the part of the decoded
// path after the route's prefix ("" for exact routes).
type endpoint func(w http.ResponseWriter, r *http.Request, arg string) error

type route struct {
	path    string // "/v1/kv"
	slash   string // path + "/"
	prefix  bool   // also serves path + "/" + arg
	methods []string
	allow   []string // the Allow header: "OPTIONS," + methods
	eps     map[string]endpoint
}

// New returns the HTTP API over b. The handler is safe for concurrent use;
// every request's context bounds the backend calls made for it.
func New(b Backend, opts Options) http.Handler {
	h := &handler{b: b, opts: opts.withDefaults()}
	h.noLeader = logsample.Sampler{Every: noLeaderEvery, Clock: h.opts.Clock, Flush: func(n int) {
		h.opts.Logger.Warn("refused requests: no cluster leader yet", "refused", n)
	}}
	h.handle("/v1/kv", true, "GET", h.kvGet, "PUT", h.kvPut, "DELETE", h.kvDelete)
	h.handle("/v1/txn", false, "PUT", h.txn)
	h.handle("/v1/snapshot", false, "GET", h.snapshotSave, "PUT", h.snapshotRestore)
	h.handle("/v1/fence", true, "GET", h.fence)

	h.handle("/v1/session/create", false, "PUT", h.sessionCreate)
	h.handle("/v1/session/destroy", true, "PUT", h.sessionDestroy)
	h.handle("/v1/session/renew", true, "PUT", h.sessionRenew)
	h.handle("/v1/session/info", true, "GET", h.sessionInfo)
	h.handle("/v1/session/node", true, "GET", h.sessionNode)
	h.handle("/v1/session/list", false, "GET", h.sessionList)

	h.handle("/v1/catalog/register", false, "PUT", h.catalogRegister)
	h.handle("/v1/catalog/deregister", false, "PUT", h.catalogDeregister)
	h.handle("/v1/catalog/datacenters", false, "GET", h.catalogDatacenters)
	h.handle("/v1/catalog/nodes", false, "GET", h.catalogNodes)
	h.handle("/v1/catalog/node", true, "GET", h.catalogNode)
	h.handle("/v1/health/node", true, "GET", h.healthNode)
	h.handle("/v1/agent/self", false, "GET", h.agentSelf)
	h.handle("/v1/status/leader", false, "GET", h.statusLeader)
	h.handle("/v1/status/peers", false, "GET", h.statusPeers)

	h.agentRoutes()
	h.handle("/v1/catalog/services", false, "GET", h.catalogServices)
	h.handle("/v1/catalog/service", true, "GET", h.catalogService)
	h.handle("/v1/health/service", true, "GET", h.healthService)
	h.handle("/v1/health/checks", true, "GET", h.healthChecks)
	h.handle("/v1/health/state", true, "GET", h.healthState)

	h.handle("/v1/query", false, "GET", h.queryList, "POST", h.queryCreate)
	h.handle("/v1/query", true, "GET", h.queryGet, "PUT", h.queryUpdate, "DELETE", h.queryDelete)
	return h
}

// handle registers a route; pairs alternates method names and endpoints.
func (h *handler) handle(path string, prefix bool, pairs ...interface{}) {
	rt := &route{path: path, slash: path + "/", prefix: prefix, eps: map[string]endpoint{}}
	for i := 0; i < len(pairs); i += 2 {
		m := pairs[i].(string)
		rt.methods = append(rt.methods, m)
		rt.eps[m] = pairs[i+1].(func(http.ResponseWriter, *http.Request, string) error)
	}
	rt.allow = headerValue("OPTIONS," + strings.Join(rt.methods, ","))
	h.routes = append(h.routes, rt)
}

// match finds the route for a decoded path. An exact route wins over a
// prefix route of the same path; "/v1/kv" and "/v1/kv/" both mean the
// empty key.
func (h *handler) match(p string) (*route, string) {
	var best *route
	var arg string
	for _, rt := range h.routes {
		switch {
		case !rt.prefix && p == rt.path:
			return rt, ""
		case rt.prefix && best == nil && p == rt.path && !h.hasExact(p):
			best, arg = rt, ""
		case rt.prefix && strings.HasPrefix(p, rt.slash):
			if best == nil || len(rt.path) > len(best.path) {
				best, arg = rt, p[len(rt.path)+1:]
			}
		}
	}
	return best, arg
}

func (h *handler) hasExact(p string) bool {
	for _, rt := range h.routes {
		if !rt.prefix && rt.path == p {
			return true
		}
	}
	return false
}

// ServeHTTP routes by hand rather than through http.ServeMux: the mux
// cleans paths (and redirects "a//b" to "a/b"), which would change KV keys.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rt, arg := h.match(r.URL.Path)
	if rt == nil {
		h.fail(w, r, notFoundf("Invalid URL path: %q is not a holdfast API endpoint", r.URL.Path))
		return
	}
	if r.Method == http.MethodOptions {
		w.Header()["Allow"] = rt.allow
		w.WriteHeader(http.StatusOK)
		return
	}
	ep := rt.eps[r.Method]
	if ep == nil {
		w.Header()["Allow"] = rt.allow
		h.fail(w, r, &Error{Kind: KindMethodNotAllowed, Msg: "method " + r.Method + " not allowed"})
		return
	}
	if err := h.checkDatacenter(r); err != nil {
		h.fail(w, r, err)
		return
	}
	if err := ep(w, r, arg); err != nil {
		h.fail(w, r, err)
	}
}

// checkDatacenter refuses ?dc naming another datacenter: holdfast serves
// one and does not forward.
func (h *handler) checkDatacenter(r *http.Request) error {
	if raw := r.URL.RawQuery; !strings.Contains(raw, "dc") && !strings.Contains(raw, "%") {
		// No parameter can be named dc (keys are unescaped, hence "%"):
		// skip parsing the query, which the endpoint parses again anyway.
		return nil
	}
	_, err := h.ownDatacenter(query(r).Get("dc"))
	return err
}

// ownDatacenter checks a datacenter a request names (?dc, or a body's
// Datacenter). None, or this server's in any case, means this server's,
// which it returns; any other is refused: holdfast serves one datacenter
// and does not forward, and applying the request here would change the
// wrong catalog.
func (h *handler) ownDatacenter(dc string) (string, error) {
	own := h.b.Datacenter()
	if dc == "" || strings.EqualFold(dc, own) {
		return own, nil
	}
	return "", invalidf("Unknown datacenter %q: this server only serves %q", dc, own)
}

// errCancelled answers a request whose context ended while it waited: the
// client went away (then nobody reads it) or the server is shutting down
// (then a 500 makes Consul's clients retry elsewhere).
var errCancelled = &Error{Kind: KindUnavailable, Msg: "Request cancelled: the client went away or the server is shutting down"}

// fail writes err as a plain-text sentence with the status of its Kind,
// and logs server-side failures.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		err = errCancelled
	}
	kind := KindOf(err)
	status := statusOf[kind]
	switch {
	case status < 500 || kind == KindNotImplemented || err == errCancelled:
	case messageOf(err) == errNoLeader.Msg:
		if n := h.noLeader.Note(); n > 0 {
			h.opts.Logger.Warn("refusing requests: no cluster leader yet (a start replaying its log, an election, a server not yet added to a cluster, or a cluster that lost its majority)",
				"refused", n, "latest", r.Method+" "+r.URL.Path)
		}
	default:
		h.opts.Logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	hd := w.Header()
	hd["Content-Type"] = hvTextPlainUTF8
	hd["X-Content-Type-Options"] = hvNosniff
	w.WriteHeader(status)
	io.WriteString(w, messageOf(err))
}

// wantPretty reports whether ?pretty was given.
func wantPretty(r *http.Request) bool {
	if raw := r.URL.RawQuery; !strings.Contains(raw, "pretty") && !strings.Contains(raw, "%") {
		// No parameter can be named pretty (keys are unescaped, hence
		// "%"): every read answer asks, and parsing the query again for it
		// cost a blocking query's wake-up more than encoding its answer.
		return false
	}
	_, ok := query(r)["pretty"]
	return ok
}

// query is r.URL.Query() without its cost for the common request that has
// no query string: nil, which reads as the empty url.Values. Callers must
// not write to the result.
func query(r *http.Request) url.Values {
	if r.URL.RawQuery == "" {
		return nil
	}
	return r.URL.Query()
}

// writeJSON writes v as JSON with status 200: compact, or indented by four
// spaces with a trailing newline under ?pretty (as Consul does).
func writeJSON(w http.ResponseWriter, r *http.Request, v interface{}) error {
	return writeJSONStatus(w, r, http.StatusOK, v)
}

// writeJSONStatus is writeJSON with another status (a transaction's 409
// carries JSON too).
func writeJSONStatus(w http.ResponseWriter, r *http.Request, status int, v interface{}) error {
	var buf []byte
	var err error
	if b, ok := v.(bool); ok {
		// What json.Marshal and json.MarshalIndent make of a bool, without
		// their machinery: every KV write answers one. The slices are
		// shared: ResponseWriter.Write does not keep or change them.
		pretty := 0
		if wantPretty(r) {
			pretty = 1
		}
		if b {
			buf = jsonTrue[pretty]
		} else {
			buf = jsonFalse[pretty]
		}
	} else if wantPretty(r) {
		buf, err = json.MarshalIndent(v, "", "    ")
		buf = append(buf, '\n')
	} else {
		buf, err = json.Marshal(v)
	}
	if err != nil {
		return err
	}
	return sendJSONStatus(w, status, buf)
}

// sendJSON answers 200 with buf, a JSON body. The handlers that encode
// their answer themselves end here too.
func sendJSON(w http.ResponseWriter, buf []byte) error {
	return sendJSONStatus(w, http.StatusOK, buf)
}

func sendJSONStatus(w http.ResponseWriter, status int, buf []byte) error {
	w.Header()["Content-Type"] = hvJSON
	w.WriteHeader(status)
	_, _ = w.Write(buf)
	return nil
}

// headerValue makes a header value to assign straight into an http.Header
// (hd["Canonical-Key"] = v, the key as http.CanonicalHeaderKey has it) instead of hd.Set, which allocates a slice per
// call. Such values are shared by every response: cap == len, so an Add to
// the same key copies instead of writing into the shared array, and nothing
// in net/http writes into a value slice.
func headerValue(v string) []string { return []string{v}[:1:1] }

// Header values every response shares (see headerValue).
var (
	hvJSON           = headerValue("application/json")
	hvTextPlain      = headerValue("text/plain")
	hvTextPlainUTF8  = headerValue("text/plain; charset=utf-8")
	hvNosniff        = headerValue("nosniff")
	hvSandbox        = headerValue("sandbox")
	hvTrue           = headerValue("true")
	hvFalse          = headerValue("false")
	hvZero           = headerValue("0")
	hvModeLeader     = headerValue(modeLeader)
	hvModeConsistent = headerValue(modeConsistent)
	hvModeStale      = headerValue(modeStale)
)

// The answers of writes, compact and under ?pretty (see writeJSON).
var (
	jsonTrue  = [2][]byte{[]byte("true"), []byte("true\n")}
	jsonFalse = [2][]byte{[]byte("false"), []byte("false\n")}
)

// decodeStrict decodes one JSON value from body into v and refuses
// anything after it other than white space.
func decodeStrict(body []byte, v interface{}) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errTrailing
	}
	if _, err := dec.Token(); err != io.EOF {
		return errTrailing
	}
	return nil
}

var errTrailing = &Error{Kind: KindInvalid, Msg: "unexpected data after the JSON value"}

// readBody reads the whole body, refusing more than max bytes with 413.
// doc is the page of the setting the limit stands for, which the refusal
// names as Consul's does (maxSizeDoc for KV values, txnSizeDoc for
// transactions), or "" for a body no such setting bounds.
func readBody(r *http.Request, max int64, doc string) ([]byte, error) {
	if r.ContentLength > max {
		return nil, tooLarge(r.ContentLength, max, doc)
	}
	b, err := readAllMax(r.Body, r.ContentLength, max+1)
	if err != nil {
		return nil, invalidf("Failed to read request body: %v", err)
	}
	if int64(len(b)) > max {
		return nil, &Error{Kind: KindTooLarge, Msg: "Request body too large, max size: " + itoa(max) + " bytes." + see(doc)}
	}
	return b, nil
}

// see is " See doc." or "".
func see(doc string) string {
	if doc == "" {
		return ""
	}
	return " See " + doc + "."
}

// readAll is io.ReadAll, but starts with room for a body of the declared
// length n (and the read that finds its end) instead of growing from 512
// bytes. n is -1 when the length is unknown. The caller has bounded n.
func readAll(r io.Reader, n int64) ([]byte, error) {
	return readAllMax(r, n, -1)
}

// readAllMax is readAll that reads no more than limit bytes (limit < 0:
// no limit), as readAll(io.LimitReader(r, limit), n) would, without
// allocating the LimitedReader.
func readAllMax(r io.Reader, n, limit int64) ([]byte, error) {
	size := 512
	if n >= 0 {
		size = int(n) + 1
	}
	if limit >= 0 && int64(size) > limit {
		size = int(limit)
	}
	b := make([]byte, 0, size)
	for {
		if limit >= 0 && int64(len(b)) >= limit {
			return b, nil
		}
		p := b[len(b):cap(b)]
		if limit >= 0 && int64(len(p)) > limit-int64(len(b)) {
			p = p[:limit-int64(len(b))]
		}
		m, err := r.Read(p)
		b = b[:len(b)+m]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}

// The settings Consul's 413 answers point to.
const (
	maxSizeDoc = "https://developer.hashicorp.com/docs/agent/config/config-files#kv_max_value_size"
	txnSizeDoc = "https://developer.hashicorp.com/docs/agent/config/config-files#txn_max_req_len"
)

func tooLarge(n, max int64, doc string) error {
	return &Error{Kind: KindTooLarge, Msg: "Request body(" + itoa(n) + " bytes) too large, max size: " +
		itoa(max) + " bytes." + see(doc)}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
