// Package awsec2 is the provider for platforms of type aws: VMs in Amazon EC2, launched,
// watched and terminated through the AWS SDK for Go v2 with the credentials in the Secret the
// platform's aws-secret names.
//
// Addresses: berth reaches a VM at its public DNS name, else its public IP address, else its
// private IP address (a controller inside the VPC), as the multi-platform controller does.
// With strict-public-address: true the private address is never used: a running VM without a
// public address yet has no address, and berth waits for one.
package awsec2

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
)

func init() { cloud.Register("aws", New) }

const (
	// adminUser is who the RHEL, Fedora and macOS AMIs let in with the launch key pair;
	// upstream logs in as the same user on every Linux and macOS platform.
	adminUser = "ec2-user"
	// windowsAdminUser is the administrator account of EC2's Windows AMIs; the Windows
	// user-data production renders gives it the launch key pair's key
	// (administrators_authorized_keys, from the instance metadata).
	windowsAdminUser = "Administrator"

	callTimeout = 30 * time.Second
	// maxAttempts is how often the SDK tries a call that failed with a 5xx, a network error
	// or throttling before the failure reaches berth, whose own backoff takes over then.
	maxAttempts = 5
	// pageSize is how many instances one DescribeInstances page of List holds.
	pageSize = 1000
	// newInstanceGrace is how long EC2 may not know an instance it just launched: its API
	// is eventually consistent, and a DescribeInstances right after RunInstances can answer
	// InvalidInstanceID.NotFound.
	newInstanceGrace = 5 * time.Minute
)

// Provider launches EC2 instances for one platform.
type Provider struct {
	platform string
	settings launchSettings
	api      operations
	creds    *aws.CredentialsCache
	pageSize int32

	mu sync.Mutex
	// launched remembers when this provider launched the instances it launched lately, to
	// tell "not known yet" from "gone" while EC2 catches up.
	launched map[string]time.Time
}

// operations are the EC2 calls berth makes, as method values of the SDK's client; the
// provider holds these and never the client. The client has over 800 operations, and a type
// that can be reached from an interface value (the provider is a cloud.Provider) keeps every
// exported method in the binary, since dependencies berth must link look methods up by name
// (reflect's MethodByName), which stops the linker from dropping them. Method values leave
// the client's type unreachable that way, and the binary keeps the three operations below,
// not the 800 with their middleware stacks: with the VPC provider's alike, 40% less code in it
// and fewer of its pages in memory (docs/memory.md#where-the-peak-is-made). cmd/berth's
// TestTheBinaryLinksOnlyTheCloudCallsBerthMakes holds this.
type operations struct {
	RunInstances       func(context.Context, *ec2.RunInstancesInput, ...func(*ec2.Options)) (*ec2.RunInstancesOutput, error)
	TerminateInstances func(context.Context, *ec2.TerminateInstancesInput, ...func(*ec2.Options)) (*ec2.TerminateInstancesOutput, error)
	DescribeInstances  describeInstances
}

func operationsOf(c *ec2.Client) operations {
	return operations{RunInstances: c.RunInstances, TerminateInstances: c.TerminateInstances, DescribeInstances: c.DescribeInstances}
}

// describeInstances is DescribeInstances as the paginator takes it (ec2.DescribeInstancesAPIClient).
type describeInstances func(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)

func (f describeInstances) DescribeInstances(ctx context.Context, in *ec2.DescribeInstancesInput, opts ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error) {
	return f(ctx, in, opts...)
}

// tuning is what tests change: the SDK's backoff between retries, and List's page size.
type tuning struct {
	backoff  retry.BackoffDelayer
	pageSize int32
}

// New builds a provider from the platform's keys; an error of kind BadConfig names the key
// that is missing or malformed.
func New(s cloud.Settings) (cloud.Provider, error) { return newProvider(s, tuning{}) }

func newProvider(s cloud.Settings, t tuning) (*Provider, error) {
	settings, err := parseSettings(s.Platform, s.Values)
	if err != nil {
		return nil, err
	}
	if s.Secret == nil {
		return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s: no way to read Secrets was given", s.Platform)
	}
	creds := aws.NewCredentialsCache(secretCredentials{name: settings.secret, read: s.Secret})
	opts := ec2.Options{
		Region:      settings.region,
		Credentials: creds,
		HTTPClient:  awshttp.NewBuildableClient().WithTimeout(callTimeout),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = maxAttempts
			// Retrying a launch the cloud has no room for at once only spends the retry
			// budget; berth's backoff waits longer.
			o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(noRetryOfCapacity)}, o.Retryables...)
			if t.backoff != nil {
				o.Backoff = t.backoff
			}
		}),
	}
	if settings.endpoint != "" {
		opts.BaseEndpoint = aws.String(settings.endpoint)
	}
	if t.pageSize == 0 {
		t.pageSize = pageSize
	}
	return &Provider{
		platform: s.Platform,
		settings: settings,
		api:      operationsOf(ec2.New(opts)),
		creds:    creds,
		pageSize: t.pageSize,
		launched: map[string]time.Time{},
	}, nil
}

