package transcript

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/holdfast/holdfast/internal/servertest"
)

// requestTimeout bounds every HTTP request of a transcript in real time.
// Only "wait session-gone" blocks on the server; everything else answers
// at once.
const requestTimeout = 10 * time.Second

// runner executes the commands of one transcript against one server.
type runner struct {
	srv   *servertest.Server
	hc    *http.Client
	names map[string]string // "$a" -> session ID
	ids   map[string]string // session ID -> "$a"
}

func newRunner(srv *servertest.Server) *runner {
	return &runner{
		srv:   srv,
		hc:    &http.Client{Timeout: requestTimeout + 5*time.Second},
		names: map[string]string{},
		ids:   map[string]string{},
	}
}

// scriptError is a mistake in the script itself (unknown command, missing
// argument, unknown $name); it stops the transcript. Everything the server
// answers, errors included, is output.
type scriptError struct{ msg string }

func (e *scriptError) Error() string { return e.msg }

func errorf(format string, a ...interface{}) error {
	return &scriptError{fmt.Sprintf(format, a...)}
}

// run executes c and returns its output lines, with session IDs written as
// their $names.
func (r *runner) run(c *command) ([]string, error) {
	fn, ok := commandTable[c.name]
	if !ok {
		return nil, errorf("unknown command %q", c.name)
	}
	if c.bind != "" && c.name != "session create" {
		return nil, errorf(`only "session create" binds a $name`)
	}
	if len(c.sub) > 0 && c.name != "txn" {
		return nil, errorf("only txn takes indented lines")
	}
	lines, err := fn(r, c)
	if err != nil {
		return nil, err
	}
	if len(lines) == 0 {
		lines = []string{"(no output)"}
	}
	for i, l := range lines {
		l = r.scrub(l)
		if strings.TrimSpace(l) == "" {
			l = "(blank)"
		}
		lines[i] = l
	}
	return lines, nil
}

var commandTable map[string]func(*runner, *command) ([]string, error)

func init() {
	commandTable = map[string]func(*runner, *command) ([]string, error){
		"session create":     (*runner).sessionCreate,
		"session info":       (*runner).sessionInfo,
		"session list":       (*runner).sessionList,
		"session renew":      (*runner).sessionRenew,
		"session destroy":    (*runner).sessionDestroy,
		"kv put":             (*runner).kvPut,
		"kv acquire":         (*runner).kvAcquire,
		"kv release":         (*runner).kvRelease,
		"kv get":             (*runner).kvGet,
		"kv list":            (*runner).kvList,
		"kv delete":          (*runner).kvDelete,
		"kv delete-tree":     (*runner).kvDeleteTree,
		"fence":              (*runner).fence,
		"txn":                (*runner).txn,
		"catalog register":   (*runner).catalogRegister,
		"catalog deregister": (*runner).catalogDeregister,
		"advance":            (*runner).advance,
		"wait session-gone":  (*runner).waitSessionGone,
	}
}

var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// scrub writes known session IDs as their $names and any other ID as $?,
// so that no random ID reaches a golden file.
func (r *runner) scrub(l string) string {
	return uuidRE.ReplaceAllStringFunc(l, func(id string) string {
		if n, ok := r.ids[id]; ok {
			return n
		}
		return "$?"
	})
}

// ---- arguments ----

// checkArgs refuses positional arguments beyond max and options not in
// allowed.
func checkArgs(c *command, min, max int, allowed ...string) error {
	if len(c.pos) < min || len(c.pos) > max {
		if min == max {
			return errorf("%s takes %d positional argument(s), got %d", c.name, min, len(c.pos))
		}
		return errorf("%s takes %d to %d positional arguments, got %d", c.name, min, max, len(c.pos))
	}
	for k := range c.opts {
		found := false
		for _, a := range allowed {
			found = found || a == k
		}
		if !found {
			return errorf("%s has no option %q", c.name, k)
		}
	}
	return nil
}

