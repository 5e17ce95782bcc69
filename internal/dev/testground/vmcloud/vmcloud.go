//go:build linux

// Package vmcloud is a small cloud for development and tests: an HTTP API in the manner of a
// real cloud's, whose VMs are real SSH hosts (sshhosts). berth's local-vm provider
// (internal/dev/localvm) talks to it exactly as the other providers talk to their clouds,
// so the controller's VM handling runs end to end on one machine. It also does what a real
// cloud does only on a bad day, on demand: capacity errors, throttling, failed and slow boots,
// quotas and instances that vanish.
//
// The API (JSON; every call needs "Authorization: Bearer <API key>"):
//
//	POST   /v1/instances          {"token","name","tags"} → 201 a new instance, 200 the token's own
//	GET    /v1/instances/{id}     → 200 the instance (also once gone), 404 when unknown or vanished
//	GET    /v1/instances?tag=k=v  → 200 {"instances":[...]}: those not gone carrying every tag
//	DELETE /v1/instances/{id}     → 200 the instance, gone; 404 when unknown or already gone
//
// Failures answer {"code","message"} with: BadRequest 400, Unauthorized 401, QuotaExceeded
// 403, NotFound 404, Throttled 429 (with Retry-After in seconds), InsufficientCapacity 503.
//
// It is a test ground: only tests, the dev stack and the bench link it, never the controller.
package vmcloud

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// State is where an instance is in its life; the values are the API's.
type State string

const (
	Pending State = "pending" // launched, booting
	Running State = "running" // its host answers SSH at Address:22
	Gone    State = "gone"    // terminated, failed to boot, vanished or the cloud closed
	// Stopped instances were stopped by someone (Stop): the host is down, the cloud keeps the
	// instance, and would bill it, until it is terminated.
	Stopped State = "stopped"
)

// Instance is a VM as the cloud keeps it.
type Instance struct {
	ID    string
	Token string
	Name  string
	State State
	// Address is the host's IP (198.18.N.2) while it runs; sshd listens on port 22.
	Address string
	// HostKey is the key the VM's sshd proves itself with, while it runs.
	HostKey    ssh.PublicKey
	Tags       map[string]string
	LaunchedAt time.Time
	// RunningAt is when its host answered and it became running (zero if it never did).
	RunningAt    time.Time
	TerminatedAt time.Time
	// Reason says why a gone instance went: terminated, boot failed, vanished, cloud closed.
	Reason string
	// Vanished instances are gone without a trace as far as the API is concerned.
	Vanished bool
}

// Options configure a Cloud.
type Options struct {
	// Admin is the key every VM accepts for root, like a key pair registered with a cloud
	// and named at launch. Required.
	Admin ssh.Signer
	// APIKey is the bearer token every call must carry. Required.
	APIKey string
	// BootDelay is how long a VM stays pending before its host starts; SetBootDelay changes
	// it later.
	BootDelay time.Duration
	// Quota is the most instances that may be pending or running at once; 0 is no limit.
	Quota int
	// Addr is where the API listens; 127.0.0.1:0 (a free port) when empty.
	Addr string
	// Logf, if set, hears about launches, boots and terminations (never the API key).
	Logf func(format string, args ...any)
	// Hostless VMs have no SSH host: a boot gives them an address in 198.19.0.0/16 that
	// nothing answers at. For tests of cloud API stand-ins that never log in to a VM; they
	// then need neither root nor sshd.
	Hostless bool
	// DefaultUser, if set, is made an admin of every VM at boot (the admin key, passwordless
	// sudo), as a cloud image's first boot does for its default user, like ec2-user. root
	// still logs in too.
	DefaultUser string
}

