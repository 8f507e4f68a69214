package state

import (
	"slices"
	"sort"
	"strings"
	"sync/atomic"
)

// keyed is what a cowTree holds: items identified and ordered by their
// treeKey.
type keyed interface{ treeKey() string }

// weighed items also carry a number whose highest value under any key
// prefix a cowTree finds without visiting the items (maxPrefix): every
// node keeps the highest weight below it.
type weighed interface{ treeWeight() uint64 }

// isWeighed reports whether the items of a cowTree[T] are weighed.
func isWeighed[T keyed]() bool {
	var zero T
	_, ok := any(zero).(weighed)
	return ok
}

// weight is item's weight (0 for items that are not weighed).
func weight[T keyed](item T) uint64 {
	if w, ok := any(item).(weighed); ok {
		return w.treeWeight()
	}
	return 0
}

// cowTree is an immutable set of items ordered by key: a copy-on-write
// B+tree whose leaves hold up to setMax items and whose branches hold up to
// setMax children, every leaf at the same depth. with and without return a
// new tree sharing every untouched node with the old one, so a tree kept in
// a memdb object can be read by any number of readers while the writer
// derives the next version from it, as memdb's own trees are.
//
// It holds the sessions table (see sessionTable) and each binding (see
// sessionBinding) in about 9 bytes per session, where a go-memdb index
// entry costs a radix leaf, a node and two watch channels: about 450 bytes;
// and the KV store (see kvTable), where a write costs a copy of one path of
// about three nodes instead of memdb's radix path, writable-node cache and
// watch channels.
//
// The zero value is the empty tree. Items are compared by key only.
type cowTree[T keyed] struct {
	root *treeNode[T]
	n    int
}

// sessionSet holds sessions by ID.
type sessionSet = cowTree[*storedSession]

func (s *storedSession) treeKey() string { return s.ID }

const (
	setMax = 32         // most items in a leaf, or children in a branch
	setMin = setMax / 4 // a node below this after a removal is merged with a sibling
)

// treeNode is a leaf (kids == nil: items, sorted by key) or a branch
// (kids, and lo[i] the smallest key under kids[i]). Nodes are never changed
// once a published tree refers to them (see withOwned).
type treeNode[T keyed] struct {
	items []T
	kids  []*treeNode[T]
	lo    []string
	own   uint64 // the writer that may still change it in place; see withOwned
	hi    uint64 // the highest weight under n, for weighed items
}

// weigh sets n.hi from n's items or children (for weighed items; for the
// others it does nothing) and returns n.
func (n *treeNode[T]) weigh() *treeNode[T] {
	if !isWeighed[T]() {
		return n
	}
	var hi uint64
	for _, it := range n.items {
		hi = max(hi, weight(it))
	}
	for _, k := range n.kids {
		hi = max(hi, k.hi)
	}
	n.hi = hi
	return n
}

func (n *treeNode[T]) leaf() bool { return n.kids == nil }

func (n *treeNode[T]) size() int {
	if n.leaf() {
		return len(n.items)
	}
	return len(n.kids)
}

// min is the smallest key under n.
func (n *treeNode[T]) min() string {
	if n.leaf() {
		return n.items[0].treeKey()
	}
	return n.lo[0]
}

// Len is the number of sessions in the set.
func (s cowTree[T]) Len() int { return s.n }

// searchItems is the position of id in items, or where it would go.
func searchItems[T keyed](items []T, key string) (int, bool) {
	i := sort.Search(len(items), func(i int) bool { return items[i].treeKey() >= key })
	return i, i < len(items) && items[i].treeKey() == key
}

// child is the index of the child of branch n whose range holds id.
func (n *treeNode[T]) child(key string) int {
	// The last child whose smallest key is <= key; the first if none is.
	i := sort.Search(len(n.lo), func(i int) bool { return n.lo[i] > key })
	if i > 0 {
		i--
	}
	return i
}

// with returns the tree plus item (replacing an item of the same key).
func (s cowTree[T]) with(item T) cowTree[T] { return s.withOwned(item, 0) }

