package state

import (
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// checkSet verifies s against the sorted model ids and the B+tree's
// invariants: sizes, separators, order, every leaf at one depth.
func checkSet(t *testing.T, s sessionSet, ids []string) {
	t.Helper()
	if s.Len() != len(ids) {
		t.Fatalf("Len = %d, want %d", s.Len(), len(ids))
	}
	var got []string
	s.each(func(x *storedSession) bool { got = append(got, x.ID); return true })
	if !slices.Equal(got, ids) {
		t.Fatalf("each = %v, want %v", got, ids)
	}
	for _, id := range ids {
		if x := s.get(id); x == nil || x.ID != id {
			t.Fatalf("get(%q) = %v", id, x)
		}
	}
	if s.get("absent") != nil || s.get("") != nil || s.get("~") != nil {
		t.Fatal("get found an absent ID")
	}
	if s.root == nil {
		if len(ids) != 0 {
			t.Fatal("nil root with items")
		}
		return
	}
	leafDepth := -1
	var walk func(n *treeNode[*storedSession], depth int, root bool) int
	walk = func(n *treeNode[*storedSession], depth int, root bool) int {
		if n.size() == 0 || n.size() > setMax {
			t.Fatalf("node of size %d", n.size())
		}
		if n.leaf() {
			if leafDepth == -1 {
				leafDepth = depth
			} else if depth != leafDepth {
				t.Fatalf("leaves at depths %d and %d", leafDepth, depth)
			}
			if n.lo != nil {
				t.Fatal("leaf with separators")
			}
			return len(n.items)
		}
		if root && len(n.kids) < 2 {
			t.Fatalf("branch root with %d children", len(n.kids))
		}
		if len(n.lo) != len(n.kids) || n.items != nil {
			t.Fatalf("branch with %d kids, %d separators, %d items", len(n.kids), len(n.lo), len(n.items))
		}
		total := 0
		for i, k := range n.kids {
			if n.lo[i] != k.min() {
				t.Fatalf("separator %q, child min %q", n.lo[i], k.min())
			}
			total += walk(k, depth+1, false)
		}
		return total
	}
	if n := walk(s.root, 0, true); n != len(ids) {
		t.Fatalf("tree holds %d, want %d", n, len(ids))
	}
}

func sess(id string) *storedSession { return &storedSession{Session: Session{ID: id}} }

func TestSessionSetAgainstModel(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 99))
			var s sessionSet
			model := map[string]bool{}
			// Old versions must stay exactly as they were (immutability).
			type version struct {
				s   sessionSet
				ids []string
			}
			var old []version
			sorted := func() []string {
				ids := make([]string, 0, len(model))
				for id := range model {
					ids = append(ids, id)
				}
				sort.Strings(ids)
				return ids
			}
			span := 3000
			// Writes run as a writer owning its new nodes (withOwned) for
			// runs of random length, as a transaction does, and publish
			// (take a new owner) before a version is kept; seed 1 writes
			// without an owner throughout.
			var own uint64
			for step := range 30000 {
				if step == 15000 {
					span = 200 // shrink: exercise merges and root collapse
				}
				if seed != 1 && r.IntN(40) == 0 {
					own = newOwner()
				}
				id := fmt.Sprintf("%04d", r.IntN(span))
				if r.IntN(10) < 5 && step < 15000 || r.IntN(10) < 2 {
					x := sess(id)
					s = s.withOwned(x, own)
					model[id] = true
					if s.get(id) != x {
						t.Fatalf("step %d: with(%s) did not replace", step, id)
					}
				} else {
					var removed bool
					s, removed = s.without(id)
					if removed != model[id] {
						t.Fatalf("step %d: without(%s) = %v, want %v", step, id, removed, model[id])
					}
					delete(model, id)
				}
				if step%997 == 0 {
					checkSet(t, s, sorted())
					old = append(old, version{s, sorted()})
					if own != 0 {
						own = newOwner() // published: its nodes are frozen
					}
				}
			}
			// Empty it completely.
			for _, id := range sorted() {
				var ok bool
				if s, ok = s.without(id); !ok {
					t.Fatalf("without(%s) failed", id)
				}
				delete(model, id)
			}
			checkSet(t, s, nil)
			for _, v := range old {
				checkSet(t, v.s, v.ids)
			}
		})
	}
}

func TestSessionSetSequential(t *testing.T) {
	// Ascending inserts (as a snapshot restore does), then descending
	// removals.
	var s sessionSet
	var ids []string
	for i := range 5000 {
		id := fmt.Sprintf("%05d", i)
		s = s.with(sess(id))
		ids = append(ids, id)
	}
	checkSet(t, s, ids)
	for i := len(ids) - 1; i >= 0; i-- {
		var ok bool
		if s, ok = s.without(ids[i]); !ok {
			t.Fatalf("without(%s) failed", ids[i])
		}
		if i%500 == 0 {
			checkSet(t, s, ids[:i])
		}
	}
	if s.root != nil || s.Len() != 0 {
		t.Fatal("set not empty")
	}
	if _, ok := s.without("x"); ok {
		t.Fatal("without on an empty set removed something")
	}
}

