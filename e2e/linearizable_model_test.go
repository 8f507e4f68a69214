package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// The sequential specification TestLinearizableAcrossCrashes checks its
// history against, one KV key at a time (the model is partitioned by key).
//
// A key's state is its value ("" while the key does not exist) and the
// session that holds it ("" when unlocked). Every value a test writes is
// unique in the whole run and never empty, so a value names one version of
// the key: that is what makes the CAS below exact (see linCAS).
//
// The operations, with the answers the model allows:
//
//	linRead     GET /v1/kv/<key> (default or ?consistent): the value and
//	            holder are exactly the state's; absent is Value "".
//	linWrite    PUT /v1/kv/<key>: always true; sets the value, keeps the
//	            holder (holdfast's plain PUT never touches Session).
//	linCAS      PUT ?cas=<ModifyIndex read with value Exp> (cas=0 when the
//	            read found no key, Exp ""): true iff the value is still
//	            Exp, and then sets it; the holder is kept. The server
//	            compares indexes, not values, but with unique values a
//	            ModifyIndex and a value name the same version.
//	linAcquire  PUT ?acquire=<session>: true iff the key is unlocked or
//	            already held by that session (a re-acquire); then the key
//	            is held by it and its value is the request's body. The
//	            sessions have LockDelay 0 and are never invalidated, so
//	            lock-delay never refuses an acquire.
//	linRelease  PUT ?release=<session>: true iff that session holds the
//	            key; then the key is unlocked and its value is the body.
//	            A release of an absent, unlocked or other-held key is false.
//
// A write whose outcome is unknown (the connection broke, or a 5xx other
// than "No cluster leader") is recorded with Output.Unknown and a Return at
// the end of the history. The model then accepts it wherever it is placed
// after its call, with the effect the operation has there (a CAS or
// acquire whose condition fails there changes nothing): placed after every
// other operation, it is the write that never happened. So "applied" and
// "not applied" are both allowed, and nothing else is.
const (
	linRead    = "read"
	linWrite   = "write"
	linCAS     = "cas"
	linAcquire = "acquire"
	linRelease = "release"
)

// linInput is one operation as invoked.
type linInput struct {
	Op         string
	Key        string
	Value      string // written value: write, cas, acquire and release bodies
	Exp        string // cas: the value the ModifyIndex was read with ("" = absent)
	Session    string // acquire, release
	Consistent bool   // read: ?consistent (for the description only)
}

// linOutput is its answer.
type linOutput struct {
	OK      bool   // write, cas, acquire, release: the body was true
	Unknown bool   // write, cas, acquire, release: no answer; may or may not have been applied
	Value   string // read: the value, "" when the key is absent
	Holder  string // read: the session holding the key
}

// linState is one key's state.
type linState struct {
	Value  string // "" = absent
	Holder string
}

func linStep(state, input, output interface{}) (bool, interface{}) {
	st := state.(linState)
	in := input.(linInput)
	out := output.(linOutput)
	var cond bool
	next := st
	switch in.Op {
	case linRead:
		return out.Value == st.Value && out.Holder == st.Holder, st
	case linWrite:
		cond = true
		next.Value = in.Value
	case linCAS:
		cond = st.Value == in.Exp
		next.Value = in.Value
	case linAcquire:
		cond = st.Holder == "" || st.Holder == in.Session
		next = linState{Value: in.Value, Holder: in.Session}
	case linRelease:
		cond = st.Holder == in.Session
		next = linState{Value: in.Value}
	default:
		panic("linStep: unknown op " + in.Op)
	}
	if out.Unknown {
		// Applied here: the op had its effect, which a failed
		// condition makes none.
		if cond {
			return true, next
		}
		return true, st
	}
	if out.OK != cond {
		return false, st
	}
	if cond {
		return true, next
	}
	return true, st
}

func linHash(state interface{}) uint64 {
	st := state.(linState)
	var h uint64 = 14695981039346656037
	for _, s := range []string{st.Value, "\x00", st.Holder} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	return h
}

// linPartition splits a history by key, the keys in sorted order (so a
// partition's index names its key: linKeys gives them in the same order).
func linPartition(history []porcupine.Operation) [][]porcupine.Operation {
	by := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(linInput).Key
		by[k] = append(by[k], op)
	}
	var out [][]porcupine.Operation
	for _, k := range linKeys(history) {
		out = append(out, by[k])
	}
	return out
}

