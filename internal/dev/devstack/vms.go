package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	// The controller StartController runs serves platforms of type local-vm from the VM
	// cloud; the production berth does not register that provider, the stack does.
	"github.com/berth-ci/berth/internal/config"
	_ "github.com/berth-ci/berth/internal/dev/localvm"
	"github.com/berth-ci/berth/internal/dev/testground/ec2fake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// VMCloudSecret holds the local VM cloud's API key (key api-key), as an operator stores a
// cloud credential for berth.
const VMCloudSecret = "local-vm-credentials"

// The providers a dev-stack platform can be served through. Both launch the local VM
// cloud's machines: local-vm through its own API, aws through the EC2 API stand-in and the
// AWS SDK, as berth runs against EC2.
const (
	ProviderLocalVM = "local-vm"
	ProviderAWS     = "aws"
)

// The EC2 stand-in's account, as an operator configures berth for EC2.
const (
	AWSSecret      = "aws-credentials" // keys access-key-id, secret-access-key
	AWSAccessKeyID = "AKIADEVSTACKBERTH001"
	AWSRegion      = "us-east-1"
	AWSKeyPair     = "berth-dev" // the key pair whose key the machines accept (the hosts' admin key)
	AWSImage       = "ami-0bea7000000000001"
	AWSType        = "m6g.large"
	AWSAdminUser   = "ec2-user" // the user berth's aws provider logs in as
)

// Sample dynamic platforms of the dev stack, served by the local VM cloud.
const (
	DynamicPlatform = "linux/arm64"   // a VM per task
	PoolPlatform    = "linux/ppc64le" // pooled VMs, two tasks each
)

// startVMCloud starts the local VM cloud in this process (so that stopping or killing the
// controller never stops the cloud) and gives berth its API key. Its VMs accept the hosts'
// admin key, which berth reads from the AdminKeySecret.
func (s *Stack) startVMCloud(ctx context.Context, logs io.Writer) error {
	key := make([]byte, 16)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	apiKey := hex.EncodeToString(key)
	// Its VMs also let in the default user of the EC2 images berth launches through the EC2
	// stand-in, which reaches root through sudo.
	opts := vmcloud.Options{Admin: s.Fleet.AdminSigner, APIKey: apiKey, DefaultUser: AWSAdminUser}
	if logs != nil {
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(logs, "vm cloud: "+format+"\n", args...) }
	}
	cloud, err := vmcloud.New(opts)
	if err != nil {
		return fmt.Errorf("local VM cloud: %w", err)
	}
	s.VMCloud = cloud
	s.Supervisor.Watch(Component{Name: VMCloudComponent, Done: cloud.Done(), Exit: cloud.Err})

	secretKey := make([]byte, 20)
	if _, err := rand.Read(secretKey); err != nil {
		return err
	}
	ec2 := ec2fake.Options{Machines: cloud, AccessKeyID: AWSAccessKeyID, SecretAccessKey: hex.EncodeToString(secretKey),
		Region: AWSRegion, KeyPairs: []string{AWSKeyPair}, Images: []string{AWSImage}}
	if logs != nil {
		ec2.Logf = func(format string, args ...any) { fmt.Fprintf(logs, "ec2: "+format+"\n", args...) }
	}
	if s.EC2, err = ec2fake.New(ec2); err != nil {
		return fmt.Errorf("EC2 stand-in: %w", err)
	}
	s.Supervisor.Watch(Component{Name: EC2Component, Done: s.EC2.Done(), Exit: s.EC2.Err})
	for name, data := range map[string]map[string][]byte{
		VMCloudSecret: {"api-key": []byte(apiKey)},
		AWSSecret:     {"access-key-id": []byte(ec2.AccessKeyID), "secret-access-key": []byte(ec2.SecretAccessKey)},
	} {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace}, Data: data}
		if err := s.ControlPlane.Client.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating secret %s/%s: %w", Namespace, name, err)
		}
	}
	return nil
}

// DynamicSettings configure one platform served from the local VM cloud.
type DynamicSettings struct {
	// Provider is ProviderLocalVM (the default) or ProviderAWS.
	Provider     string
	MaxInstances int
	// Concurrency > 0 makes it a dynamic-pool platform with that many tasks per VM.
	Concurrency int
	// MaxAgeMinutes is the pool's max-age (or, with MinIdle, the warm VMs' on a dynamic one).
	MaxAgeMinutes int
	MinIdle       int
	// CheckIntervalSeconds and AllocationTimeoutSeconds default to 1 and 120.
	CheckIntervalSeconds, AllocationTimeoutSeconds int
	// Settings override or add provider keys (dynamic.<platform>.<key>).
	Settings map[string]string
}

// AddDynamicPlatform adds platform to data as a dynamic (or, with Concurrency, dynamic-pool)
// platform of type local-vm on the stack's VM cloud.
func (s *Stack) AddDynamicPlatform(data map[string]string, platform string, d DynamicSettings) {
	list := "dynamic-platforms"
	if d.Concurrency > 0 {
		list = "dynamic-pool-platforms"
	}
	if data[list] != "" {
		data[list] += ","
	}
	data[list] += platform
	label := config.Platform(platform).Label()
	set := func(field string, v any) { data["dynamic."+label+"."+field] = fmt.Sprint(v) }
	switch d.Provider {
	case ProviderAWS:
		set("type", ProviderAWS)
		set("endpoint", s.EC2.URL())
		set("region", AWSRegion)
		set("ami", AWSImage)
		set("instance-type", AWSType)
		set("key-name", AWSKeyPair)
		set("aws-secret", AWSSecret)
	default:
		set("type", ProviderLocalVM)
		set("endpoint", s.VMCloud.URL())
		set("secret", VMCloudSecret)
	}
	for k, v := range d.Settings {
		set(k, v)
	}
	set("ssh-secret", AdminKeySecret)
	set("max-instances", d.MaxInstances)
	set("check-interval", orDefault(d.CheckIntervalSeconds, 1))
	set("allocation-timeout", orDefault(d.AllocationTimeoutSeconds, 120))
	if d.Concurrency > 0 {
		set("concurrency", d.Concurrency)
		set("max-age", orDefault(d.MaxAgeMinutes, 30))
	} else if d.MaxAgeMinutes > 0 {
		set("max-age", d.MaxAgeMinutes)
	}
	if d.MinIdle > 0 {
		set("min-idle", d.MinIdle)
	}
}

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}