// session resolves a $name to its session ID.
func (r *runner) session(ref string) (string, error) {
	if !strings.HasPrefix(ref, "$") {
		return "", errorf("%q is not a $name", ref)
	}
	id, ok := r.names[ref]
	if !ok {
		return "", errorf("unknown session %s", ref)
	}
	return id, nil
}

// posOr returns c.pos[i], or the option name, or "".
func posOr(c *command, i int, name string) string {
	if i < len(c.pos) {
		return c.pos[i]
	}
	return c.opts[name]
}

func uintOpt(c *command, name string) (string, error) {
	v, ok := c.opts[name]
	if !ok {
		return "", nil
	}
	if _, err := strconv.ParseUint(v, 10, 64); err != nil {
		return "", errorf("%s=%q is not an unsigned integer", name, v)
	}
	return v, nil
}

// ---- HTTP ----

type reply struct {
	status int
	header http.Header
	body   []byte
}

// errLine is how a refused request prints.
func (rp *reply) errLine() string {
	return fmt.Sprintf("error %d: %s", rp.status, strings.TrimSpace(string(rp.body)))
}

func (rp *reply) index() string { return rp.header.Get("X-Consul-Index") }

// call makes one request. A transport failure is a script error: the
// server is in-process and must answer.
func (r *runner) call(ctx context.Context, method, path string, q url.Values, body []byte) (*reply, error) {
	u := r.srv.URL + (&url.URL{Path: path}).EscapedPath()
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, errorf("building request: %v", err)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

func (r *runner) do(method, path string, q url.Values, body []byte) (*reply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	rp, err := r.call(ctx, method, path, q, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v", method, path, err)
	}
	return rp, nil
}

// plain prints the body of a write that answers true or false.
func plain(rp *reply) []string {
	if rp.status != http.StatusOK {
		return []string{rp.errLine()}
	}
	return []string{strings.TrimSpace(string(rp.body))}
}

// ---- formatting ----

type dirEntry struct {
	LockIndex   uint64
	Key         string
	Flags       uint64
	Value       []byte
	Session     string
	CreateIndex uint64
	ModifyIndex uint64
}

func fmtEntry(e *dirEntry) string {
	sess := e.Session
	if sess == "" {
		sess = "-"
	}
	s := fmt.Sprintf("%s: value=%q session=%s lock-index=%d create=%d modify=%d",
		e.Key, e.Value, sess, e.LockIndex, e.CreateIndex, e.ModifyIndex)
	if e.Flags != 0 {
		s += fmt.Sprintf(" flags=%d", e.Flags)
	}
	return s
}

type sessionEntry struct {
	ID            string
	Name          string
	Node          string
	LockDelay     time.Duration
	Behavior      string
	TTL           string
	NodeChecks    []string
	ServiceChecks []struct{ ID string }
	CreateIndex   uint64
	ModifyIndex   uint64
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fmtSession(s *sessionEntry) string {
	checks := append([]string(nil), s.NodeChecks...)
	for _, c := range s.ServiceChecks {
		checks = append(checks, c.ID)
	}
	out := fmt.Sprintf("%s: name=%s node=%s behavior=%s ttl=%s lock-delay=%s checks=%s create=%d",
		s.ID, dash(s.Name), dash(s.Node), dash(s.Behavior), dash(s.TTL), s.LockDelay,
		dash(strings.Join(checks, ",")), s.CreateIndex)
	if s.ModifyIndex != s.CreateIndex {
		out += fmt.Sprintf(" modify=%d", s.ModifyIndex)
	}
	return out
}

func decode(rp *reply, v interface{}) error {
	if err := json.Unmarshal(rp.body, v); err != nil {
		return fmt.Errorf("decoding %q: %v", rp.body, err)
	}
	return nil
}

// ---- sessions ----

func (r *runner) sessionCreate(c *command) ([]string, error) {
	if err := checkArgs(c, 0, 0, "name", "node", "ttl", "lock-delay", "behavior", "checks"); err != nil {
		return nil, err
	}
	if c.bind != "" {
		if _, dup := r.names[c.bind]; dup {
			return nil, errorf("%s is already bound", c.bind)
		}
	}
	body := map[string]interface{}{}
	for opt, field := range map[string]string{"name": "Name", "node": "Node", "ttl": "TTL", "lock-delay": "LockDelay", "behavior": "Behavior"} {
		if v, ok := c.opts[opt]; ok {
			body[field] = v
		}
	}
	if v, ok := c.opts["checks"]; ok {
		checks := []string{}
		if v != "none" {
			checks = strings.Split(v, ",")
		}
		body["NodeChecks"] = checks
	}
	var raw []byte
	if len(body) > 0 {
		raw, _ = json.Marshal(body)
	}
	rp, err := r.do("PUT", "/v1/session/create", nil, raw)
	if err != nil {
		return nil, err
	}
	if rp.status != http.StatusOK {
		return []string{rp.errLine()}, nil
	}
	var created struct{ ID string }
	if err := decode(rp, &created); err != nil {
		return nil, err
	}
	if c.bind != "" {
		r.names[c.bind] = created.ID
		r.ids[created.ID] = c.bind
	}
	return r.showSession(created.ID)
}

// showSession prints one session, or says it is gone.
func (r *runner) showSession(id string) ([]string, error) {
	rp, err := r.do("GET", "/v1/session/info/"+id, nil, nil)
	if err != nil {
		return nil, err
	}
	if rp.status != http.StatusOK {
		return []string{rp.errLine()}, nil
	}
	var list []*sessionEntry
	if err := decode(rp, &list); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return []string{id + ": no such session (index " + rp.index() + ")"}, nil
	}
	return []string{fmtSession(list[0])}, nil
}

func (r *runner) sessionInfo(c *command) ([]string, error) {
	id, err := r.sessionArg(c, 1, 1, 0)
	if err != nil {
		return nil, err
	}
	return r.showSession(id)
}

func (r *runner) sessionList(c *command) ([]string, error) {
	if err := checkArgs(c, 0, 0); err != nil {
		return nil, err
	}
	rp, err := r.do("GET", "/v1/session/list", nil, nil)
	if err != nil {
		return nil, err
	}
	if rp.status != http.StatusOK {
		return []string{rp.errLine()}, nil
	}
	var list []*sessionEntry
	if err := decode(rp, &list); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return []string{"(no sessions, index " + rp.index() + ")"}, nil
	}
	// The server lists by ID, which is random; sort by name for a
	// stable transcript.
	sort.Slice(list, func(i, j int) bool { return r.scrub(list[i].ID) < r.scrub(list[j].ID) })
	var out []string
	for _, s := range list {
		out = append(out, fmtSession(s))
	}
	return out, nil
}

