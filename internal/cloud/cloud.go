// Package cloud is the boundary between berth and the clouds it launches VMs in: one small
// Provider interface, typed errors that say what berth should do about a failure, and a
// registry where each provider package adds itself by one line. It is plain Go; providers
// are adapters over their cloud's own SDK or HTTP API.
package cloud

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// State is where an instance is in its life.
type State string

const (
	StatePending State = "pending" // launched, not running yet
	StateRunning State = "running" // running; Address is set once the cloud knows it
	StateGone    State = "gone"    // terminated or terminating: it will never serve a task
	// StateStopped: stopped or stopping (IBM: stopped, Power VS: SHUTOFF), by someone in the
	// console, another tool, or the cloud itself. It serves no task, yet the cloud keeps it
	// and its volumes, and bills them, until it is terminated: berth terminates it.
	StateStopped State = "stopped"
)

// Instance is a VM as its cloud reports it.
type Instance struct {
	ID string
	// Token is the launch token the instance was created with (see LaunchRequest.Token).
	Token      string
	State      State
	Address    string
	Tags       map[string]string
	LaunchedAt time.Time
}

// LaunchRequest asks for one VM.
type LaunchRequest struct {
	// Token makes the launch idempotent: a second Launch with the same token returns the
	// instance the first one made instead of making another. berth saves it in the VM's
	// record before calling Launch, so a crash between the two never launches twice.
	Token string
	// Name is a readable name for the instance, unique per token.
	Name string
	// Tags are put on the instance; List finds instances by them.
	Tags map[string]string
	// Fallback picks the instance type of a provider with InstanceTypes: 0 the configured one,
	// i the i-th fallback. Providers without them take only 0.
	Fallback int
}

// Tags berth puts on every instance it launches. The installation tag is what the sweeper
// lists by: several clusters often share one cloud account and one instance-tag, and a tag
// that only says "berth" would let one cluster's berth terminate another's VMs. List is
// always asked for TagInstallation and TagPlatform together; a cloud whose instances carry
// no tags keeps those two in the instance's name instead (see GroupKey).
const (
	TagInstallation = "berth.dev/installation"
	TagPlatform     = "berth.dev/platform"
	TagRecord       = "berth.dev/record"
	// TagInstanceTag carries the config's instance-tag, for the cloud account's owners.
	TagInstanceTag = "berth.dev/instance-tag"
)

// GroupKey is a short name-safe key (8 lowercase hex digits) of the installation and
// platform in tags, for clouds that cannot tag instances and find them by name instead.
func GroupKey(tags map[string]string) string {
	sum := sha256.Sum256([]byte(tags[TagInstallation] + "\x00" + tags[TagPlatform]))
	return hex.EncodeToString(sum[:4])
}

// Provider launches and ends VMs of one platform in one cloud account.
type Provider interface {
	// Launch starts a VM, or returns the one already started with req.Token.
	Launch(ctx context.Context, req LaunchRequest) (Instance, error)
	// Get reports one instance; an error of kind NotFound once the cloud has forgotten it.
	Get(ctx context.Context, id string) (Instance, error)
	// List returns every instance not yet gone (stopped ones included) carrying all of the
	// tags.
	List(ctx context.Context, tags map[string]string) ([]Instance, error)
	// Terminate ends an instance; one that is already gone is a success.
	Terminate(ctx context.Context, id string) error
	// AdminUser is the user berth logs in as, with the platform's ssh-secret, to create
	// build users.
	AdminUser() string
}

// InstanceTyper is implemented by providers whose platforms may list fallback instance types:
// other types to launch, in order, when the ones before have no capacity.
type InstanceTyper interface {
	// InstanceTypes are the types a launch may ask for (LaunchRequest.Fallback indexes them):
	// the configured type first, then its fallbacks.
	InstanceTypes() []string
}

// InstanceTypes is p's InstanceTypes, or nil for a provider without them.
func InstanceTypes(p Provider) []string {
	if t, ok := p.(InstanceTyper); ok {
		return t.InstanceTypes()
	}
	return nil
}

// MinimumLifer is implemented by providers whose VMs hold hardware the account pays for a
// minimum time from its allocation (EC2 Mac instances run on dedicated hosts, allocated for at
// least 24 hours). Ending such a VM early to launch another pays for a second allocation and
// waits for another long boot: berth's max-age retires no VM younger than MinimumLife.
type MinimumLifer interface {
	// MinimumLife is that time for a VM of instanceType; "" is the platform's own type (a
	// VM's type differs from it only when it was launched with a fallback type).
	MinimumLife(instanceType string) time.Duration
}

// MinimumLife is p's MinimumLife for instanceType, or 0 for a provider without one.
func MinimumLife(p Provider, instanceType string) time.Duration {
	if m, ok := p.(MinimumLifer); ok {
		return m.MinimumLife(instanceType)
	}
	return 0
}

// Kind says what berth should do about a failed call.
type Kind int