// Cloud is a running local VM cloud.
type Cloud struct {
	opts Options
	url  string
	srv  *http.Server
	// served is closed once the API stops serving, servedErr then says why.
	served    chan struct{}
	servedErr error

	// ctx ends every boot when the cloud closes.
	ctx    context.Context
	cancel context.CancelFunc
	// work counts boots and host stops under way; Close waits for them so that no host
	// outlives the cloud. Add is only called under mu while the cloud is open.
	work sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	vms       map[string]*vm
	order     []*vm // launch order
	byToken   map[string]*vm
	launches  int
	bootDelay time.Duration
	quota     int
	// Faults armed for the next calls.
	failLaunches  int
	failBoots     int
	throttles     int
	throttleAfter time.Duration
	// booting and peakBooting count hosts starting at once (tests check boots overlap).
	booting, peakBooting int
	// hostless counts the addresses given to hostless VMs.
	hostless int
	// changed is closed and replaced on every change of any instance, for waiters.
	changed chan struct{}

	closeOnce sync.Once
	closeErr  error
}

type vm struct {
	Instance
	host       *sshhosts.Host
	failBoot   bool
	bootDelay  time.Duration
	cancelBoot context.CancelFunc
	booted     chan struct{} // closed when the boot goroutine is done, host handed over or stopped
}

// New starts a cloud serving its API; Close stops it and every VM.
func New(opts Options) (*Cloud, error) {
	if opts.APIKey == "" {
		return nil, errors.New("vmcloud: Options.APIKey is required")
	}
	if opts.Admin == nil && !opts.Hostless {
		return nil, errors.New("vmcloud: Options.Admin is required: the key VMs accept for root")
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("vmcloud: listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Cloud{
		opts:      opts,
		url:       "http://" + ln.Addr().String(),
		ctx:       ctx,
		cancel:    cancel,
		vms:       map[string]*vm{},
		byToken:   map[string]*vm{},
		bootDelay: opts.BootDelay,
		quota:     opts.Quota,
		changed:   make(chan struct{}),
		served:    make(chan struct{}),
	}
	c.srv = &http.Server{Handler: c.handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		c.servedErr = c.srv.Serve(ln)
		close(c.served)
	}()
	return c, nil
}

// Done is closed once the API has stopped serving: after Close, or when serving failed.
func (c *Cloud) Done() <-chan struct{} { return c.served }

// Err says why the API stopped serving, once Done is closed (http.ErrServerClosed after Close).
func (c *Cloud) Err() error {
	select {
	case <-c.served:
		return c.servedErr
	default:
		return nil
	}
}

// NewForTest starts a cloud for t and closes it when t ends. When this machine cannot run
// hosts it skips t, saying why, except in CI (CI=true), where that is a failure.
func NewForTest(t testing.TB, opts Options) *Cloud {
	t.Helper()
	if err := sshhosts.Prerequisites(); err != nil && !opts.Hostless {
		missing.Skip(t, err)
	}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing the VM cloud: %v", err)
		}
	})
	return c
}

// URL is the API's endpoint, like http://127.0.0.1:40123.
func (c *Cloud) URL() string { return c.url }

// Close stops the API and every VM, booting ones included, and returns once no host of the
// cloud is left. Later calls return the first call's result.
func (c *Cloud) Close() error {
	c.closeOnce.Do(func() {
		var hosts []*sshhosts.Host
		c.mu.Lock()
		c.closed = true
		now := time.Now()
		for _, v := range c.order {
			if v.State == Gone {
				continue
			}
			if v.host != nil {
				hosts = append(hosts, v.host)
				v.host = nil
			}
			v.markGone(now, "cloud closed")
		}
		c.notify()
		c.mu.Unlock()

		c.cancel()
		err := c.srv.Close()
		c.work.Wait() // boots stop the hosts they started; stops in flight finish
		errs := make([]error, len(hosts))
		var wg sync.WaitGroup
		for i, h := range hosts {
			wg.Go(func() { errs[i] = h.Close() })
		}
		wg.Wait()
		c.closeErr = errors.Join(append(errs, err)...)
	})
	return c.closeErr
}

