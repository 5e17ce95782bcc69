// Package allocation is berth's ledger of host slots and of the tasks waiting for them. It is
// plain Go: the controller tells it which hosts exist and what each task asks for, and it
// answers which host a task gets, or its place in the queue. All decisions are taken under one
// lock, so parallel reconciles can never put more tasks on a host than its concurrency.
//
// # What a decision costs
//
// Every reconcile of a task takes a decision under that lock, so a decision must not grow
// with the cluster. Each platform keeps its state indexed (platform.go): the hosts with a free
// slot in the order they are picked, the namespaces that may be served in the order of their
// turns, each namespace's queue, and the namespaces filed by queue length for positions. A
// decision reads only what it needs from them and refiles only the hosts and namespaces it
// changed. For one platform with H hosts and W waiters in N namespaces, L waiters in the
// task's namespace and Lmax in the longest queue, E hosts excluded for the task and P
// platforms; F is the number of slots a decision hands out (1 when a busy cluster frees a
// slot) and X the waiters passed over because every free host is excluded for them (rare):
//
//	                              before                        now
//	Acquire, a slot free          O(H_all + N log N + W + H)    O(log H + log L + R) + plan
//	Acquire that queues           the same + O(N log N)         O(log L + R) + position
//	Release handing the slot on   O(H_all + N log N + W + H)    O(log H + R) + plan
//	plan handing out F slots      (in the above)                O((F + X)(log N + log L + (E+1) log H))
//	Position                      O(N log N + L)                O(log L + log Lmax · log N)
//	Release of a waiter           O(P + L) + plan               O(P + log L + R) + plan
//	SetHosts                      O(H_all) + plans              O(H log H) + plans
//	SetNamespaceCaps              plans                         O(N log N) + plans
//	Queue (lists all)             O(N log N + W)                O(N + W)
//	FreeSlots, Waiting            O(H_all), O(P · N)            O(1), O(P)
//
// H_all counts the hosts of every platform: the plain ledger scanned them all, sorted the
// namespaces and walked the rounds of waiters for every decision. R = O(log N · log Lmax) is
// refiling the one or two namespaces a decision changes (a served namespace's turn moves, a
// queue grows or shrinks): O(log N) in the turns, and O(log Lmax · log N) to keep positions
// exact, because a position counts the namespaces ahead in the turns that have more than a
// given number of waiters, a count over two changing dimensions (see lengthIndex). Lmax is 25
// in the benchmarks' ledger of 100,000 waiters, so R is small; a namespace that floods the
// queue with 100,000 tasks makes log Lmax 17.
//
// The benchmarks Scale* (scale_test.go) time each of these decisions at 1,000 hosts and 10,000
// waiters, and at 10,000 and 100,000: go test -run '^$' -bench Scale -benchmem
// ./internal/allocation/.
package allocation