func (r *runner) sessionRenew(c *command) ([]string, error) {
	id, err := r.sessionArg(c, 1, 1, 0)
	if err != nil {
		return nil, err
	}
	rp, err := r.do("PUT", "/v1/session/renew/"+id, nil, nil)
	if err != nil {
		return nil, err
	}
	if rp.status != http.StatusOK {
		return []string{rp.errLine()}, nil
	}
	var list []*sessionEntry
	if err := decode(rp, &list); err != nil {
		return nil, err
	}
	if len(list) != 1 {
		return []string{fmt.Sprintf("renew answered %d sessions", len(list))}, nil
	}
	return []string{"renewed " + fmtSession(list[0])}, nil
}

func (r *runner) sessionDestroy(c *command) ([]string, error) {
	id, err := r.sessionArg(c, 1, 1, 0)
	if err != nil {
		return nil, err
	}
	return r.doPlain("PUT", "/v1/session/destroy/"+id, nil, nil)
}

// waitSessionGone blocks, with blocking queries on the session, until it
// no longer exists. It gives up after requestTimeout of real time and says
// so in its output, which then fails the transcript.
func (r *runner) waitSessionGone(c *command) ([]string, error) {
	id, err := r.sessionArg(c, 1, 1, 0)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	q := url.Values{}
	for attempt := 0; attempt < 100; attempt++ {
		rp, err := r.call(ctx, "GET", "/v1/session/info/"+id, q, nil)
		if ctx.Err() != nil {
			return []string{fmt.Sprintf("%s still exists after %v", c.pos[0], requestTimeout)}, nil
		}
		if err != nil {
			return nil, err
		}
		if rp.status != http.StatusOK {
			return []string{rp.errLine()}, nil
		}
		var list []*sessionEntry
		if err := decode(rp, &list); err != nil {
			return nil, err
		}
		if len(list) == 0 {
			return []string{fmt.Sprintf("%s gone (index %s)", c.pos[0], rp.index())}, nil
		}
		q.Set("index", rp.index())
	}
	return []string{c.pos[0] + " still exists after 100 blocking queries"}, nil
}

