package allocation

// ordered is what a tree holds: items that know their order among themselves. Items are
// distinct in that order, and an item's place must not change while it is in a tree: take it
// out, change it, put it back.
type ordered[T any] interface{ before(T) bool }

// tree is a balanced search tree (a treap) that knows every subtree's size, so besides
// insert and delete it finds the i-th item and counts the items before one, all in
// O(log n). The ledger keeps its free hosts, its turns and its queues in trees instead of
// scanning and sorting them for every decision.
type tree[T ordered[T]] struct {
	root *treeNode[T]
	// seed draws the nodes' priorities (a splitmix64 sequence): the tree's shape is random,
	// so its depth is O(log n) whatever the order items come in.
	seed uint64
	// spare holds the nodes of deleted items, linked by right, for the next inserts: a tree
	// whose size stays level allocates nothing.
	spare *treeNode[T]
}

type treeNode[T any] struct {
	item        T
	priority    uint64
	size        int
	left, right *treeNode[T]
}

func sizeOf[T any](n *treeNode[T]) int {
	if n == nil {
		return 0
	}
	return n.size
}

func (n *treeNode[T]) resize() { n.size = 1 + sizeOf(n.left) + sizeOf(n.right) }

// Len is the number of items.
func (t *tree[T]) Len() int { return sizeOf(t.root) }

func (t *tree[T]) insert(x T) {
	n := t.spare
	if n != nil {
		t.spare = n.right
		n.right = nil
	} else {
		n = &treeNode[T]{}
	}
	t.seed += 0x9e3779b97f4a7c15
	z := t.seed
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	n.item, n.priority, n.size = x, z^z>>31, 1
	smaller, rest := split(t.root, x)
	t.root = merge(merge(smaller, n), rest)
}

// delete removes x, which must be in the tree: an index that lost track of an item would
// decide wrongly ever after, so it stops at once.
func (t *tree[T]) delete(x T) {
	var gone *treeNode[T]
	t.root, gone = remove(t.root, x)
	if gone == nil {
		panic("allocation: an index lost track of an item")
	}
	var zero T
	gone.item, gone.left, gone.right = zero, nil, t.spare
	t.spare = gone
}

// at returns the i-th item, from 0.
func (t *tree[T]) at(i int) T {
	n := t.root
	for {
		left := sizeOf(n.left)
		switch {
		case i < left:
			n = n.left
		case i == left:
			return n.item
		default:
			i -= left + 1
			n = n.right
		}
	}
}

// rank counts the items before x.
func (t *tree[T]) rank(x T) int {
	r := 0
	for n := t.root; n != nil; {
		if n.item.before(x) {
			r += sizeOf(n.left) + 1
			n = n.right
		} else {
			n = n.left
		}
	}
	return r
}

// each calls f with every item in order.
func (t *tree[T]) each(f func(T)) { walk(t.root, f) }

func walk[T any](n *treeNode[T], f func(T)) {
	for ; n != nil; n = n.right {
		walk(n.left, f)
		f(n.item)
	}
}

// split parts n into the items before x and the rest.
func split[T ordered[T]](n *treeNode[T], x T) (*treeNode[T], *treeNode[T]) {
	if n == nil {
		return nil, nil
	}
	if n.item.before(x) {
		smaller, rest := split(n.right, x)
		n.right = smaller
		n.resize()
		return n, rest
	}
	smaller, rest := split(n.left, x)
	n.left = rest
	n.resize()
	return smaller, n
}

// merge joins two trees whose items in a all come before those in b.
func merge[T any](a, b *treeNode[T]) *treeNode[T] {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	case a.priority > b.priority:
		a.right = merge(a.right, b)
		a.resize()
		return a
	default:
		b.left = merge(a, b.left)
		b.resize()
		return b
	}
}

// remove takes x out of n; it returns the new subtree and x's node (nil if x was not there).
func remove[T ordered[T]](n *treeNode[T], x T) (*treeNode[T], *treeNode[T]) {
	if n == nil {
		return nil, nil
	}
	var gone *treeNode[T]
	switch {
	case x.before(n.item):
		n.left, gone = remove(n.left, x)
	case n.item.before(x):
		n.right, gone = remove(n.right, x)
	default:
		return merge(n.left, n.right), n
	}
	if gone != nil {
		n.size--
	}
	return n, gone
}