var _ cloud.Provider = (*Provider)(nil)

// Launch runs one instance with the request's token as EC2's client token, so a repeat
// returns the first instance, whatever became of it, and never starts a second.
func (p *Provider) Launch(ctx context.Context, req cloud.LaunchRequest) (cloud.Instance, error) {
	if req.Token == "" || len(req.Token) > 64 || !isPrintableASCII(req.Token) {
		return cloud.Instance{}, cloud.Errorf(cloud.BadConfig, "launch", "launch token %q is not 1 to 64 printable ASCII characters, as EC2's client token must be", req.Token)
	}
	if req.Fallback < 0 || req.Fallback >= len(p.settings.types()) {
		return cloud.Instance{}, cloud.Errorf(cloud.BadConfig, "launch", "platform %s has no instance type number %d (it has %v)", p.platform, req.Fallback, p.settings.types())
	}
	var out *ec2.RunInstancesOutput
	err := p.call(ctx, func() (err error) {
		out, err = p.api.RunInstances(ctx, p.settings.runInput(req))
		return err
	})
	if code(err) == "IdempotentParameterMismatch" {
		// The token launched before with other settings (the config changed between a crash
		// and this retry): the instance it launched is the answer.
		return p.byToken(ctx, req.Token)
	}
	if err != nil {
		return cloud.Instance{}, p.failure("launch", err)
	}
	if len(out.Instances) != 1 {
		return cloud.Instance{}, cloud.Errorf(cloud.Transient, "launch", "EC2 answered RunInstances with %d instances, not 1", len(out.Instances))
	}
	inst := p.toInstance(out.Instances[0])
	p.remember(inst.ID)
	return inst, nil
}

// byToken finds the instance a client token launched. When EC2 has forgotten it (terminated
// long ago) the answer is a gone instance without an id: berth then launches anew under a
// new token.
func (p *Provider) byToken(ctx context.Context, token string) (cloud.Instance, error) {
	insts, err := p.describe(ctx, &ec2.DescribeInstancesInput{
		Filters: []types.Filter{{Name: aws.String("client-token"), Values: []string{token}}},
	})
	if err != nil {
		return cloud.Instance{}, p.failure("launch", err)
	}
	if len(insts) == 0 {
		return cloud.Instance{Token: token, State: cloud.StateGone}, nil
	}
	return insts[0], nil
}

func (p *Provider) Get(ctx context.Context, id string) (cloud.Instance, error) {
	if id == "" {
		return cloud.Instance{}, cloud.Errorf(cloud.NotFound, "get", "no instance id")
	}
	insts, err := p.describe(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err == nil && len(insts) == 0 {
		err = cloud.Errorf(cloud.NotFound, "get", "EC2 does not know instance %s", id)
	}
	switch {
	case err == nil:
		return insts[0], nil
	case p.isNotFound(err) && p.recent(id):
		return cloud.Instance{ID: id, State: cloud.StatePending}, nil
	}
	return cloud.Instance{}, p.failure("get", err)
}

// List returns the instances that carry every tag and are not terminated or on their way
// there: pending, running, and stopping or stopped ones, which EC2 keeps (and bills, with
// their volumes) until someone terminates them.
func (p *Provider) List(ctx context.Context, tags map[string]string) ([]cloud.Instance, error) {
	in := &ec2.DescribeInstancesInput{
		Filters: []types.Filter{{Name: aws.String("instance-state-name"), Values: []string{
			string(types.InstanceStateNamePending), string(types.InstanceStateNameRunning),
			string(types.InstanceStateNameStopping), string(types.InstanceStateNameStopped)}}},
		MaxResults: aws.Int32(p.pageSize),
	}
	for _, k := range sortedKeys(tags) {
		in.Filters = append(in.Filters, types.Filter{Name: aws.String("tag:" + k), Values: []string{tags[k]}})
	}
	insts, err := p.describe(ctx, in)
	if err != nil {
		return nil, p.failure("list", err)
	}
	out := slices.DeleteFunc(insts, func(i cloud.Instance) bool { return i.State == cloud.StateGone })
	return out, nil
}

func (p *Provider) Terminate(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	err := p.call(ctx, func() error {
		_, err := p.api.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}})
		return err
	})
	switch {
	case err == nil:
		return nil
	case p.isNotFound(err) && p.recent(id):
		// Not known yet is not gone: EC2 will know it in a moment, and it must not run on.
		return cloud.Errorf(cloud.Transient, "terminate", "EC2 does not know instance %s yet, a moment after its launch", id)
	case p.isNotFound(err):
		return nil // gone long ago, or never known: either way it runs no more
	}
	return p.failure("terminate", err)
}

