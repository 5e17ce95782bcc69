//go:build linux

package ibmz_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/cloudfake"
	"github.com/berth-ci/berth/internal/cloud/ibmz"
	"github.com/berth-ci/berth/internal/dev/testground/iamfake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
	"github.com/berth-ci/berth/internal/dev/testground/vpcfake"
)

const (
	apiKey     = "the-right-ibm-key"
	secretName = "ibm-api-key"
	image      = "r014-23be9e67-4ab2-4dc9-9a51-d56efb06943d"
)

// secrets stands in for the controller's namespace.
type secrets = cloudfake.Secrets

type world struct {
	machines *vmcloud.Cloud
	iam      *iamfake.Server
	vpc      *vpcfake.Server
	secrets  secrets
}

// setup starts a hostless cloud, IAM and the VPC API over them, named as a real config
// names them (a zone in the region key; VPC, subnet and key by name), and checks at the end
// that nothing is left running: no instance the API knows, no machine not gone, no floating
// IP.
func setup(t *testing.T, opts vpcfake.Options) *world {
	t.Helper()
	w := &world{
		machines: vmcloud.NewForTest(t, vmcloud.Options{APIKey: "vmcloud-internal", Hostless: true, Logf: t.Logf}),
		iam:      iamfake.NewForTest(t, apiKey),
		secrets:  secrets{secretName: {"api-key": []byte(apiKey + "\n")}},
	}
	opts.Machines, opts.IAM = w.machines, w.iam
	if opts.Zone == "" {
		opts.Region, opts.Zone = "us-east", "us-east-2"
	}
	if opts.VPC == "" {
		opts.VPC, opts.Subnet, opts.Keys = "us-east-default-vpc", "konflux-ext-prod-1", []string{"konflux-s390x-root"}
		opts.Images, opts.Profiles = []string{image}, []string{"bz2-2x8", "bz2-4x16"}
	}
	w.vpc = vpcfake.NewForTest(t, opts)
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		if in := w.vpc.Instances(); len(in) > 0 {
			t.Errorf("instances left in the VPC: %+v", in)
		}
		if f := w.vpc.FloatingIPs(); len(f) > 0 {
			t.Errorf("floating IPs left: %+v", f)
		}
		for _, m := range w.machines.Instances() {
			if m.State != vmcloud.Gone {
				t.Errorf("machine %s left %s", m.ID, m.State)
			}
		}
	})
	return w
}

func (w *world) values(extra map[string]string) map[string]string {
	v := map[string]string{
		"region": "us-east-2", "url": w.vpc.URL(), "iam-url": w.iam.URL(),
		"vpc": "us-east-default-vpc", "subnet": "konflux-ext-prod-1", "key": "konflux-s390x-root",
		"image-id": image, "profile": "bz2-4x16", "secret": secretName, "private-ip": "true",
	}
	for k, val := range extra {
		v[k] = val
	}
	return v
}

func (w *world) provider(t *testing.T, extra map[string]string) cloud.Provider {
	t.Helper()
	p, err := cloud.New("ibmz", cloud.Settings{Platform: "linux-s390x", Values: w.values(extra), Secret: w.secrets.Read})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func tags(installation string) map[string]string {
	return map[string]string{cloud.TagInstallation: installation, cloud.TagPlatform: "linux/s390x", cloud.TagRecord: "rec"}
}

func wantKind(t *testing.T, what string, err error, kind cloud.Kind) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %s", what, kind)
	}
	if got := cloud.KindOf(err); got != kind {
		t.Fatalf("%s: kind %s (%v), want %s", what, got, err, kind)
	}
}

