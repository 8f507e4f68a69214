package state

import "sort"

// sessionSet is an immutable set of stored sessions ordered by ID: a
// copy-on-write B+tree whose leaves hold up to setMax sessions and whose
// branches hold up to setMax children, every leaf at the same depth. with
// and without return a new set sharing every untouched node with the old
// one, so a set kept in a memdb object can be read by any number of readers
// while the writer derives the next version from it, as memdb's own trees
// are.
//
// It holds the sessions table (see sessionTable) and each binding (see
// sessionBinding) in about 9 bytes per session, where a go-memdb index
// entry costs a radix leaf, a node and two watch channels: about 450 bytes.
//
// The zero value is the empty set. Sessions are compared by ID only.
type sessionSet struct {
	root *setNode
	n    int
}

const (
	setMax = 32         // most sessions in a leaf, or children in a branch
	setMin = setMax / 4 // a node below this after a removal is merged with a sibling
)

// setNode is a leaf (kids == nil: items, sorted by ID) or a branch (kids,
// and lo[i] the smallest ID under kids[i]). Nodes are never changed once a
// set refers to them.
type setNode struct {
	items []*storedSession
	kids  []*setNode
	lo    []string
}

func (n *setNode) leaf() bool { return n.kids == nil }

func (n *setNode) size() int {
	if n.leaf() {
		return len(n.items)
	}
	return len(n.kids)
}

// min is the smallest ID under n.
func (n *setNode) min() string {
	if n.leaf() {
		return n.items[0].ID
	}
	return n.lo[0]
}

// Len is the number of sessions in the set.
func (s sessionSet) Len() int { return s.n }

// searchItems is the position of id in items, or where it would go.
func searchItems(items []*storedSession, id string) (int, bool) {
	i := sort.Search(len(items), func(i int) bool { return items[i].ID >= id })
	return i, i < len(items) && items[i].ID == id
}

// child is the index of the child of branch n whose range holds id.
func (n *setNode) child(id string) int {
	// The last child whose smallest ID is <= id; the first if none is.
	i := sort.Search(len(n.lo), func(i int) bool { return n.lo[i] > id })
	if i > 0 {
		i--
	}
	return i
}

// with returns the set plus sess (replacing a session of the same ID).
func (s sessionSet) with(sess *storedSession) sessionSet {
	if s.root == nil {
		return sessionSet{root: &setNode{items: []*storedSession{sess}}, n: 1}
	}
	l, r, added := s.root.insert(sess)
	if r != nil {
		l = &setNode{kids: []*setNode{l, r}, lo: []string{l.min(), r.min()}}
	}
	n := s.n
	if added {
		n++
	}
	return sessionSet{root: l, n: n}
}

// insert returns n with sess in it, split in two (l, r) if it overflowed.
func (n *setNode) insert(sess *storedSession) (l, r *setNode, added bool) {
	if n.leaf() {
		i, found := searchItems(n.items, sess.ID)
		if found {
			items := make([]*storedSession, len(n.items))
			copy(items, n.items)
			items[i] = sess
			return &setNode{items: items}, nil, false
		}
		items := make([]*storedSession, len(n.items)+1)
		copy(items, n.items[:i])
		items[i] = sess
		copy(items[i+1:], n.items[i:])
		if len(items) <= setMax {
			return &setNode{items: items}, nil, true
		}
		l, r := halves(items, splitAt(len(items), i))
		return &setNode{items: l}, &setNode{items: r}, true
	}
	i := n.child(sess.ID)
	cl, cr, added := n.kids[i].insert(sess)
	extra := 0
	if cr != nil {
		extra = 1
	}
	kids := make([]*setNode, len(n.kids)+extra)
	lo := make([]string, len(n.kids)+extra)
	copy(kids, n.kids[:i])
	copy(lo, n.lo[:i])
	kids[i], lo[i] = cl, cl.min()
	if cr != nil {
		kids[i+1], lo[i+1] = cr, cr.min()
	}
	copy(kids[i+1+extra:], n.kids[i+1:])
	copy(lo[i+1+extra:], n.lo[i+1:])
	if len(kids) <= setMax {
		return &setNode{kids: kids, lo: lo}, nil, added
	}
	h := splitAt(len(kids), i+1)
	lk, rk := halves(kids, h)
	ll, rl := halves(lo, h)
	return &setNode{kids: lk, lo: ll}, &setNode{kids: rk, lo: rl}, added
}