// ---- KV ----

func kvPath(key string) string { return "/v1/kv/" + key }

func (r *runner) kvPut(c *command) ([]string, error) {
	if err := checkArgs(c, 1, 2, "value", "flags", "cas", "lock-index"); err != nil {
		return nil, err
	}
	q := url.Values{}
	// lock-index is accepted only to show that the server refuses it
	// without ?release.
	for _, name := range []string{"flags", "cas", "lock-index"} {
		v, err := uintOpt(c, name)
		if err != nil {
			return nil, err
		}
		if v != "" {
			q.Set(name, v)
		}
	}
	return r.doPlain("PUT", kvPath(c.pos[0]), q, []byte(posOr(c, 1, "value")))
}

func (r *runner) kvAcquire(c *command) ([]string, error) {
	if err := checkArgs(c, 2, 3, "value", "flags"); err != nil {
		return nil, err
	}
	id, err := r.session(c.pos[1])
	if err != nil {
		return nil, err
	}
	q := url.Values{"acquire": {id}}
	if v, err := uintOpt(c, "flags"); err != nil {
		return nil, err
	} else if v != "" {
		q.Set("flags", v)
	}
	rp, err := r.do("PUT", kvPath(c.pos[0]), q, []byte(posOr(c, 2, "value")))
	if err != nil {
		return nil, err
	}
	out := plain(rp)
	if d := rp.header.Get("X-Holdfast-Lock-Delay"); d != "" {
		out[0] += " (lock-delay: " + d + " left)"
	}
	return out, nil
}

func (r *runner) kvRelease(c *command) ([]string, error) {
	if err := checkArgs(c, 2, 3, "value", "flags", "lock-index"); err != nil {
		return nil, err
	}
	id, err := r.session(c.pos[1])
	if err != nil {
		return nil, err
	}
	q := url.Values{"release": {id}}
	for _, name := range []string{"flags", "lock-index"} {
		v, err := uintOpt(c, name)
		if err != nil {
			return nil, err
		}
		if v != "" {
			q.Set(name, v)
		}
	}
	return r.doPlain("PUT", kvPath(c.pos[0]), q, []byte(posOr(c, 2, "value")))
}

func (r *runner) kvGet(c *command) ([]string, error) {
	if err := checkArgs(c, 1, 1); err != nil {
		return nil, err
	}
	rp, err := r.do("GET", kvPath(c.pos[0]), nil, nil)
	if err != nil {
		return nil, err
	}
	switch rp.status {
	case http.StatusNotFound:
		return []string{fmt.Sprintf("%s: absent (index %s)", c.pos[0], rp.index())}, nil
	case http.StatusOK:
	default:
		return []string{rp.errLine()}, nil
	}
	var ents []*dirEntry
	if err := decode(rp, &ents); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, fmtEntry(e))
	}
	return out, nil
}