// waitRunning polls Get until the instance runs with an address.
func waitRunning(t *testing.T, ctx context.Context, p cloud.Provider, id string) cloud.Instance {
	t.Helper()
	for {
		inst, err := p.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if inst.State == cloud.StateRunning && inst.Address != "" {
			return inst
		}
		if inst.State == cloud.StateGone {
			t.Fatalf("instance %s went gone while booting", id)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("instance %s never ran: %+v", id, inst)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func machineAddress(t *testing.T, w *world, vpcID string) string {
	t.Helper()
	for _, in := range w.vpc.Instances() {
		if in.ID == vpcID {
			m, _ := w.machines.Instance(in.MachineID)
			return m.Address
		}
	}
	t.Fatalf("no instance %s in the VPC", vpcID)
	return ""
}

func TestLaunchIsIdempotentAndEveryKeyReachesTheWire(t *testing.T) {
	w := setup(t, vpcfake.Options{})
	p := w.provider(t, map[string]string{"disk": "200"})
	ctx := testContext(t)
	tg := tags("cluster-a")
	token := "0f8e2c1a-7b3d-4e5f-9a6b-1c2d3e4f5a6b-1"

	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Name: "rec", Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	if inst.ID == "" || inst.Token != token || inst.State == cloud.StateGone || inst.LaunchedAt.IsZero() {
		t.Fatalf("launched %+v", inst)
	}
	again, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Name: "rec", Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != inst.ID || w.machines.LaunchCount() != 1 {
		t.Fatalf("second launch gave %s (first %s), %d machines launched", again.ID, inst.ID, w.machines.LaunchCount())
	}

	all := w.vpc.Instances()
	if len(all) != 1 {
		t.Fatalf("instances: %+v", all)
	}
	got := all[0]
	want := vpcfake.Instance{Name: ibmz.InstanceName(tg, token), VPC: "us-east-default-vpc", Zone: "us-east-2", Profile: "bz2-4x16",
		Image: image, Subnet: "konflux-ext-prod-1", BootVolumeGB: 200, BootVolumeProfile: "general-purpose"}
	if got.Name != want.Name || got.VPC != want.VPC || got.Zone != want.Zone || got.Profile != want.Profile || got.Image != want.Image ||
		got.Subnet != want.Subnet || got.BootVolumeGB != want.BootVolumeGB || got.BootVolumeProfile != want.BootVolumeProfile ||
		len(got.Keys) != 1 || got.Keys[0] != "konflux-s390x-root" || got.ResourceGroup == "" {
		t.Fatalf("the VPC got %+v, want %+v with key konflux-s390x-root in the VPC's resource group", got, want)
	}
	if !strings.HasSuffix(got.Name, "-"+token) {
		t.Fatalf("name %s does not carry the token", got.Name)
	}

	running := waitRunning(t, ctx, p, inst.ID)
	if running.Address != machineAddress(t, w, inst.ID) {
		t.Fatalf("private address %s, the machine is at %s", running.Address, machineAddress(t, w, inst.ID))
	}
	if len(w.vpc.FloatingIPs()) != 0 {
		t.Fatalf("private-ip platform got floating IPs: %+v", w.vpc.FloatingIPs())
	}
	if p.AdminUser() != "root" {
		t.Fatalf("admin user %q", p.AdminUser())
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatalf("second terminate: %v", err)
	}
	_, err = p.Get(ctx, inst.ID)
	wantKind(t, "get after terminate", err, cloud.NotFound)
}

func TestDefaultsAndTheRegionKey(t *testing.T) {
	// A region key that names a region (not a zone) launches in the subnet's zone, and no
	// disk key gives the 100 GiB boot volume the upstream controller asked for.
	w := setup(t, vpcfake.Options{})
	p := w.provider(t, map[string]string{"region": "us-east"})
	ctx := testContext(t)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "tok-1", Tags: tags("a")})
	if err != nil {
		t.Fatal(err)
	}
	if got := w.vpc.Instances()[0]; got.Zone != "us-east-2" || got.BootVolumeGB != 100 {
		t.Fatalf("launched %+v", got)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestCrashAfterCreateGivesTheSameInstance(t *testing.T) {
	w := setup(t, vpcfake.Options{})
	ctx := testContext(t)
	token := "aaaa-2"
	// The first controller created the instance and died before saving its id; a new
	// provider (a restarted controller) launches with the same token.
	first, err := w.provider(t, nil).Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("a")})
	if err != nil {
		t.Fatal(err)
	}
	p := w.provider(t, nil)
	second, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("a")})
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != first.ID || w.machines.LaunchCount() != 1 {
		t.Fatalf("relaunch gave %s, first %s; %d launched", second.ID, first.ID, w.machines.LaunchCount())
	}
	// A token that is no valid name end is hashed; the launch is as idempotent.
	odd := "Token_With.Odd/Chars"
	a, err := p.Launch(ctx, cloud.LaunchRequest{Token: odd, Tags: tags("a")})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Launch(ctx, cloud.LaunchRequest{Token: odd, Tags: tags("a")})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != b.ID || w.machines.LaunchCount() != 2 || a.Token != "" {
		t.Fatalf("odd token: %+v then %+v, %d launched", a, b, w.machines.LaunchCount())
	}
	for _, id := range []string{first.ID, a.ID} {
		if err := p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFloatingIPLivesAndDiesWithTheInstance(t *testing.T) {
	w := setup(t, vpcfake.Options{})
	p := w.provider(t, map[string]string{"private-ip": "false"})
	ctx := testContext(t)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "pub-1", Tags: tags("a")})
	if err != nil {
		t.Fatal(err)
	}
	fips := w.vpc.FloatingIPs()
	if len(fips) != 1 || fips[0].Name != ibmz.InstanceName(tags("a"), "pub-1") || fips[0].Target == "" {
		t.Fatalf("floating IPs: %+v", fips)
	}
	// A repeated launch reuses it.
	if _, err := p.Launch(ctx, cloud.LaunchRequest{Token: "pub-1", Tags: tags("a")}); err != nil {
		t.Fatal(err)
	}
	if n := len(w.vpc.FloatingIPs()); n != 1 {
		t.Fatalf("%d floating IPs after a repeated launch", n)
	}
	running := waitRunning(t, ctx, p, inst.ID)
	if running.Address != machineAddress(t, w, inst.ID) {
		t.Fatalf("public address %s, the machine is at %s", running.Address, machineAddress(t, w, inst.ID))
	}
	if priv := w.vpc.Instances()[0].PrimaryIP; priv == running.Address {
		t.Fatalf("the private address is the reachable one: %s", priv)
	}
	listed, err := p.List(ctx, tags("a"))
	if err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || listed[0].Address != running.Address {
		t.Fatalf("listed %+v", listed)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestListByTagsAcrossInstallations(t *testing.T) {
	w := setup(t, vpcfake.Options{PageLimit: 2})
	p := w.provider(t, nil)
	ctx := testContext(t)
	var ids []string
	for _, l := range []struct{ inst, tok string }{{"a", "a-1"}, {"a", "a-2"}, {"a", "a-3"}, {"b", "b-1"}} {
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: l.tok, Tags: tags(l.inst)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, inst.ID)
	}
	a, err := p.List(ctx, tags("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.List(ctx, tags("b"))
	if err != nil {
		t.Fatal(err)
	}
	tokens := func(in []cloud.Instance) string {
		var out []string
		for _, i := range in {
			out = append(out, i.Token)
		}
		return strings.Join(out, ",")
	}
	if tokens(a) != "a-1,a-2,a-3" || tokens(b) != "b-1" {
		t.Fatalf("installation a lists %q, b lists %q", tokens(a), tokens(b))
	}
	for _, id := range ids {
		if err := p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFaults(t *testing.T) {
	t.Run("5xx recovered", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, nil)
		ctx := testContext(t)
		w.vpc.Fail(2)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("5xx persistent", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, nil)
		ctx := testContext(t)
		w.vpc.Fail(1000)
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		wantKind(t, "launch", err, cloud.Transient)
		if w.machines.LaunchCount() != 0 {
			t.Fatal("launched through a failing API")
		}
		w.vpc.Fail(0)
	})
	t.Run("429 honoured", func(t *testing.T) {
		// The stand-in throttles every call made before the Retry-After is over: only a
		// client that waits gets through.
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, nil)
		ctx := testContext(t)
		w.vpc.Throttle(1, time.Second)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("429 long", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, nil)
		ctx := testContext(t)
		w.vpc.Throttle(1, time.Minute)
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		wantKind(t, "launch", err, cloud.Throttled)
		if cloud.RetryAfterOf(err) != time.Minute {
			t.Fatalf("retry after %s, want 1m", cloud.RetryAfterOf(err))
		}
	})
	t.Run("capacity", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, map[string]string{"private-ip": "false"})
		ctx := testContext(t)
		w.vpc.FailLaunches(1)
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		wantKind(t, "launch", err, cloud.Capacity)
		// The failed instance is cleared away; the retry gets a running one.
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		if err != nil {
			t.Fatal(err)
		}
		waitRunning(t, ctx, p, inst.ID)
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("quota", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, nil)
		ctx := testContext(t)
		w.vpc.SetQuota(1)
		first, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Launch(ctx, cloud.LaunchRequest{Token: "t-2", Tags: tags("a")})
		wantKind(t, "launch over quota", err, cloud.Quota)
		if err := p.Terminate(ctx, first.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("stuck pending", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, map[string]string{"private-ip": "false"})
		ctx := testContext(t)
		w.vpc.SetBootDelay(time.Hour)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Get(ctx, inst.ID)
		if err != nil || got.State != cloud.StatePending || got.Address != "" {
			t.Fatalf("stuck instance: %+v, %v", got, err)
		}
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("deleted behind berth's back", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, map[string]string{"private-ip": "false"})
		ctx := testContext(t)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.vpc.DeleteInstance(inst.ID); err != nil {
			t.Fatal(err)
		}
		_, err = p.Get(ctx, inst.ID)
		wantKind(t, "get", err, cloud.NotFound)
		listed, err := p.List(ctx, tags("a"))
		if err != nil || len(listed) != 0 {
			t.Fatalf("list after the console deleted it: %+v, %v", listed, err)
		}
		// That List reclaimed the floating IP the console left unbound.
		if f := w.vpc.FloatingIPs(); len(f) != 0 {
			t.Fatalf("floating IPs left: %+v", f)
		}
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatalf("terminate of a deleted instance: %v", err)
		}
	})
	t.Run("auth failure", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, nil)
		ctx := testContext(t)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		if err != nil {
			t.Fatal(err)
		}
		w.vpc.RevokeCredentials()
		_, err = p.Get(ctx, inst.ID)
		wantKind(t, "get with a revoked token", err, cloud.Auth)
		// A fresh provider must ask IAM, which refuses the key now.
		_, err = w.provider(t, nil).Get(ctx, inst.ID)
		wantKind(t, "get with a revoked key", err, cloud.Auth)
		if strings.Contains(err.Error(), apiKey) {
			t.Fatalf("the error quotes the key: %v", err)
		}
		if err := w.vpc.DeleteInstance(inst.ID); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("IAM down", func(t *testing.T) {
		w := setup(t, vpcfake.Options{})
		p := w.provider(t, nil)
		ctx := testContext(t)
		w.iam.Fail(1)
		_, err := p.List(ctx, tags("a"))
		wantKind(t, "list", err, cloud.Transient)
	})
}

