package allocation

import (
	"math/rand/v2"
	"slices"
	"testing"
)

type number int

func (n number) before(o number) bool { return n < o }

// The tree answers as a sorted slice does, through inserts and deletes in random order.
func TestTreeKeepsOrderAndRanks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tr tree[number]
	var sorted []number
	for step := range 5000 {
		n := number(rng.IntN(500))
		if i, found := slices.BinarySearch(sorted, n); found {
			tr.delete(n)
			sorted = slices.Delete(sorted, i, i+1)
		} else {
			tr.insert(n)
			sorted = slices.Insert(sorted, i, n)
		}
		if tr.Len() != len(sorted) {
			t.Fatalf("step %d: %d items, want %d", step, tr.Len(), len(sorted))
		}
		if len(sorted) == 0 {
			continue
		}
		i := rng.IntN(len(sorted))
		if got := tr.at(i); got != sorted[i] {
			t.Fatalf("step %d: at(%d) = %d, want %d", step, i, got, sorted[i])
		}
		probe := number(rng.IntN(500))
		if want, _ := slices.BinarySearch(sorted, probe); tr.rank(probe) != want {
			t.Fatalf("step %d: rank(%d) = %d, want %d", step, probe, tr.rank(probe), want)
		}
	}
	var all []number
	tr.each(func(n number) { all = append(all, n) })
	if !slices.Equal(all, sorted) {
		t.Fatalf("each gave %v, want %v", all, sorted)
	}
}

// A tree that lost an item stops rather than decide on a wrong index.
func TestTreeDeleteOfAMissingItemPanics(t *testing.T) {
	var tr tree[number]
	tr.insert(1)
	defer func() {
		if recover() == nil {
			t.Fatal("deleting an item that is not there went unnoticed")
		}
	}()
	tr.delete(2)
}