// launchResult is what a launch call comes to: an instance, or an API error.
type launchResult struct {
	inst    Instance
	created bool
	err     *apiError
}

func (c *Cloud) launch(token, name string, tags map[string]string) launchResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return launchResult{err: errorf(http.StatusServiceUnavailable, codeCapacity, "the cloud is shutting down")}
	}
	if v := c.byToken[token]; v != nil {
		// Whatever has become of it since: a token launches one instance, ever.
		return launchResult{inst: v.snapshot()}
	}
	if c.failLaunches > 0 {
		c.failLaunches--
		return launchResult{err: errorf(http.StatusServiceUnavailable, codeCapacity, "no capacity for a new instance now; try again later")}
	}
	if c.quota > 0 && c.active() >= c.quota {
		return launchResult{err: errorf(http.StatusForbidden, codeQuota, "the account may run %d instances and has %d", c.quota, c.active())}
	}
	v := &vm{
		Instance: Instance{
			ID:         newID(),
			Token:      token,
			Name:       name,
			State:      Pending,
			Tags:       tags,
			LaunchedAt: time.Now(),
		},
		bootDelay: c.bootDelay,
		booted:    make(chan struct{}),
	}
	if c.failBoots > 0 {
		c.failBoots--
		v.failBoot = true
	}
	var ctx context.Context
	ctx, v.cancelBoot = context.WithCancel(c.ctx)
	c.vms[v.ID] = v
	c.byToken[token] = v
	c.order = append(c.order, v)
	c.launches++
	c.notify()
	c.work.Add(1)
	go c.boot(ctx, v)
	c.logf("vmcloud: launched %s (token %s, name %q), booting in %s", v.ID, token, name, v.bootDelay)
	return launchResult{inst: v.snapshot(), created: true}
}