func TestCredentials(t *testing.T) {
	w := setup(t, vpcfake.Options{})
	ctx := testContext(t)
	for _, c := range []struct {
		name    string
		secrets secrets
		want    string
	}{
		{"no Secret", secrets{}, "Secret " + secretName},
		{"no key", secrets{secretName: {"apikey": []byte(apiKey)}}, "no key api-key"},
		{"empty key", secrets{secretName: {"api-key": []byte(" \n")}}, "no key api-key"},
		{"wrong key", secrets{secretName: {"api-key": []byte("not-the-key")}}, "refused the API key in key api-key of Secret " + secretName},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := cloud.New("ibmz", cloud.Settings{Platform: "linux-s390x", Values: w.values(nil), Secret: c.secrets.Read})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
			wantKind(t, "launch", err, cloud.Auth)
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "not-the-key") {
				t.Fatalf("error %q does not say %q (or quotes the key)", err, c.want)
			}
		})
	}
	// A rotated key takes effect at the next call.
	s := secrets{secretName: {"api-key": []byte("not-the-key")}}
	p, err := cloud.New("ibmz", cloud.Settings{Platform: "linux-s390x", Values: w.values(nil), Secret: s.Read})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.List(ctx, tags("a"))
	wantKind(t, "list with the old key", err, cloud.Auth)
	s[secretName]["api-key"] = []byte(apiKey)
	if _, err := p.List(ctx, tags("a")); err != nil {
		t.Fatalf("list after rotation: %v", err)
	}
}

