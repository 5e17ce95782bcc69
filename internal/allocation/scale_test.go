package allocation

import (
	"fmt"
	"testing"
	"time"
)

// The scale benchmarks time one allocation decision in a ledger the size of a big cluster:
// hosts spread over four platforms (4 slots each), waiters spread over the platforms and over
// waiters/100 namespaces, some of them at their namespace cap. Each runs at two sizes, ten
// times apart, so the growth of a decision's cost with the ledger's size shows. Setup is
// outside the timer, and every timed decision is checked against what it must be, so a
// benchmark cannot time a decision that did nothing.
//
//	linux/amd64    full; cap 2·slots/namespaces: a tenth of the namespaces hold that many, so
//	               their waiters are passed over (hand-over, position)
//	linux/arm64    full, no cap (acquire that queues)
//	linux/s390x    full, no cap
//	linux/ppc64le  half free; cap 5, and every namespace holds 5, so all its waiters wait for
//	               their cap, not for a slot (acquire with free capacity)

var scaleSizes = []struct{ hosts, waiters int }{{1_000, 10_000}, {10_000, 100_000}}

const (
	scaleCapped = "linux/amd64"
	scaleBusy   = "linux/arm64"
	scaleFree   = "linux/ppc64le"
)

var scalePlatforms = []string{scaleCapped, scaleBusy, "linux/s390x", scaleFree}

// scaleLedger is a filled ledger and what the benchmarks need to know of how it was filled.
type scaleLedger struct {
	*Ledger
	hosts, waiters, namespaces int
	// holders of linux/amd64 below their cap, whose release hands the slot over.
	handOff []Task
	// greedy namespaces are at their cap on linux/amd64.
	greedy int
	// next is the Created of the next request, younger than every waiter.
	next time.Time
}

func scaleNamespace(i int) string { return fmt.Sprintf("ns%05d", i) }

func scaleHost(platform string, i int) string { return fmt.Sprintf("%s-%06d", platform, i) }

func runScale(b *testing.B, bench func(b *testing.B, l *scaleLedger)) {
	for _, size := range scaleSizes {
		b.Run(fmt.Sprintf("hosts=%d,waiters=%d", size.hosts, size.waiters), func(b *testing.B) {
			l := newScaleLedger(size.hosts, size.waiters)
			b.ReportAllocs()
			b.ResetTimer()
			bench(b, l)
		})
	}
}

func newScaleLedger(hosts, waiters int) *scaleLedger {
	perPlatform := hosts / len(scalePlatforms)
	slots := perPlatform * 4
	s := &scaleLedger{Ledger: New(), hosts: hosts, waiters: waiters, namespaces: waiters / 100}
	var all []Host
	for _, p := range scalePlatforms {
		for i := range perPlatform {
			all = append(all, Host{Name: scaleHost(p, i), Platform: p, Capacity: 4})
		}
	}
	s.SetHosts(all)
	capped := 2 * slots / s.namespaces
	s.SetNamespaceCaps(map[string]int{scaleCapped: capped, scaleFree: 5})
	s.greedy = s.namespaces / 10

	n, named := 0, 0 // slots filled on the platform, tasks named
	hold := func(platform, ns string) Task {
		t := Task{Namespace: ns, Name: fmt.Sprintf("h%07d", named)}
		named++
		if !s.Adopt(t, scaleHost(platform, n/4), platform) {
			panic(fmt.Sprintf("setup: %v found no slot on %s", t, platform))
		}
		n++
		return t
	}
	for _, p := range scalePlatforms {
		n = 0
		switch p {
		case scaleCapped:
			for g := range s.greedy {
				for range capped {
					hold(p, scaleNamespace(g))
				}
			}
			for i := 0; n < slots; i++ {
				s.handOff = append(s.handOff, hold(p, scaleNamespace(s.greedy+i%(s.namespaces-s.greedy))))
			}
		case scaleFree:
			for i := range 5 * s.namespaces {
				hold(p, scaleNamespace(i%s.namespaces))
			}
		default:
			for i := 0; n < slots; i++ {
				hold(p, scaleNamespace(i%s.namespaces))
			}
		}
	}
	created := t0
	for i := range waiters {
		created = created.Add(time.Millisecond)
		p := scalePlatforms[i%len(scalePlatforms)]
		s.Enqueue(Request{Task: Task{Namespace: scaleNamespace(i / len(scalePlatforms) % s.namespaces), Name: fmt.Sprintf("w%07d", i)},
			Platform: p, Created: created})
	}
	s.next = created.Add(time.Hour)
	return s
}

// BenchmarkScaleHandOver: a holder on the full, capped platform releases its slot; the
// namespace whose turn it is (passing over those at their cap) is woken with its oldest
// waiter, which claims the slot; the finished task comes back as a new waiter. The benchmark
// knows whose turn it is: namespaces below their cap take turns in a fixed cycle, and within
// one the oldest goes first, so it follows the cycle and per-namespace queues beside the ledger.
func BenchmarkScaleHandOver(b *testing.B) {
	runScale(b, func(b *testing.B, l *scaleLedger) {
		b.StopTimer()
		turns, queues := l.expectedTurns(scaleCapped)
		b.StartTimer()
		created := l.next
		for i := range b.N {
			done := l.handOff[i%len(l.handOff)]
			host, _ := l.Holder(done)
			wake := l.Release(done)
			want := queues[turns[i%len(turns)]].pop()
			if len(wake) != 1 || wake[0] != want {
				b.Fatalf("hand-over %d woke %v, want [%v]", i, wake, want)
			}
			if g := l.Acquire(Request{Task: want, Platform: scaleCapped}); g.Host != host {
				b.Fatalf("the woken %v got %+v, want the freed slot on %s", want, g, host)
			}
			l.handOff[i%len(l.handOff)] = want
			created = created.Add(time.Millisecond)
			if g := l.Acquire(Request{Task: done, Platform: scaleCapped, Created: created}); g.Host != "" || g.Position == 0 {
				b.Fatalf("the finished task, queued again, got %+v", g)
			}
			queues[done.Namespace].push(done)
		}
	})
}