func (r *runner) kvList(c *command) ([]string, error) {
	if err := checkArgs(c, 0, 1); err != nil {
		return nil, err
	}
	prefix := posOr(c, 0, "")
	rp, err := r.do("GET", kvPath(prefix), url.Values{"recurse": {""}}, nil)
	if err != nil {
		return nil, err
	}
	switch rp.status {
	case http.StatusNotFound:
		return []string{fmt.Sprintf("no keys under %q (index %s)", prefix, rp.index())}, nil
	case http.StatusOK:
	default:
		return []string{rp.errLine()}, nil
	}
	var ents []*dirEntry
	if err := decode(rp, &ents); err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, fmtEntry(e))
	}
	return out, nil
}

func (r *runner) kvDelete(c *command) ([]string, error) {
	if err := checkArgs(c, 1, 1, "cas"); err != nil {
		return nil, err
	}
	q := url.Values{}
	if v, err := uintOpt(c, "cas"); err != nil {
		return nil, err
	} else if v != "" {
		q.Set("cas", v)
	}
	return r.doPlain("DELETE", kvPath(c.pos[0]), q, nil)
}

func (r *runner) kvDeleteTree(c *command) ([]string, error) {
	if err := checkArgs(c, 1, 1); err != nil {
		return nil, err
	}
	return r.doPlain("DELETE", kvPath(c.pos[0]), url.Values{"recurse": {""}}, nil)
}

func (r *runner) fence(c *command) ([]string, error) {
	id, err := r.sessionArg(c, 3, 3, 1)
	if err != nil {
		return nil, err
	}
	rp, err := r.do("GET", "/v1/fence/"+c.pos[0], url.Values{"session": {id}, "lock-index": {c.pos[2]}}, nil)
	if err != nil {
		return nil, err
	}
	if rp.status != http.StatusOK {
		return []string{rp.errLine()}, nil
	}
	var f struct {
		Valid     bool
		Session   string
		LockIndex uint64
	}
	if err := decode(rp, &f); err != nil {
		return nil, err
	}
	return []string{fmt.Sprintf("valid=%t holder=%s lock-index=%d", f.Valid, dash(f.Session), f.LockIndex)}, nil
}

// ---- transactions ----

type txnKV struct {
	Verb      string
	Key       string
	Value     []byte `json:",omitempty"`
	Flags     uint64 `json:",omitempty"`
	Index     uint64 `json:",omitempty"`
	Session   string `json:",omitempty"`
	LockIndex uint64 `json:",omitempty"`
}

// sessionVerbs take a session as their second positional argument.
var sessionVerbs = map[string]bool{"lock": true, "unlock": true, "check-session": true, "check-lock": true}

func (r *runner) txnOp(c *command) (*txnKV, error) {
	op := &txnKV{Verb: c.name}
	if len(c.pos) == 0 {
		return nil, errorf("line %d: %s needs a key", c.line, c.name)
	}
	op.Key = c.pos[0]
	rest := c.pos[1:]
	if sessionVerbs[c.name] {
		if len(rest) == 0 {
			return nil, errorf("line %d: %s needs a session", c.line, c.name)
		}
		id, err := r.session(rest[0])
		if err != nil {
			return nil, err
		}
		op.Session, rest = id, rest[1:]
	}
	switch len(rest) {
	case 0:
	case 1:
		op.Value = []byte(rest[0])
	default:
		return nil, errorf("line %d: too many arguments", c.line)
	}
	for k, v := range c.opts {
		n, err := strconv.ParseUint(v, 10, 64)
		if k != "value" && err != nil {
			return nil, errorf("line %d: %s=%q is not an unsigned integer", c.line, k, v)
		}
		switch k {
		case "value":
			op.Value = []byte(v)
		case "flags":
			op.Flags = n
		case "index":
			op.Index = n
		case "lock-index":
			op.LockIndex = n
		default:
			return nil, errorf("line %d: %s has no option %q", c.line, c.name, k)
		}
	}
	return op, nil
}