func TestSetup(t *testing.T) {
	w := setup(t, vpcfake.Options{})
	ctx := testContext(t)
	for _, k := range []string{"region", "vpc", "subnet", "key", "image-id", "profile", "secret"} {
		v := w.values(map[string]string{k: ""})
		_, err := cloud.New("ibmz", cloud.Settings{Platform: "linux-s390x", Values: v, Secret: w.secrets.Read})
		wantKind(t, "without "+k, err, cloud.BadConfig)
		if !strings.Contains(err.Error(), k) {
			t.Fatalf("error %q does not name %s", err, k)
		}
	}
	for k, v := range map[string]string{"private-ip": "maybe", "disk": "5000", "url": "ftp://x", "iam-url": "::"} {
		_, err := cloud.New("ibmz", cloud.Settings{Platform: "linux-s390x", Values: w.values(map[string]string{k: v}), Secret: w.secrets.Read})
		wantKind(t, k+"="+v, err, cloud.BadConfig)
	}
	_, err := cloud.New("ibmz", cloud.Settings{Platform: "linux-s390x", Values: w.values(map[string]string{"url": "", "region": "mars-north-1"}), Secret: w.secrets.Read})
	wantKind(t, "unknown region without url", err, cloud.BadConfig)

	// Names the account does not have, and values the API refuses, are BadConfig.
	for k, v := range map[string]string{"vpc": "nope", "subnet": "nope", "key": "nope", "image-id": "r014-nope", "profile": "bx9-1x1", "region": "us-east-3"} {
		p := w.provider(t, map[string]string{k: v})
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "t-1", Tags: tags("a")})
		wantKind(t, "launch with "+k+"="+v, err, cloud.BadConfig)
	}
	_, err = w.provider(t, nil).Launch(ctx, cloud.LaunchRequest{Tags: tags("a")})
	wantKind(t, "launch without a token", err, cloud.BadConfig)
	if w.machines.LaunchCount() != 0 {
		t.Fatalf("%d launched from bad settings", w.machines.LaunchCount())
	}
}