// expectedTurns lists the namespaces below their cap in the order of their turns on the
// platform, and each one's waiters, oldest first, as the ledger's Queue shows them.
func (l *scaleLedger) expectedTurns(platform string) ([]string, map[string]*ring) {
	queues := map[string]*ring{}
	var turns []string
	for _, t := range l.Queue(platform) {
		var g int
		fmt.Sscanf(t.Namespace, "ns%d", &g)
		if platform == scaleCapped && g < l.greedy {
			continue
		}
		q := queues[t.Namespace]
		if q == nil {
			q = &ring{}
			queues[t.Namespace] = q
			turns = append(turns, t.Namespace)
		}
		q.tasks = append(q.tasks, t)
	}
	for _, q := range queues {
		// Room for the queue to grow by a few while its turn comes: it loses one a turn and
		// gains one each time a holder of the namespace finishes, about once a turn.
		q.n = len(q.tasks)
		q.tasks = append(q.tasks, make([]Task, q.n+64)...)
	}
	return turns, queues
}

// ring is a fixed-size FIFO, so following the turns costs the benchmark no allocation.
type ring struct {
	tasks   []Task
	head, n int
}

func (r *ring) pop() Task {
	t := r.tasks[r.head]
	r.head = (r.head + 1) % len(r.tasks)
	r.n--
	return t
}

func (r *ring) push(t Task) {
	if r.n == len(r.tasks) {
		panic("benchmark queue overflow")
	}
	r.tasks[(r.head+r.n)%len(r.tasks)] = t
	r.n++
}

// BenchmarkScaleAcquireFree: a task of a namespace that holds nothing asks for a slot on the
// half-free platform whose waiters all wait for their namespace cap; it gets the host with
// the most free slots at once. Every so many, the timer stops and the tasks release again.
func BenchmarkScaleAcquireFree(b *testing.B) {
	runScale(b, func(b *testing.B, l *scaleLedger) {
		// The holders fill the first hosts; from the first empty one on, each host has the
		// most free slots (4) and the lowest name among them when its turn comes.
		firstEmpty := 5 * l.namespaces / 4
		batch := make([]Task, l.hosts/len(scalePlatforms)-firstEmpty)
		for j := range batch {
			batch[j] = Task{Namespace: fmt.Sprintf("fresh%05d", j), Name: "t"}
		}
		b.ResetTimer()
		for i := range b.N {
			j := i % len(batch)
			if g := l.Acquire(Request{Task: batch[j], Platform: scaleFree, Created: l.next}); g.Host != scaleHost(scaleFree, firstEmpty+j) || g.Held || len(g.Wake) != 0 {
				b.Fatalf("%v got %+v, want %s at once", batch[j], g, scaleHost(scaleFree, firstEmpty+j))
			}
			if j == len(batch)-1 || i == b.N-1 {
				b.StopTimer()
				for _, t := range batch[:j+1] {
					if wake := l.Release(t); len(wake) != 0 {
						b.Fatalf("releasing %v woke %v, whose namespaces are at their cap", t, wake)
					}
				}
				b.StartTimer()
			}
		}
	})
}

// BenchmarkScaleAcquireQueued: a new task asks for a slot on a full platform and is queued,
// told its place. Every thousand, the timer stops, the last one's place is checked against
// the queue, and the new tasks leave the queue again.
func BenchmarkScaleAcquireQueued(b *testing.B) {
	runScale(b, func(b *testing.B, l *scaleLedger) {
		batch := make([]Request, 1000)
		for j := range batch {
			batch[j] = Request{Task: Task{Namespace: scaleNamespace(j % l.namespaces), Name: fmt.Sprintf("q%04d", j)},
				Platform: scaleBusy, Created: l.next.Add(time.Duration(j) * time.Millisecond)}
		}
		b.ResetTimer()
		for i := range b.N {
			j := i % len(batch)
			g := l.Acquire(batch[j])
			if g.Host != "" || g.Position == 0 || len(g.Wake) != 0 {
				b.Fatalf("%v on a full platform got %+v", batch[j].Task, g)
			}
			if j == len(batch)-1 || i == b.N-1 {
				b.StopTimer()
				if q := l.Queue(scaleBusy); g.Position > len(q) || q[g.Position-1] != batch[j].Task {
					b.Fatalf("%v was told place %d, not its place in the queue", batch[j].Task, g.Position)
				}
				for _, r := range batch[:j+1] {
					l.Release(r.Task)
				}
				b.StartTimer()
			}
		}
	})
}

// BenchmarkScalePosition: the place in line of a waiter on the capped platform, as the
// controller reads it for the TaskRun's annotation; a thousand waiters spread over the queue,
// each checked against its index in Queue.
func BenchmarkScalePosition(b *testing.B) {
	runScale(b, func(b *testing.B, l *scaleLedger) {
		q := l.Queue(scaleCapped)
		type sample struct {
			task     Task
			position int
		}
		var samples []sample
		for i := 0; i < len(q); i += len(q) / 1000 {
			samples = append(samples, sample{q[i], i + 1})
		}
		b.ResetTimer()
		for i := range b.N {
			s := samples[i%len(samples)]
			if p := l.Position(scaleCapped, s.task); p != s.position {
				b.Fatalf("%v: position %d, want %d", s.task, p, s.position)
			}
		}
	})
}