// boot waits out the boot delay, starts the VM's host and hands it to the instance, unless
// the instance went meanwhile, in which case it stops the host again: a boot never leaks one.
func (c *Cloud) boot(ctx context.Context, v *vm) {
	defer c.work.Done()
	defer close(v.booted)
	if v.bootDelay > 0 {
		t := time.NewTimer(v.bootDelay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	if v.failBoot {
		c.mu.Lock()
		if v.State == Pending {
			v.markGone(time.Now(), "boot failed")
			c.notify()
		}
		c.mu.Unlock()
		c.logf("vmcloud: %s failed to boot (injected)", v.ID)
		return
	}

	c.mu.Lock()
	c.booting++
	c.peakBooting = max(c.peakBooting, c.booting)
	c.notify()
	c.mu.Unlock()
	h, err := c.startHost(ctx)
	c.mu.Lock()
	c.booting--
	if v.State != Pending {
		c.mu.Unlock()
		if h != nil {
			if err := h.Close(); err != nil {
				c.logf("vmcloud: stopping the host of %s, gone while booting: %v", v.ID, err)
			}
		}
		return
	}
	if err != nil {
		v.markGone(time.Now(), "boot failed: "+err.Error())
		c.notify()
		c.mu.Unlock()
		c.logf("vmcloud: %s failed to boot: %v", v.ID, err)
		return
	}
	v.State = Running
	v.RunningAt = time.Now()
	if h != nil {
		v.host = h
		v.Address = h.Address
		v.HostKey = h.HostKey
	} else {
		c.hostless++
		v.Address = fmt.Sprintf("198.19.%d.%d", c.hostless/250%250, 2+c.hostless%250)
	}
	addr := v.Address // read under mu: a Terminate right after the unlock clears it
	c.notify()
	c.mu.Unlock()
	c.logf("vmcloud: %s running at %s", v.ID, addr)
}

// startHost starts a VM's SSH host; none for a hostless cloud.
func (c *Cloud) startHost(ctx context.Context) (*sshhosts.Host, error) {
	if c.opts.Hostless {
		return nil, nil
	}
	h, err := sshhosts.StartHost(ctx, c.opts.Admin)
	if err != nil || c.opts.DefaultUser == "" {
		return h, err
	}
	if err := h.AddAdmin(ctx, c.opts.DefaultUser); err != nil {
		return nil, errors.Join(err, h.Close())
	}
	return h, nil
}

// end takes an instance down for good: terminated (DELETE) or vanished. It returns once its
// host, booting or running, is stopped. ok is false when there is no such instance to end.
func (c *Cloud) end(id, reason string, vanish bool) (inst Instance, ok bool, err error) {
	c.mu.Lock()
	v := c.vms[id]
	if v == nil || v.Vanished || (v.State == Gone && !vanish) || c.closed {
		c.mu.Unlock()
		return Instance{}, false, nil
	}
	if v.State != Gone {
		v.markGone(time.Now(), reason)
	}
	v.Vanished = v.Vanished || vanish
	h := v.host
	v.host = nil
	v.cancelBoot()
	inst = v.snapshot()
	c.notify()
	c.work.Add(1)
	c.mu.Unlock()
	defer c.work.Done()

	<-v.booted // a boot under way stops its own host
	if h != nil {
		err = h.Close()
	}
	if err != nil {
		c.logf("vmcloud: %s %s; stopping its host: %v", id, reason, err)
	} else {
		c.logf("vmcloud: %s %s", id, reason)
	}
	return inst, true, err
}

func (v *vm) markGone(at time.Time, reason string) {
	v.State = Gone
	v.TerminatedAt = at
	v.Reason = reason
	v.Address = ""
	v.HostKey = nil
}

func (v *vm) snapshot() Instance {
	inst := v.Instance
	if v.Tags != nil {
		inst.Tags = make(map[string]string, len(v.Tags))
		for k, val := range v.Tags {
			inst.Tags[k] = val
		}
	}
	return inst
}

// active counts instances that hold quota: every one not gone, stopped ones included (they are
// kept until terminated). The caller holds mu.
func (c *Cloud) active() int {
	n := 0
	for _, v := range c.order {
		if v.State != Gone {
			n++
		}
	}
	return n
}

// notify wakes every waiter. The caller holds mu.
func (c *Cloud) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *Cloud) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

func newID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "vm-" + hex.EncodeToString(b)
}

// --- Faults ---

// FailLaunches makes the next n launches of new instances fail with InsufficientCapacity
// (503). A launch that answers an existing token's instance does not count.
func (c *Cloud) FailLaunches(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failLaunches = n
}

// FailBoots makes the next n instances launched fail to boot: they go from pending to gone
// when their boot delay is over, and no host starts.
func (c *Cloud) FailBoots(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failBoots = n
}

// SetBootDelay sets how long instances launched from now on stay pending before their host
// starts (the host's own start, a fraction of a second, comes on top).
func (c *Cloud) SetBootDelay(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bootDelay = d
}

// Throttle makes the next n API calls, whatever they are, answer Throttled (429) with
// Retry-After: retryAfter, rounded up to whole seconds. Calls with a wrong API key are
// refused before they count.
func (c *Cloud) Throttle(n int, retryAfter time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.throttles = n
	c.throttleAfter = retryAfter
}

// SetQuota sets the most instances that may be pending or running at once; launches beyond
// it answer QuotaExceeded (403). 0 is no limit. Instances already running stay.
func (c *Cloud) SetQuota(max int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.quota = max
}

// Stop stops a pending or running instance as its owner would from the console: its host
// stops (a boot under way never starts it), and the cloud keeps the instance, stopped and
// without an address, until it is terminated. It returns once the host is down.
func (c *Cloud) Stop(id string) error {
	c.mu.Lock()
	v := c.vms[id]
	if v == nil || v.Vanished || (v.State != Pending && v.State != Running) || c.closed {
		c.mu.Unlock()
		return fmt.Errorf("vmcloud: no pending or running instance %s to stop", id)
	}
	v.State, v.Address, v.HostKey = Stopped, "", nil
	h := v.host
	v.host = nil
	v.cancelBoot()
	c.notify()
	c.work.Add(1)
	c.mu.Unlock()
	defer c.work.Done()

	<-v.booted // a boot under way stops its own host
	c.logf("vmcloud: %s stopped", id)
	if h != nil {
		return h.Close()
	}
	return nil
}