// InstanceTypes are the configured instance type and the platform's fallback-instance-types.
func (p *Provider) InstanceTypes() []string { return p.settings.types() }

// macHostMinimum is how long EC2 allocates a dedicated host for Mac instances at the least,
// and bills it: "Dedicated Hosts for EC2 Mac instances have a minimum allocation period of
// 24 hours" (Amazon EC2 User Guide, "Amazon EC2 Mac instances").
const macHostMinimum = 24 * time.Hour

// MinimumLife is 24 hours for EC2 Mac instance types (mac1.metal, mac2.metal, mac2-m2.metal,
// mac-m4.metal, ...), which run only on dedicated hosts; 0 for the others. "" is the
// platform's instance-type.
func (p *Provider) MinimumLife(instanceType string) time.Duration {
	if family, _, _ := strings.Cut(cmp.Or(instanceType, p.settings.instanceType), "."); strings.HasPrefix(family, "mac") {
		return macHostMinimum
	}
	return 0
}

// AdminUser is who berth logs in as: Administrator on a Windows platform (windows/*, and
// sized variants such as windows-4xlarge/amd64), else ec2-user.
func (p *Provider) AdminUser() string {
	if config.Platform(p.platform).OS() == "windows" {
		return windowsAdminUser
	}
	return adminUser
}

// describe runs DescribeInstances through every page.
func (p *Provider) describe(ctx context.Context, in *ec2.DescribeInstancesInput) ([]cloud.Instance, error) {
	var out []cloud.Instance
	pages := ec2.NewDescribeInstancesPaginator(p.api.DescribeInstances, in)
	for pages.HasMorePages() {
		var page *ec2.DescribeInstancesOutput
		err := p.call(ctx, func() (err error) {
			page, err = pages.NextPage(ctx)
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, r := range page.Reservations {
			for _, inst := range r.Instances {
				out = append(out, p.toInstance(inst))
			}
		}
	}
	return out, nil
}

// call makes one API call; when EC2 refuses the credentials, it drops the cached ones and
// tries once more with the Secret as it is now, so a rotated key takes effect at once.
func (p *Provider) call(ctx context.Context, do func() error) error {
	err := do()
	if isAuthCode(code(err)) {
		p.creds.Invalidate()
		err = do()
	}
	return err
}

func (p *Provider) toInstance(in types.Instance) cloud.Instance {
	inst := cloud.Instance{
		ID:    aws.ToString(in.InstanceId),
		Token: aws.ToString(in.ClientToken),
		State: cloud.StateGone,
		Tags:  map[string]string{},
	}
	if in.LaunchTime != nil {
		inst.LaunchedAt = *in.LaunchTime
	}
	for _, t := range in.Tags {
		inst.Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	if in.State != nil {
		switch in.State.Name {
		case types.InstanceStateNamePending:
			inst.State = cloud.StatePending
		case types.InstanceStateNameRunning:
			inst.State = cloud.StateRunning
			inst.Address = p.address(in)
		case types.InstanceStateNameStopping, types.InstanceStateNameStopped:
			inst.State = cloud.StateStopped
		}
	}
	return inst
}

// address is where berth reaches a running instance (see the package comment).
func (p *Provider) address(in types.Instance) string {
	for _, a := range []*string{in.PublicDnsName, in.PublicIpAddress} {
		if aws.ToString(a) != "" {
			return *a
		}
	}
	if p.settings.strictPublicAddress {
		return ""
	}
	return aws.ToString(in.PrivateIpAddress)
}

func (p *Provider) remember(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	maps.DeleteFunc(p.launched, func(_ string, at time.Time) bool { return now.Sub(at) > newInstanceGrace })
	p.launched[id] = now
}

func (p *Provider) recent(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.launched[id]
	return ok && time.Since(at) < newInstanceGrace
}

func (p *Provider) isNotFound(err error) bool {
	var ce *cloud.Error
	if errors.As(err, &ce) {
		return ce.Kind == cloud.NotFound
	}
	return kindOfCode(code(err), 0) == cloud.NotFound
}

func isPrintableASCII(s string) bool {
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