func (r *runner) txn(c *command) ([]string, error) {
	if err := checkArgs(c, 0, 0); err != nil {
		return nil, err
	}
	if len(c.sub) == 0 {
		return nil, errorf("txn needs indented operations under it")
	}
	var ops []map[string]*txnKV
	for _, s := range c.sub {
		op, err := r.txnOp(s)
		if err != nil {
			return nil, err
		}
		ops = append(ops, map[string]*txnKV{"KV": op})
	}
	body, _ := json.Marshal(ops)
	rp, err := r.do("PUT", "/v1/txn", nil, body)
	if err != nil {
		return nil, err
	}
	var res struct {
		Results []struct{ KV *dirEntry }
		Errors  []struct {
			OpIndex int
			What    string
		}
	}
	switch rp.status {
	case http.StatusOK, http.StatusConflict:
		if err := decode(rp, &res); err != nil {
			return nil, err
		}
	default:
		return []string{rp.errLine()}, nil
	}
	if rp.status == http.StatusConflict {
		out := []string{"rolled back"}
		for _, e := range res.Errors {
			out = append(out, fmt.Sprintf("  op %d: %s", e.OpIndex, e.What))
		}
		return out, nil
	}
	out := []string{"ok"}
	for _, x := range res.Results {
		if x.KV != nil {
			out = append(out, "  "+fmtEntry(x.KV))
		}
	}
	return out, nil
}

// ---- catalog ----

func (r *runner) catalogRegister(c *command) ([]string, error) {
	if err := checkArgs(c, 0, 0, "node", "address", "check", "status", "name"); err != nil {
		return nil, err
	}
	node := c.opts["node"]
	if node == "" {
		return nil, errorf("catalog register needs node=")
	}
	addr := c.opts["address"]
	if addr == "" {
		addr = "127.0.0.1"
	}
	body := map[string]interface{}{"Node": node, "Address": addr}
	if id := c.opts["check"]; id != "" {
		chk := map[string]interface{}{"CheckID": id, "Name": id}
		if n := c.opts["name"]; n != "" {
			chk["Name"] = n
		}
		if st, ok := c.opts["status"]; ok {
			chk["Status"] = st
		}
		body["Check"] = chk
	}
	raw, _ := json.Marshal(body)
	return r.doPlain("PUT", "/v1/catalog/register", nil, raw)
}

func (r *runner) catalogDeregister(c *command) ([]string, error) {
	if err := checkArgs(c, 0, 0, "node", "check"); err != nil {
		return nil, err
	}
	body := map[string]string{"Node": c.opts["node"]}
	if id := c.opts["check"]; id != "" {
		body["CheckID"] = id
	}
	raw, _ := json.Marshal(body)
	return r.doPlain("PUT", "/v1/catalog/deregister", nil, raw)
}

// ---- time ----

func (r *runner) advance(c *command) ([]string, error) {
	if err := checkArgs(c, 1, 1); err != nil {
		return nil, err
	}
	d, err := time.ParseDuration(c.pos[0])
	if err != nil || d < 0 {
		return nil, errorf("advance needs a non-negative duration, not %q", c.pos[0])
	}
	r.srv.Clock.Advance(d)
	return []string{"now +" + r.srv.Clock.Now().Sub(servertest.Epoch).String()}, nil
}

// doPlain makes a request and prints its answer plainly.
func (r *runner) doPlain(method, path string, q url.Values, body []byte) ([]string, error) {
	rp, err := r.do(method, path, q, body)
	if err != nil {
		return nil, err
	}
	return plain(rp), nil
}

// sessionArg checks c has between min and max positional arguments and
// resolves the $name at position i to a session ID.
func (r *runner) sessionArg(c *command, min, max, i int) (string, error) {
	if err := checkArgs(c, min, max); err != nil {
		return "", err
	}
	return r.session(c.pos[i])
}