func linKeys(history []porcupine.Operation) []string {
	seen := map[string]bool{}
	var keys []string
	for _, op := range history {
		k := op.Input.(linInput).Key
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func showValue(v string) string {
	if v == "" {
		return "absent"
	}
	return v
}

func showHolder(h string) string {
	if h == "" {
		return "unlocked"
	}
	return "held by " + shortSession(h)
}

func shortSession(s string) string {
	if len(s) > 8 {
		return s[:8]
	}
	return s
}

func linDescribe(input, output interface{}) string {
	in := input.(linInput)
	out := output.(linOutput)
	var call string
	switch in.Op {
	case linRead:
		mode := "default"
		if in.Consistent {
			mode = "consistent"
		}
		return fmt.Sprintf("read(%s, %s) -> %s, %s", in.Key, mode, showValue(out.Value), showHolder(out.Holder))
	case linWrite:
		call = fmt.Sprintf("write(%s, %s)", in.Key, in.Value)
	case linCAS:
		call = fmt.Sprintf("cas(%s, %s -> %s)", in.Key, showValue(in.Exp), in.Value)
	case linAcquire:
		call = fmt.Sprintf("acquire(%s, %s, %s)", in.Key, shortSession(in.Session), in.Value)
	case linRelease:
		call = fmt.Sprintf("release(%s, %s, %s)", in.Key, shortSession(in.Session), in.Value)
	}
	if out.Unknown {
		return call + " -> unknown"
	}
	return fmt.Sprintf("%s -> %v", call, out.OK)
}

func linDescribeState(state interface{}) string {
	st := state.(linState)
	return showValue(st.Value) + ", " + showHolder(st.Holder)
}

// linModel is the model both tests check with.
var linModel = porcupine.Model{
	Partition:         linPartition,
	Init:              func() interface{} { return linState{} },
	Step:              linStep,
	Hash:              linHash,
	DescribeOperation: linDescribe,
	DescribeState:     linDescribeState,
}

// linCheckTimeout bounds one check; a check that runs out of time fails the
// test (porcupine's Unknown), it never passes it.
const linCheckTimeout = 30 * time.Second

// TestLinearizableModel feeds hand-built histories to linModel: the
// histories a broken server would produce must be rejected, and their
// legal variants accepted, so that TestLinearizableAcrossCrashes cannot
// pass because its model accepts everything. No process is started.
func TestLinearizableModel(t *testing.T) {
	const end = 1000 // the end of every history: where unknown outcomes return
	op := func(client int, call, ret int64, in linInput, out linOutput) porcupine.Operation {
		if in.Key == "" {
			in.Key = "k"
		}
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
	}
	w := func(c int, call, ret int64, v string) porcupine.Operation {
		return op(c, call, ret, linInput{Op: linWrite, Value: v}, linOutput{OK: true})
	}
	wUnknown := func(c int, call int64, v string) porcupine.Operation {
		return op(c, call, end, linInput{Op: linWrite, Value: v}, linOutput{Unknown: true})
	}
	r := func(c int, call, ret int64, v, holder string) porcupine.Operation {
		return op(c, call, ret, linInput{Op: linRead}, linOutput{Value: v, Holder: holder})
	}
	cas := func(c int, call, ret int64, exp, v string, ok bool) porcupine.Operation {
		return op(c, call, ret, linInput{Op: linCAS, Exp: exp, Value: v}, linOutput{OK: ok})
	}
	casUnknown := func(c int, call int64, exp, v string) porcupine.Operation {
		return op(c, call, end, linInput{Op: linCAS, Exp: exp, Value: v}, linOutput{Unknown: true})
	}
	acq := func(c int, call, ret int64, s, v string, ok bool) porcupine.Operation {
		return op(c, call, ret, linInput{Op: linAcquire, Session: s, Value: v}, linOutput{OK: ok})
	}
	rel := func(c int, call, ret int64, s, v string, ok bool) porcupine.Operation {
		return op(c, call, ret, linInput{Op: linRelease, Session: s, Value: v}, linOutput{OK: ok})
	}
	onKey := func(key string, o porcupine.Operation) porcupine.Operation {
		in := o.Input.(linInput)
		in.Key = key
		o.Input = in
		return o
	}

	cases := []struct {
		name  string
		legal bool
		h     []porcupine.Operation
	}{
		{"reads follow writes", true, []porcupine.Operation{
			r(0, 0, 5, "", ""), w(0, 10, 20, "a"), r(1, 30, 40, "a", ""), w(0, 50, 60, "b"), r(1, 70, 80, "b", "")}},
		{"stale read: a value overwritten before the read began", false, []porcupine.Operation{
			w(0, 10, 20, "a"), w(0, 30, 40, "b"), r(1, 50, 60, "a", "")}},
		{"read concurrent with the overwrite may see either", true, []porcupine.Operation{
			w(0, 10, 20, "a"), w(0, 30, 60, "b"), r(1, 40, 50, "a", ""), r(2, 40, 50, "b", "")}},
		{"reads going back in time", false, []porcupine.Operation{
			w(0, 10, 20, "a"), w(0, 30, 100, "b"), r(1, 40, 50, "b", ""), r(2, 60, 70, "a", "")}},
		{"lost acknowledged write: absent after it", false, []porcupine.Operation{
			w(0, 10, 20, "a"), r(1, 30, 40, "", "")}},
		{"lost acknowledged write: the older value back", false, []porcupine.Operation{
			w(0, 10, 20, "a"), w(1, 30, 40, "b"), r(2, 50, 60, "b", ""), r(2, 70, 80, "a", "")}},
		{"a value nobody wrote", false, []porcupine.Operation{
			w(0, 10, 20, "a"), r(1, 30, 40, "zz", "")}},
		{"unknown write never seen", true, []porcupine.Operation{
			w(0, 10, 20, "a"), wUnknown(1, 30, "b"), r(2, 40, 50, "a", ""), r(2, 60, 70, "a", "")}},
		{"unknown write seen later", true, []porcupine.Operation{
			w(0, 10, 20, "a"), wUnknown(1, 30, "b"), r(2, 40, 50, "a", ""), r(2, 60, 70, "b", "")}},
		{"unknown write seen, then undone", false, []porcupine.Operation{
			w(0, 10, 20, "a"), wUnknown(1, 30, "b"), r(2, 40, 50, "b", ""), r(2, 60, 70, "a", "")}},
		{"unknown write seen before it was sent", false, []porcupine.Operation{
			r(2, 0, 5, "b", ""), wUnknown(1, 30, "b")}},
		{"cas on the current value", true, []porcupine.Operation{
			w(0, 10, 20, "a"), cas(1, 30, 40, "a", "b", true), cas(2, 50, 60, "a", "c", false), r(0, 70, 80, "b", "")}},
		{"cas on absent key", true, []porcupine.Operation{
			cas(1, 0, 10, "", "a", true), cas(2, 20, 30, "", "b", false), r(0, 40, 50, "a", "")}},
		{"cas succeeding on an overwritten value", false, []porcupine.Operation{
			w(0, 10, 20, "a"), w(0, 30, 40, "b"), cas(1, 50, 60, "a", "c", true)}},
		{"cas failing on the current value", false, []porcupine.Operation{
			w(0, 10, 20, "a"), cas(1, 30, 40, "a", "c", false)}},
		{"two cas from one version both succeed", false, []porcupine.Operation{
			w(0, 10, 20, "a"), cas(1, 30, 40, "a", "b", true), cas(2, 30, 40, "a", "c", true)}},
		{"unknown cas that could not apply, seen", false, []porcupine.Operation{
			w(0, 10, 20, "a"), w(0, 30, 40, "b"), casUnknown(1, 50, "a", "c"), r(2, 60, 70, "c", "")}},
		{"unknown cas applied", true, []porcupine.Operation{
			w(0, 10, 20, "a"), casUnknown(1, 30, "a", "c"), r(2, 60, 70, "c", "")}},
		{"plain write answered false", false, []porcupine.Operation{
			op(0, 10, 20, linInput{Op: linWrite, Value: "a"}, linOutput{OK: false})}},
		{"lock handed over", true, []porcupine.Operation{
			acq(0, 10, 20, "s1", "x1", true), acq(1, 30, 40, "s2", "x2", false), r(2, 45, 48, "x1", "s1"),
			acq(0, 50, 60, "s1", "x3", true), rel(1, 70, 80, "s2", "x4", false), rel(0, 90, 100, "s1", "x5", true),
			r(2, 105, 108, "x5", ""), acq(1, 110, 120, "s2", "x6", true), w(0, 130, 140, "x7"), r(2, 150, 160, "x7", "s2")}},
		{"two holders", false, []porcupine.Operation{
			acq(0, 10, 20, "s1", "x1", true), acq(1, 30, 40, "s2", "x2", true)}},
		{"release by a non-holder", false, []porcupine.Operation{
			acq(0, 10, 20, "s1", "x1", true), rel(1, 30, 40, "s2", "x2", true)}},
		{"release of a free key", false, []porcupine.Operation{
			rel(1, 30, 40, "s2", "x2", true)}},
		{"acquire refused on a free key", false, []porcupine.Operation{
			w(0, 0, 5, "a"), acq(0, 10, 20, "s1", "x1", false)}},
		{"lock lost: read unlocked after an acquire", false, []porcupine.Operation{
			acq(0, 10, 20, "s1", "x1", true), r(1, 30, 40, "x1", "")}},
		{"plain write drops the holder", false, []porcupine.Operation{
			acq(0, 10, 20, "s1", "x1", true), w(1, 30, 40, "a"), r(1, 50, 60, "a", "")}},
		{"keys are independent", true, []porcupine.Operation{
			onKey("k1", w(0, 10, 20, "a")), onKey("k2", w(1, 10, 20, "b")), onKey("k1", r(2, 30, 40, "a", "")),
			onKey("k2", r(2, 50, 60, "b", ""))}},
		{"keys are independent, and each is checked", false, []porcupine.Operation{
			onKey("k1", w(0, 10, 20, "a")), onKey("k2", w(1, 10, 20, "b")), onKey("k1", r(2, 30, 40, "a", "")),
			onKey("k2", r(2, 50, 60, "", ""))}},
	}
	for _, c := range cases {
		res := porcupine.CheckOperationsTimeout(linModel, c.h, linCheckTimeout)
		want := porcupine.Illegal
		if c.legal {
			want = porcupine.Ok
		}
		if res != want {
			var ops []string
			for _, o := range c.h {
				ops = append(ops, fmt.Sprintf("[%d,%d] %s", o.Call, o.Return, linDescribe(o.Input, o.Output)))
			}
			t.Errorf("%s: check says %v, want %v; history:\n  %s", c.name, res, want, strings.Join(ops, "\n  "))
		}
	}
}