// withOwned is with for a writer that owns every node marked own (not 0):
// nodes it made since it took own, which no reader can see yet. It
// changes those in place instead of copying them again, so a transaction
// that writes many items near each other copies their shared path once.
// The writer must never use own again once the tree is published.
func (s cowTree[T]) withOwned(item T, own uint64) cowTree[T] {
	if s.root == nil {
		return cowTree[T]{root: (&treeNode[T]{items: []T{item}, own: own}).weigh(), n: 1}
	}
	l, r, added := s.root.insert(item, own)
	if r != nil {
		l = (&treeNode[T]{kids: []*treeNode[T]{l, r}, lo: []string{l.min(), r.min()}, own: own}).weigh()
	}
	n := s.n
	if added {
		n++
	}
	return cowTree[T]{root: l, n: n}
}

// owners hands out the marks withOwned takes, never the same one twice.
var owners atomic.Uint64

func newOwner() uint64 { return owners.Add(1) }

// mut returns n itself if own owns it, or else a copy owned by own with
// room for one more entry.
func (n *treeNode[T]) mut(own uint64) *treeNode[T] {
	if own != 0 && n.own == own {
		return n
	}
	m := &treeNode[T]{own: own}
	if n.leaf() {
		m.items = append(make([]T, 0, len(n.items)+1), n.items...)
	} else {
		m.kids = append(make([]*treeNode[T], 0, len(n.kids)+1), n.kids...)
		m.lo = append(make([]string, 0, len(n.lo)+1), n.lo...)
	}
	return m
}