// Vanish makes an instance disappear as if the cloud had lost it: its host stops, the API
// answers NotFound for it and lists it no more. Only Instances still shows it, Vanished.
func (c *Cloud) Vanish(id string) error {
	_, ok, err := c.end(id, "vanished", true)
	if !ok {
		return fmt.Errorf("vmcloud: no instance %s to vanish", id)
	}
	return err
}

// --- Introspection ---

// Instances returns every instance ever launched, gone and vanished ones included, in launch
// order.
func (c *Cloud) Instances() []Instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snapshotAll()
}

func (c *Cloud) snapshotAll() []Instance {
	out := make([]Instance, len(c.order))
	for i, v := range c.order {
		out[i] = v.snapshot()
	}
	return out
}

// Instance returns one instance, gone and vanished ones included.
func (c *Cloud) Instance(id string) (Instance, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.vms[id]
	if v == nil {
		return Instance{}, false
	}
	return v.snapshot(), true
}

// Host returns the host of a running instance, for tests that want to run commands on it,
// cut its network or read its sshd log; nil when the instance is not running.
func (c *Cloud) Host(id string) *sshhosts.Host {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := c.vms[id]; v != nil {
		return v.host
	}
	return nil
}

// LaunchCount is how many instances have been created: idempotent repeats and refused
// launches do not count.
func (c *Cloud) LaunchCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.launches
}

// WaitFor waits until instance id is in state and returns it. It fails at once when the
// instance is unknown or went gone while another state was awaited, and when ctx ends.
func (c *Cloud) WaitFor(ctx context.Context, id string, state State) (Instance, error) {
	var inst Instance
	err := c.Wait(ctx, func(all []Instance) (bool, error) {
		i := slices.IndexFunc(all, func(inst Instance) bool { return inst.ID == id })
		if i < 0 {
			return false, fmt.Errorf("vmcloud: no instance %s", id)
		}
		inst = all[i]
		switch {
		case inst.State == state:
			return true, nil
		case inst.State == Gone:
			return false, fmt.Errorf("vmcloud: %s is gone (%s), not %s", id, inst.Reason, state)
		}
		return false, nil
	})
	return inst, err
}

// Wait calls cond with every instance (as Instances returns them) now and after each change,
// until it says done or fails, or ctx ends.
func (c *Cloud) Wait(ctx context.Context, cond func([]Instance) (done bool, err error)) error {
	for {
		c.mu.Lock()
		all := c.snapshotAll()
		changed := c.changed
		c.mu.Unlock()
		done, err := cond(all)
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vmcloud: waiting: %w; instances: %s", ctx.Err(), describe(all))
		case <-changed:
		}
	}
}

func describe(all []Instance) string {
	parts := make([]string, len(all))
	for i, inst := range all {
		parts[i] = fmt.Sprintf("%s %s", inst.ID, inst.State)
		if inst.Reason != "" {
			parts[i] += " (" + inst.Reason + ")"
		}
	}
	return fmt.Sprint(parts)
}

// list returns the instances the API shows that carry every tag. The caller holds mu.
func (c *Cloud) list(tags map[string]string) []Instance {
	var out []Instance
	for _, v := range c.order {
		if v.State == Gone || v.Vanished {
			continue
		}
		if !hasTags(v.Tags, tags) {
			continue
		}
		out = append(out, v.snapshot())
	}
	return out
}

func hasTags(have, want map[string]string) bool {
	for k, val := range want {
		if got, ok := have[k]; !ok || got != val {
			return false
		}
	}
	return true
}