const (
	// Transient failures (network, 5xx) are retried.
	Transient Kind = iota
	// Capacity: the cloud has no such VM to give now; retried with backoff, and tasks that
	// waited longer than the platform's allocation timeout get an error.
	Capacity
	// Throttled: the API refused to answer so fast; retried after RetryAfter.
	Throttled
	// Quota: the account may not run more; like Capacity, but an operator must act.
	Quota
	// NotFound: no such instance (Terminate treats it as done).
	NotFound
	// BadConfig: the request can never succeed as configured (bad image, bad type).
	BadConfig
	// Auth: the credentials are missing, malformed or refused.
	Auth
)

func (k Kind) String() string {
	return [...]string{"transient", "insufficient capacity", "throttled", "quota exceeded", "not found", "bad configuration", "authentication failed"}[k]
}

// Permanent kinds cannot be cured by retrying: the platform's waiting tasks get an error at once.
func (k Kind) Permanent() bool { return k == BadConfig || k == Auth }

// Error is a provider failure of a known kind.
type Error struct {
	Kind Kind
	// Op is the call that failed (launch, get, list, terminate).
	Op string
	// RetryAfter is how long the cloud asked berth to wait, if it said.
	RetryAfter time.Duration
	Err        error
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s: %v", e.Op, e.Kind, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// Errorf makes an Error.
func Errorf(kind Kind, op, format string, args ...any) *Error {
	return &Error{Kind: kind, Op: op, Err: fmt.Errorf(format, args...)}
}

// BadKey is a factory's refusal of one of a platform's keys: an error of kind BadConfig whose
// text names the platform and the key ("platform linux/arm64: throughput: ..."), and which
// tells config which key it is about (ConfigKey) and why (Reason), so that the problem is
// reported on that key without reading the text back.
func BadKey(platform, key, format string, args ...any) *Error {
	return &Error{Kind: BadConfig, Op: "setup", Err: &keyError{platform: platform, key: key, reason: fmt.Sprintf(format, args...)}}
}

type keyError struct{ platform, key, reason string }

func (e *keyError) Error() string {
	return "platform " + e.platform + ": " + e.key + ": " + e.reason
}

// ConfigKey is the key refused.
func (e *keyError) ConfigKey() string { return e.key }

// Reason is what is wrong with the key's value.
func (e *keyError) Reason() string { return e.reason }

// KindOf returns the kind of err; Transient for errors that carry none.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Transient
}

// RetryAfterOf returns how long the cloud asked berth to wait before the next call, or 0.
func RetryAfterOf(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// Settings are what a provider is built from: the platform's provider keys from the config
// (region, ami, endpoint, ...) and a way to read the Secrets they name.
type Settings struct {
	Platform string
	Values   map[string]string
	// Secret reads a Secret of the controller's namespace on demand; providers never keep
	// credentials longer than a call needs them and never log them.
	Secret SecretReader
}

// Factory builds a provider of one type. It checks the settings, every one it knows, and
// returns BadKey for the first key it refuses (an error of kind BadConfig otherwise, for
// what no one key is to blame for). It must do nothing else: no call to the cloud, no
// read of a Secret, nothing started. Check runs it at every config load, with a SecretReader
// that refuses every read, and drops what it builds.
type Factory func(s Settings) (Provider, error)

var (
	mu        sync.RWMutex
	factories = map[string]Factory{}
)

// Register adds a provider type; a provider package calls it from init.
func Register(typ string, f Factory) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := factories[typ]; dup {
		panic("cloud: provider type " + typ + " registered twice")
	}
	factories[typ] = f
}

// New builds a provider of the given type; an error of kind BadConfig if no such type is
// registered.
func New(typ string, s Settings) (Provider, error) {
	mu.RLock()
	f, ok := factories[typ]
	mu.RUnlock()
	if !ok {
		return nil, Errorf(BadConfig, "setup", "this berth has no provider of type %q (it has %v)", typ, Types())
	}
	return f(s)
}

// Check tells whether a platform's provider keys would build a provider of type typ, without
// credentials, network or a client that is ever used: it runs the type's factory (which only
// checks and keeps its settings, see Factory) with a SecretReader that refuses every read,
// and drops the provider. The error is the factory's, of kind BadConfig, naming the platform
// and the key. A type this berth has no provider of is not an error here: config.Parse
// reports unknown types itself, and a type berth knows but this binary does not link (the
// test ground's local-vm in the production berth) is judged where it is linked. Nor is an
// error of another kind (an Auth error of a factory that tried to read a Secret): it says
// nothing of the settings.
func Check(typ, platform string, values map[string]string) error {
	mu.RLock()
	f, ok := factories[typ]
	mu.RUnlock()
	if !ok {
		return nil
	}
	_, err := f(Settings{Platform: platform, Values: maps.Clone(values), Secret: noSecrets})
	if err != nil && KindOf(err) == BadConfig {
		return err
	}
	return nil
}

// noSecrets is the SecretReader of Check: settings are checked without credentials. A
// factory that read one anyway would get an Auth error, which Check does not report.
func noSecrets(context.Context, string) (map[string][]byte, error) {
	return nil, fmt.Errorf("settings are checked without reading Secrets: %w", ErrSecretForbidden)
}

// Types lists the registered provider types.
func Types() []string {
	mu.RLock()
	defer mu.RUnlock()
	return slices.Sorted(maps.Keys(factories))
}