// insert returns n with item in it, split in two (l, r) if it overflowed.
func (n *treeNode[T]) insert(item T, own uint64) (l, r *treeNode[T], added bool) {
	key := item.treeKey()
	if n.leaf() {
		i, found := searchItems(n.items, key)
		m := n.mut(own)
		if found {
			m.items[i] = item
			return m.weigh(), nil, false
		}
		m.items = slices.Insert(m.items, i, item)
		if len(m.items) <= setMax {
			return m.weigh(), nil, true
		}
		var rest []T
		m.items, rest = halves(m.items, splitAt(len(m.items), i))
		return m.weigh(), (&treeNode[T]{items: rest, own: own}).weigh(), true
	}
	i := n.child(key)
	cl, cr, added := n.kids[i].insert(item, own)
	m := n.mut(own)
	m.kids[i], m.lo[i] = cl, cl.min()
	if cr == nil {
		return m.weigh(), nil, added
	}
	m.kids = slices.Insert(m.kids, i+1, cr)
	m.lo = slices.Insert(m.lo, i+1, cr.min())
	if len(m.kids) <= setMax {
		return m.weigh(), nil, added
	}
	h := splitAt(len(m.kids), i+1)
	var rk []*treeNode[T]
	var rl []string
	m.kids, rk = halves(m.kids, h)
	m.lo, rl = halves(m.lo, h)
	return m.weigh(), (&treeNode[T]{kids: rk, lo: rl, own: own}).weigh(), added
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

// without returns the tree minus the item with key key, and whether there
// was one.
func (s cowTree[T]) without(key string) (cowTree[T], bool) {
	if s.root == nil {
		return s, false
	}
	root, removed := s.root.remove(key)
	if !removed {
		return s, false
	}
	for root != nil && !root.leaf() && len(root.kids) == 1 {
		root = root.kids[0]
	}
	return cowTree[T]{root: root, n: s.n - 1}, true
}

// remove returns n without key (nil if that leaves it empty; possibly below
// setMin, which its parent then repairs).
func (n *treeNode[T]) remove(key string) (*treeNode[T], bool) {
	if n.leaf() {
		i, found := searchItems(n.items, key)
		if !found {
			return n, false
		}
		if len(n.items) == 1 {
			return nil, true
		}
		items := make([]T, len(n.items)-1)
		copy(items, n.items[:i])
		copy(items[i:], n.items[i+1:])
		return (&treeNode[T]{items: items}).weigh(), true
	}
	i := n.child(key)
	c, removed := n.kids[i].remove(key)
	if !removed {
		return n, false
	}
	kids := make([]*treeNode[T], len(n.kids))
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
	return (&treeNode[T]{kids: kids, lo: lo}).weigh(), true
}

// merge joins adjacent siblings a and b (same depth) into one node, or into
// two of about equal size if one would overflow.
func merge[T keyed](a, b *treeNode[T]) (*treeNode[T], *treeNode[T]) {
	if a.leaf() {
		items := make([]T, 0, len(a.items)+len(b.items))
		items = append(append(items, a.items...), b.items...)
		if len(items) <= setMax {
			return (&treeNode[T]{items: items}).weigh(), nil
		}
		l, r := halves(items, len(items)/2)
		return (&treeNode[T]{items: l}).weigh(), (&treeNode[T]{items: r}).weigh()
	}
	kids := make([]*treeNode[T], 0, len(a.kids)+len(b.kids))
	kids = append(append(kids, a.kids...), b.kids...)
	lo := make([]string, 0, len(kids))
	lo = append(append(lo, a.lo...), b.lo...)
	if len(kids) <= setMax {
		return (&treeNode[T]{kids: kids, lo: lo}).weigh(), nil
	}
	h := len(kids) / 2
	lk, rk := halves(kids, h)
	ll, rl := halves(lo, h)
	return (&treeNode[T]{kids: lk, lo: ll}).weigh(), (&treeNode[T]{kids: rk, lo: rl}).weigh()
}

// halves splits s at h: a left part capped so that it cannot grow into
// the right one, and a right part in an array of its own.
func halves[T any](s []T, h int) ([]T, []T) {
	return s[:h:h], append([]T(nil), s[h:]...)
}

// each calls f on every item in key order until f returns false.
func (s cowTree[T]) each(f func(T) bool) {
	if s.root != nil {
		s.root.each(f)
	}
}

func (n *treeNode[T]) each(f func(T) bool) bool {
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

// get returns the item with key key, or the zero T (nil for a pointer).
func (s cowTree[T]) get(key string) T {
	n := s.root
	if n != nil {
		for !n.leaf() {
			n = n.kids[n.child(key)]
		}
		if i, ok := searchItems(n.items, key); ok {
			return n.items[i]
		}
	}
	var zero T
	return zero
}

// ascend calls f on every item whose key is from or after it, in key order,
// until f returns false.
func (s cowTree[T]) ascend(from string, f func(T) bool) {
	if s.root != nil {
		s.root.ascend(from, f)
	}
}

func (n *treeNode[T]) ascend(from string, f func(T) bool) bool {
	if n.leaf() {
		i, _ := searchItems(n.items, from)
		for _, it := range n.items[i:] {
			if !f(it) {
				return false
			}
		}
		return true
	}
	for i := n.child(from); i < len(n.kids); i++ {
		if !n.kids[i].ascend(from, f) {
			return false
		}
	}
	return true
}

// prefix calls f on every item whose key starts with p, in key order,
// until f returns false.
func (s cowTree[T]) prefix(p string, f func(T) bool) {
	s.ascend(p, func(it T) bool {
		return strings.HasPrefix(it.treeKey(), p) && f(it)
	})
}

// maxPrefix is the highest weight of the items whose key starts with p (0
// if there are none): a walk down the two edges of the range of such keys,
// taking each node between them whole.
func (s cowTree[T]) maxPrefix(p string) uint64 {
	if s.root == nil {
		return 0
	}
	return s.root.maxPrefix(p)
}

func (n *treeNode[T]) maxPrefix(p string) uint64 {
	var hi uint64
	if n.leaf() {
		i, _ := searchItems(n.items, p)
		for _, it := range n.items[i:] {
			if !strings.HasPrefix(it.treeKey(), p) {
				break
			}
			hi = max(hi, weight(it))
		}
		return hi
	}
	first := n.child(p)
	for i := first; i < len(n.kids); i++ {
		if i > first && !strings.HasPrefix(n.lo[i], p) {
			break // this child, and those after it, start past the range
		}
		// The keys with prefix p are one interval of the key order, so a
		// child whose smallest key and whose right neighbour's smallest
		// key both have the prefix holds nothing else.
		if strings.HasPrefix(n.lo[i], p) && i+1 < len(n.kids) && strings.HasPrefix(n.lo[i+1], p) {
			hi = max(hi, n.kids[i].hi)
			continue
		}
		hi = max(hi, n.kids[i].maxPrefix(p))
	}
	return hi
}
