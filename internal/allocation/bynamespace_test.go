package allocation

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestByNamespaceCountsWhatEachNamespaceHoldsAndWaitsFor: per platform and namespace, the
// tasks holding slots and those waiting; skipped holders are left out, and a namespace whose
// last task went has no count at all.
func TestByNamespaceCountsWhatEachNamespaceHoldsAndWaitsFor(t *testing.T) {
	l := New()
	l.SetHosts([]Host{{Name: "z1", Platform: "linux/s390x", Capacity: 2}, {Name: "p1", Platform: "linux/ppc64le", Capacity: 1}})
	take := func(ns, name, platform string, n int) {
		l.Acquire(Request{Task: Task{Namespace: ns, Name: name}, Platform: platform, Created: t0.Add(time.Duration(n) * time.Second)})
	}
	take("a", "1", "linux/s390x", 1)
	take("b", "2", "linux/s390x", 2)
	take("a", "3", "linux/s390x", 3) // waits
	take("a", "4", "linux/s390x", 4) // waits
	take("a", "5", "linux/ppc64le", 5)
	take("b", "skip/6", "linux/ppc64le", 6) // waits; skipped only as a holder

	sorted := func(c []NamespaceCount) []NamespaceCount {
		slices.SortFunc(c, func(x, y NamespaceCount) int {
			return strings.Compare(x.Platform+" "+x.Namespace, y.Platform+" "+y.Namespace)
		})
		return c
	}
	skip := func(t Task) bool { return strings.HasPrefix(t.Name, "skip/") }
	want := []NamespaceCount{
		{Platform: "linux/ppc64le", Namespace: "a", Holding: 1},
		{Platform: "linux/ppc64le", Namespace: "b", Waiting: 1},
		{Platform: "linux/s390x", Namespace: "a", Holding: 1, Waiting: 2},
		{Platform: "linux/s390x", Namespace: "b", Holding: 1},
	}
	if got := sorted(l.ByNamespace(skip)); !slices.Equal(got, want) {
		t.Errorf("counts %+v, want %+v", got, want)
	}

	// Released slots go to the waiters woken, as their reconciles ask again.
	l.Release(Task{Namespace: "a", Name: "5"})
	take("b", "skip/6", "linux/ppc64le", 6) // holds p1 now, and is skipped
	l.Release(Task{Namespace: "b", Name: "2"})
	take("a", "3", "linux/s390x", 3)
	want = []NamespaceCount{
		{Platform: "linux/s390x", Namespace: "a", Holding: 2, Waiting: 1},
	}
	if got := sorted(l.ByNamespace(skip)); !slices.Equal(got, want) {
		t.Errorf("after releases, counts %+v, want %+v", got, want)
	}
}