// TestAStoppedInstanceIsReportedStoppedListedAndDeleted: the VPC keeps a stopped instance,
// with its floating IP, and bills them until it is deleted. Get says stopped (berth then ends
// it), List finds it (so the sweeper does too), and Terminate leaves nothing in the account.
func TestAStoppedInstanceIsReportedStoppedListedAndDeleted(t *testing.T) {
	w := setup(t, vpcfake.Options{})
	p := w.provider(t, map[string]string{"private-ip": "false"})
	ctx := testContext(t)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "stop-1", Tags: tags("a")})
	if err != nil {
		t.Fatal(err)
	}
	waitRunning(t, ctx, p, inst.ID)
	if err := w.vpc.StopInstance(inst.ID); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, inst.ID)
	if err != nil || got.State != cloud.StateStopped || got.Address != "" {
		t.Fatalf("get: %+v, %v; want stopped, without an address", got, err)
	}
	listed, err := p.List(ctx, tags("a"))
	if err != nil || len(listed) != 1 || listed[0].ID != inst.ID || listed[0].State != cloud.StateStopped {
		t.Fatalf("list: %+v, %v; want the stopped instance", listed, err)
	}
	if n := len(w.vpc.Instances()); n != 1 {
		t.Fatalf("List deleted the stopped instance (%d left): its record's owner must end it", n)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if left := w.vpc.Instances(); len(left) != 0 {
		t.Errorf("instances left in the account: %+v", left)
	}
	if left := w.vpc.FloatingIPs(); len(left) != 0 {
		t.Errorf("floating IPs left in the account: %+v", left)
	}
	for _, m := range w.machines.Instances() {
		if m.State != vmcloud.Gone {
			t.Errorf("machine %s is %s at the end", m.ID, m.State)
		}
	}
}