func TestSessionSetEachStops(t *testing.T) {
	var s sessionSet
	for i := range 100 {
		s = s.with(sess(fmt.Sprintf("%03d", i)))
	}
	n := 0
	s.each(func(*storedSession) bool { n++; return n < 40 })
	if n != 40 {
		t.Fatalf("each visited %d after stopping at 40", n)
	}
}

func TestSessionSetRangeRemoval(t *testing.T) {
	// Random inserts fill branches; removing a run of neighbouring IDs
	// empties whole leaves and branches, so underfull nodes are merged with
	// full siblings (and re-split), at both levels.
	r := rand.New(rand.NewPCG(7, 7))
	var s sessionSet
	model := map[string]bool{}
	for len(model) < 60000 {
		id := fmt.Sprintf("%06d", r.IntN(1000000))
		s = s.with(sess(id))
		model[id] = true
	}
	ids := make([]string, 0, len(model))
	for id := range model {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	checkSet(t, s, ids)
	for _, cut := range [][2]int{{20000, 30000}, {0, 5000}, {40000, 49000}, {5000, 6000}} {
		var kept []string
		for i, id := range ids {
			if id >= fmt.Sprintf("%06d", cut[0]*10) && id < fmt.Sprintf("%06d", cut[1]*10) {
				var ok bool
				if s, ok = s.without(id); !ok {
					t.Fatalf("without(%s) failed at %d", id, i)
				}
			} else {
				kept = append(kept, id)
			}
		}
		ids = kept
		checkSet(t, s, ids)
	}
}

func TestStoredSessionWatch(t *testing.T) {
	isClosed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	// Watched, then invalidated: the watchers' channel closes.
	s := sess("a")
	c1, c2 := s.watchCh(), s.watchCh()
	if c1 != c2 || isClosed(c1) {
		t.Fatal("watchers of one session must share one open channel")
	}
	s.invalidated()
	if !isClosed(c1) {
		t.Fatal("invalidated did not close the channel")
	}
	// A watcher that read the session before it went, but asks for the
	// channel after: closed at once.
	if !isClosed(s.watchCh()) {
		t.Fatal("watchCh after invalidated is open")
	}
	// Never watched: invalidated makes no channel of its own to close twice.
	u := sess("b")
	u.invalidated()
	u.invalidated()
	if !isClosed(u.watchCh()) {
		t.Fatal("watchCh of an invalidated session is open")
	}
}

// checkBindings verifies that the bindings table is exactly what the
// sessions derive: each session in the binding of each distinct check it
// names (or of noCheck), nothing else, and no empty binding.
func checkBindings(t *testing.T, s *Store) {
	t.Helper()
	tx := s.db.Txn(false)
	_, all := sessionsOf(tx)
	want := map[string][]string{}
	all.each(func(r *storedSession) bool {
		for _, c := range sessionChecks(&r.Session) {
			k := r.Node + "/" + c
			want[k] = append(want[k], r.ID)
		}
		return true
	})
	got := map[string][]string{}
	it, err := tx.Get(tabBindings, "id")
	if err != nil {
		t.Fatal(err)
	}
	for raw := it.Next(); raw != nil; raw = it.Next() {
		b := raw.(*sessionBinding)
		if b.Sessions.Len() == 0 {
			t.Fatalf("empty binding %s/%s", b.Node, b.Check)
		}
		k := b.Node + "/" + b.Check
		b.Sessions.each(func(r *storedSession) bool {
			if all.get(r.ID) != r {
				t.Fatalf("binding %s holds %s, which is not the stored session", k, r.ID)
			}
			got[k] = append(got[k], r.ID)
			return true
		})
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("bindings %v, want %v", got, want)
	}
}

func TestBindingsFollowSessions(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	s := New()
	idx := uint64(0)
	next := func() uint64 { idx++; return idx }
	nodes := []string{"n1", "n2", "n3"}
	checks := []string{SerfCheckID, "c1", "c2"}
	now := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	most := 0
	for step := range 3000 {
		node := nodes[r.IntN(len(nodes))]
		switch op := r.IntN(20); {
		case op < 3: // (re-)register the node with every check, some failing
			req := &RegisterRequest{Node: node, Address: "10.0.0.1"}
			for _, c := range checks {
				st := HealthPassing
				if r.IntN(8) == 0 {
					st = HealthCritical
				}
				req.Checks = append(req.Checks, &HealthCheck{CheckID: c, Status: st})
			}
			if err := s.Register(next(), now, req); err != nil {
				t.Fatal(err)
			}
		case op < 12: // create a session bound to some checks
			in := &Session{ID: fmt.Sprintf("s%03d", r.IntN(300)), Node: node, TTL: "60s"}
			for range r.IntN(3) {
				in.NodeChecks = append(in.NodeChecks, checks[r.IntN(len(checks))])
			}
			_ = s.SessionCreate(next(), in) // may fail: node or check missing or critical, ID taken
		case op < 17:
			if err := s.SessionDestroy(next(), now, fmt.Sprintf("s%03d", r.IntN(300))); err != nil {
				t.Fatal(err)
			}
		case op < 18:
			if err := s.Deregister(next(), now, &DeregisterRequest{Node: node, CheckID: checks[r.IntN(len(checks))]}); err != nil {
				t.Fatal(err)
			}
		case op < 19:
			if err := s.Deregister(next(), now, &DeregisterRequest{Node: node}); err != nil {
				t.Fatal(err)
			}
		default: // a snapshot round trip
			var buf bytes.Buffer
			if err := s.Snapshot().Persist(&buf); err != nil {
				t.Fatal(err)
			}
			var err error
			if s, err = Restore(&buf); err != nil {
				t.Fatal(err)
			}
		}
		if step%10 == 0 {
			checkBindings(t, s)
		}
		_, all := sessionsOf(s.db.Txn(false))
		most = max(most, all.Len())
	}
	checkBindings(t, s)
	if most < 30 {
		t.Fatalf("at most %d sessions at once: the test exercises too little", most)
	}
}

func TestCowTreePrefix(t *testing.T) {
	var s sessionSet
	var all []string
	for i := range 3000 {
		id := fmt.Sprintf("%d", i)
		s = s.withOwned(sess(id), 7)
		all = append(all, id)
	}
	sort.Strings(all)
	for _, p := range []string{"", "1", "12", "299", "2999", "3000", "9", "99", "a", "0"} {
		var want, got []string
		for _, id := range all {
			if strings.HasPrefix(id, p) {
				want = append(want, id)
			}
		}
		s.prefix(p, func(x *storedSession) bool { got = append(got, x.ID); return true })
		if !slices.Equal(got, want) {
			t.Fatalf("prefix(%q) = %d items, want %d", p, len(got), len(want))
		}
	}
	n := 0
	s.prefix("1", func(*storedSession) bool { n++; return n < 5 })
	if n != 5 {
		t.Fatalf("prefix visited %d after stopping at 5", n)
	}
	var from []string
	s.ascend("2995", func(x *storedSession) bool { from = append(from, x.ID); return true })
	if want := all[sort.SearchStrings(all, "2995"):]; !slices.Equal(from, want) {
		t.Fatalf("ascend(2995) = %v, want %v", from, want)
	}
}

// TestCowTreeMaxPrefix holds maxPrefix, and the highest weight every node
// keeps, to a model through random inserts, re-inserts with lower and
// higher weights, and removals (which merge and split nodes), checking
// every old version of the tree too, as readers of old snapshots see them.
func TestCowTreeMaxPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	type version struct {
		tree  cowTree[*tombstone]
		model map[string]uint64
	}
	var tree cowTree[*tombstone]
	model := map[string]uint64{}
	var versions []version
	key := func() string {
		// Keys share prefixes at several depths: "a/", "a/b", "a/b1/" ...
		return fmt.Sprintf("%c/%c%d/%d", 'a'+rng.IntN(3), 'b'+rng.IntN(3), rng.IntN(20), rng.IntN(50))
	}
	prefixes := []string{"", "a", "a/", "b/c", "b/c1", "b/c1/", "c/d19/4", "c/d19/49", "z", "a/b0/0"}
	check := func(v version) {
		t.Helper()
		for _, p := range append(prefixes, key(), key()[:3]) {
			var want uint64
			for k, w := range v.model {
				if strings.HasPrefix(k, p) {
					want = max(want, w)
				}
			}
			if got := v.tree.maxPrefix(p); got != want {
				t.Fatalf("maxPrefix(%q) = %d, want %d (%d items)", p, got, want, len(v.model))
			}
		}
		var walk func(n *treeNode[*tombstone]) uint64
		walk = func(n *treeNode[*tombstone]) uint64 {
			var hi uint64
			for _, it := range n.items {
				hi = max(hi, it.Index)
			}
			for _, k := range n.kids {
				hi = max(hi, walk(k))
			}
			if n.hi != hi {
				t.Fatalf("node keeps %d as its highest weight, holds %d", n.hi, hi)
			}
			return hi
		}
		if v.tree.root != nil {
			walk(v.tree.root)
		}
	}
	own := newOwner()
	for step := range 20000 {
		k := key()
		switch r := rng.IntN(10); {
		case r < 6:
			w := uint64(rng.IntN(1000000)) // lower or higher than any earlier one
			tree = tree.withOwned(&tombstone{Key: k, Index: w}, own)
			model[k] = w
		default:
			tree, _ = tree.without(k)
			delete(model, k)
		}
		if step%500 == 0 {
			// Publish: later writes must copy, not change, these nodes.
			own = newOwner()
			versions = append(versions, version{tree, maps.Clone(model)})
			check(versions[len(versions)-1])
		}
	}
	if len(model) < 500 {
		t.Fatalf("only %d items at the end: the test exercises too little", len(model))
	}
	for _, v := range versions {
		check(v)
	}
}