// splitAt is where a node of n entries (one over setMax) splits after
// entry at was added: in half, except that an entry added at the end leaves
// the left node full, so that ascending inserts (a snapshot restore) fill
// nodes instead of leaving each half empty.
func splitAt(n, at int) int {
	if at == n-1 {
		return n - 1
	}
	return n / 2
}

// without returns the set minus the session with ID id, and whether there
// was one.
func (s sessionSet) without(id string) (sessionSet, bool) {
	if s.root == nil {
		return s, false
	}
	root, removed := s.root.remove(id)
	if !removed {
		return s, false
	}
	for root != nil && !root.leaf() && len(root.kids) == 1 {
		root = root.kids[0]
	}
	return sessionSet{root: root, n: s.n - 1}, true
}

// remove returns n without id (nil if that leaves it empty; possibly below
// setMin, which its parent then repairs).
func (n *setNode) remove(id string) (*setNode, bool) {
	if n.leaf() {
		i, found := searchItems(n.items, id)
		if !found {
			return n, false
		}
		if len(n.items) == 1 {
			return nil, true
		}
		items := make([]*storedSession, len(n.items)-1)
		copy(items, n.items[:i])
		copy(items[i:], n.items[i+1:])
		return &setNode{items: items}, true
	}
	i := n.child(id)
	c, removed := n.kids[i].remove(id)
	if !removed {
		return n, false
	}
	kids := make([]*setNode, len(n.kids))
	copy(kids, n.kids)
	kids[i] = c
	switch {
	case c == nil:
		kids = append(kids[:i], kids[i+1:]...)
	case c.size() < setMin && len(kids) > 1:
		j := i + 1 // merge with the right sibling, or the left one for the last child
		if j == len(kids) {
			i, j = i-1, i
		}
		a, b := merge(kids[i], kids[j])
		if b == nil {
			kids[i] = a
			kids = append(kids[:j], kids[j+1:]...)
		} else {
			kids[i], kids[j] = a, b
		}
	}
	if len(kids) == 0 {
		return nil, true
	}
	lo := make([]string, len(kids))
	for k, kid := range kids {
		lo[k] = kid.min()
	}
	return &setNode{kids: kids, lo: lo}, true
}

// merge joins adjacent siblings a and b (same depth) into one node, or into
// two of about equal size if one would overflow.
func merge(a, b *setNode) (*setNode, *setNode) {
	if a.leaf() {
		items := make([]*storedSession, 0, len(a.items)+len(b.items))
		items = append(append(items, a.items...), b.items...)
		if len(items) <= setMax {
			return &setNode{items: items}, nil
		}
		l, r := halves(items, len(items)/2)
		return &setNode{items: l}, &setNode{items: r}
	}
	kids := make([]*setNode, 0, len(a.kids)+len(b.kids))
	kids = append(append(kids, a.kids...), b.kids...)
	lo := make([]string, 0, len(kids))
	lo = append(append(lo, a.lo...), b.lo...)
	if len(kids) <= setMax {
		return &setNode{kids: kids, lo: lo}, nil
	}
	h := len(kids) / 2
	lk, rk := halves(kids, h)
	ll, rl := halves(lo, h)
	return &setNode{kids: lk, lo: ll}, &setNode{kids: rk, lo: rl}
}

// halves splits s at h: a left part capped so that it cannot grow into
// the right one, and a right part in an array of its own.
func halves[T any](s []T, h int) ([]T, []T) {
	return s[:h:h], append([]T(nil), s[h:]...)
}

// each calls f on every session in ID order until f returns false.
func (s sessionSet) each(f func(*storedSession) bool) {
	if s.root != nil {
		s.root.each(f)
	}
}

func (n *setNode) each(f func(*storedSession) bool) bool {
	if n.leaf() {
		for _, s := range n.items {
			if !f(s) {
				return false
			}
		}
		return true
	}
	for _, k := range n.kids {
		if !k.each(f) {
			return false
		}
	}
	return true
}

// get returns the session with ID id, or nil.
func (s sessionSet) get(id string) *storedSession {
	n := s.root
	if n == nil {
		return nil
	}
	for !n.leaf() {
		n = n.kids[n.child(id)]
	}
	if i, ok := searchItems(n.items, id); ok {
		return n.items[i]
	}
	return nil
}
