//go:build linux

package ibmp

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/ibmiam"
	"github.com/berth-ci/berth/internal/dev/testground/iamfake"
	"github.com/berth-ci/berth/internal/dev/testground/powerfake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

const (
	apiKey     = "test-api-key-0123456789"
	secretName = "ibm-api-key"
	userData   = "#cloud-config\nruncmd:\n  - echo hello\n"
	// token is what berth's launches use: the record's uid and the attempt.
	token = "0f8c6a0e-1b2c-4d3e-9f00-123456789abc-0"
)

// rig is one workspace (stand-in over a hostless VM cloud), its IAM and a provider for it.
type rig struct {
	t        *testing.T
	machines *vmcloud.Cloud
	iam      *iamfake.Server
	api      *powerfake.Server
	values   map[string]string

	mu      sync.Mutex
	secrets map[string]map[string][]byte
	waits   []time.Duration
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, secrets: map[string]map[string][]byte{secretName: {ibmiam.APIKeyKey: []byte(apiKey)}}}
	r.machines = vmcloud.NewForTest(t, vmcloud.Options{APIKey: "unused", Hostless: true})
	r.iam = iamfake.NewForTest(t, apiKey)
	r.api = powerfake.NewForTest(t, powerfake.Options{
		Machines: r.machines,
		IAM:      r.iam,
		Networks: []powerfake.Network{
			{ID: "5a2b9c1e-0000-4000-8000-000000000001", Name: "berth-net"},
			{ID: "5a2b9c1e-0000-4000-8000-000000000003", Name: "public-net", External: true},
		},
		Images: []powerfake.Resource{{ID: "7d1e2f3a-0000-4000-8000-000000000002", Name: "rhel9-base"}},
		Keys:   []string{"berth-key"},
	})
	// Runs before the cloud closes (cleanups run last first).
	t.Cleanup(r.nothingLeftRunning)
	r.values = map[string]string{
		"url":       r.api.URL(),
		"iam-url":   r.iam.URL(),
		"crn":       r.api.CRN(),
		"network":   "berth-net",
		"system":    "e980",
		"key":       "berth-key",
		"image":     "rhel9-base",
		"cores":     "0.5",
		"memory":    "8",
		"disk":      "200",
		"user-data": userData,
		"secret":    secretName,
	}
	return r
}

func (r *rig) provider() *Provider {
	r.t.Helper()
	p, err := New(cloud.Settings{Platform: "linux-ppc64le", Values: r.values, Secret: r.secret})
	if err != nil {
		r.t.Fatal(err)
	}
	pp := p.(*Provider)
	pp.backoff = time.Millisecond
	// Record the waits the provider asks for instead of sleeping through them.
	pp.sleep = func(ctx context.Context, d time.Duration) error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.waits = append(r.waits, d)
		return ctx.Err()
	}
	return pp
}

func (r *rig) secret(_ context.Context, name string) (map[string][]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	data, ok := r.secrets[name]
	if !ok {
		return nil, fmt.Errorf("secret %s: %w", name, cloud.ErrNoSecret)
	}
	return data, nil
}

func (r *rig) setSecret(data map[string][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if data == nil {
		delete(r.secrets, secretName)
		return
	}
	r.secrets[secretName] = data
}

func (r *rig) nothingLeftRunning() {
	for _, inst := range r.machines.Instances() {
		if inst.State != vmcloud.Gone {
			r.t.Errorf("instance %s (%s) is still %s at the end of the test", inst.ID, inst.Name, inst.State)
		}
	}
}

func tags(installation, platform string) map[string]string {
	return map[string]string{cloud.TagInstallation: installation, cloud.TagPlatform: platform, cloud.TagRecord: "vm-1"}
}

// waitRunning polls Get until the instance runs.
func waitRunning(t *testing.T, p *Provider, id string) cloud.Instance {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		inst, err := p.Get(context.Background(), id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if inst.State == cloud.StateRunning {
			return inst
		}
		if time.Now().After(deadline) {
			t.Fatalf("instance %s is still %s", id, inst.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantKind(t *testing.T, err error, kind cloud.Kind) {
	t.Helper()
	if err == nil || cloud.KindOf(err) != kind {
		t.Fatalf("got error %v, want one of kind %s", err, kind)
	}
}

func TestNewRefusesBadKeysNamingThem(t *testing.T) {
	good := map[string]string{
		"url": "https://us-east.power-iaas.cloud.ibm.com", "network": "net", "key": "k", "image": "img", "secret": "s",
		"crn": "crn:v1:bluemix:public:power-iaas:wdc06:a/5cb0704ee6304413bd0b171372c0fd77:4e9dc638-7a78-4e7c-b432-e83b7010c531::",
	}
	secret := func(context.Context, string) (map[string][]byte, error) { return nil, nil }
	if _, err := New(cloud.Settings{Platform: "p", Values: good, Secret: secret}); err != nil {
		t.Fatalf("a real config's keys: %v", err)
	}
	for _, tc := range []struct{ key, value string }{
		{"url", ""},
		{"url", "us-east.power-iaas.cloud.ibm.com"},
		{"url", "https://us-east.power-iaas.cloud.ibm.com/pcloud"},
		{"iam-url", "iam.cloud.ibm.com"},
		{"crn", ""},
		{"crn", "crn:v1:bluemix:public:is:us-south:a/5cb0704ee6304413bd0b171372c0fd77::vpc:r006-1"},
		{"crn", "crn:v1:bluemix:public:power-iaas:wdc06:a/5cb0704ee6304413bd0b171372c0fd77:::"},
		{"crn", "4e9dc638-7a78-4e7c-b432-e83b7010c531"},
		{"network", ""},
		{"network", " , "},
		{"image", ""},
		{"key", ""},
		{"secret", ""},
		{"system", "E980!"},
		{"cores", "0.3"},
		{"cores", "two"},
		{"memory", "0"},
		{"memory", "7.5"},
		{"disk", "-1"},
	} {
		values := map[string]string{}
		for k, v := range good {
			values[k] = v
		}
		values[tc.key] = tc.value
		_, err := New(cloud.Settings{Platform: "p", Values: values, Secret: secret})
		if cloud.KindOf(err) != cloud.BadConfig || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%s=%q: got %v, want a bad configuration naming %s", tc.key, tc.value, err, tc.key)
		}
	}
}

func TestEveryKeyReachesTheWire(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Name: "vm-1", Tags: tags("inst-a", "linux/ppc64le")})
	if err != nil {
		t.Fatal(err)
	}
	creates := r.api.Creates()
	if len(creates) != 1 {
		t.Fatalf("%d creates, want 1", len(creates))
	}
	c := creates[0]
	ud, _ := base64.StdEncoding.DecodeString(c.UserData)
	for _, check := range []struct {
		key       string
		got, want any
	}{
		{"image", *c.ImageID, "rhel9-base"},
		{"cores", *c.Processors, 0.5},
		{"memory", *c.Memory, 8.0},
		{"network", *c.Networks[0].NetworkID, "berth-net"},
		{"key", c.KeyPairName, "berth-key"},
		{"system", c.SysType, "e980"},
		{"user-data", string(ud), userData},
		{"(procType)", *c.ProcType, "shared"},
		{"(name)", *c.ServerName, instanceName(tags("inst-a", "linux/ppc64le"), token)},
	} {
		if check.got != check.want {
			t.Errorf("%s: the create asked for %v, want %v", check.key, check.got, check.want)
		}
	}
	if len(*c.ServerName) > maxNameLen {
		t.Errorf("name %s is longer than Power VS takes", *c.ServerName)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestLaunchIsIdempotentOnTheToken(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	req := cloud.LaunchRequest{Token: token, Name: "vm-1", Tags: tags("inst-a", "linux/ppc64le")}
	first, err := p.Launch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if first.Token != token || first.ID == "" {
		t.Errorf("launched %+v, want id and token %s", first, token)
	}
	// berth crashed before it saved the id, or lost the answer: it launches again.
	again, err := p.Launch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != first.ID || r.machines.LaunchCount() != 1 {
		t.Fatalf("second launch gave %s (first %s), %d machines launched, want the same instance and 1", again.ID, first.ID, r.machines.LaunchCount())
	}
	running := waitRunning(t, p, first.ID)
	m, _ := r.machines.Instance(r.api.Instances()[0].VMID)
	if running.Address == "" || running.Address != m.Address || running.Token != token {
		t.Errorf("running instance %+v, want address %s and token %s", running, m.Address, token)
	}
	// A fresh provider (berth restarted) finds it too.
	if again, err := r.provider().Launch(ctx, req); err != nil || again.ID != first.ID {
		t.Fatalf("after a restart: %v, %+v", err, again)
	}
	if err := p.Terminate(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, first.ID); err != nil {
		t.Errorf("terminating twice: %v", err)
	}
	_, err = p.Get(ctx, first.ID)
	wantKind(t, err, cloud.NotFound)
	if r.machines.LaunchCount() != 1 {
		t.Errorf("%d machines launched, want 1", r.machines.LaunchCount())
	}
}

func TestLostCreateAnswerLaunchesOnce(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	// The create is done but its answer is lost (504): the retried create meets a name
	// conflict, and the launch finds the instance by listing again.
	r.api.LoseCreateAnswers(1)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")})
	if err != nil {
		t.Fatal(err)
	}
	if r.machines.LaunchCount() != 1 || len(r.api.Instances()) != 1 || r.api.Instances()[0].ID != inst.ID {
		t.Fatalf("%d machines launched, instances %+v, want 1: %s", r.machines.LaunchCount(), r.api.Instances(), inst.ID)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestServerErrorsAreRetriedThenTransient(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	req := cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")}

	r.api.FailNext(100)
	_, err := p.Launch(ctx, req)
	wantKind(t, err, cloud.Transient)
	if r.machines.LaunchCount() != 0 {
		t.Fatalf("a failing API launched %d machines", r.machines.LaunchCount())
	}

	r.api.FailNext(2)
	inst, err := p.Launch(ctx, req)
	if err != nil {
		t.Fatalf("two 500s should be retried away: %v", err)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestThrottlingHonoursRetryAfter(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()

	r.api.Throttle(2, 2*time.Second)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")})
	if err != nil {
		t.Fatalf("two short throttles should be waited out: %v", err)
	}
	r.mu.Lock()
	waits := r.waits
	r.waits = nil
	r.mu.Unlock()
	if len(waits) != 2 || waits[0] != 2*time.Second || waits[1] != 2*time.Second {
		t.Errorf("waited %v, want the 2s Retry-After twice", waits)
	}

	// A long Retry-After goes back to berth, which honours it.
	r.api.Throttle(1, time.Minute)
	_, err = p.Get(ctx, inst.ID)
	wantKind(t, err, cloud.Throttled)
	if cloud.RetryAfterOf(err) != time.Minute {
		t.Errorf("retry after %v, want 1m", cloud.RetryAfterOf(err))
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestCapacityAndQuota(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	tg := tags("inst-a", "linux/ppc64le")

	r.machines.FailLaunches(1)
	_, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tg})
	wantKind(t, err, cloud.Capacity)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tg})
	if err != nil {
		t.Fatalf("once capacity is back: %v", err)
	}

	r.machines.SetQuota(1)
	_, err = p.Launch(ctx, cloud.LaunchRequest{Token: "1f8c6a0e-1b2c-4d3e-9f00-123456789abc-0", Tags: tg})
	wantKind(t, err, cloud.Quota)
	if r.machines.LaunchCount() != 1 {
		t.Errorf("%d machines launched, want 1", r.machines.LaunchCount())
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestStuckPendingIsTerminated(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	r.machines.SetBootDelay(time.Hour)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, inst.ID)
	if err != nil || got.State != cloud.StatePending || got.Address != "" {
		t.Fatalf("a booting instance: %+v, %v; want pending without an address", got, err)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	_, err = p.Get(ctx, inst.ID)
	wantKind(t, err, cloud.NotFound)
}

func TestDeletedBehindBerthsBack(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	tg := tags("inst-a", "linux/ppc64le")
	deleted, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	vanished, err := p.Launch(ctx, cloud.LaunchRequest{Token: "1f8c6a0e-1b2c-4d3e-9f00-123456789abc-0", Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	waitRunning(t, p, deleted.ID)
	waitRunning(t, p, vanished.ID)

	if err := r.api.Delete(deleted.ID); err != nil {
		t.Fatal(err)
	}
	for _, inst := range r.api.Instances() {
		if inst.ID == vanished.ID {
			if err := r.machines.Vanish(inst.VMID); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, id := range []string{deleted.ID, vanished.ID} {
		_, err := p.Get(ctx, id)
		wantKind(t, err, cloud.NotFound)
		if err := p.Terminate(ctx, id); err != nil {
			t.Errorf("terminating a lost instance: %v", err)
		}
	}
	list, err := p.List(ctx, tg)
	if err != nil || len(list) != 0 {
		t.Fatalf("list: %+v, %v; want nothing", list, err)
	}
}

func TestFailedBootIsGoneAndDeleted(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	r.machines.FailBoots(1)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := p.Get(ctx, inst.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == cloud.StateGone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a failed boot is still %s", got.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Power VS keeps (and bills) an instance in ERROR: the provider deleted it.
	if left := r.api.Instances(); len(left) != 0 {
		t.Errorf("instances left in the workspace: %+v", left)
	}
}

func TestAuthFailures(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	req := cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")}
	noSecret := func(err error, mentions ...string) {
		t.Helper()
		wantKind(t, err, cloud.Auth)
		for _, m := range mentions {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%v does not name %s", err, m)
			}
		}
		if strings.Contains(err.Error(), apiKey) || strings.Contains(err.Error(), "other-key") {
			t.Errorf("%v shows the API key", err)
		}
	}

	r.setSecret(nil)
	_, err := p.Launch(ctx, req)
	noSecret(err, secretName)

	r.setSecret(map[string][]byte{"apikey": []byte(apiKey)})
	_, err = p.Launch(ctx, req)
	noSecret(err, secretName, ibmiam.APIKeyKey)

	// A key IAM does not know.
	r.setSecret(map[string][]byte{ibmiam.APIKeyKey: []byte("other-key")})
	_, err = p.Launch(ctx, req)
	noSecret(err, secretName, ibmiam.APIKeyKey)

	// The right key again: the provider takes the Secret's new value.
	r.setSecret(map[string][]byte{ibmiam.APIKeyKey: []byte(apiKey)})
	inst, err := p.Launch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}

	// The account's keys and tokens are revoked: Power VS refuses the token berth holds.
	r.iam.RevokeAll()
	_, err = p.Get(ctx, inst.ID)
	noSecret(err, secretName)
	_, err = p.List(ctx, req.Tags)
	noSecret(err)
	err = p.Terminate(ctx, inst.ID)
	noSecret(err)
	if r.machines.LaunchCount() != 1 {
		t.Errorf("%d machines launched, want 1", r.machines.LaunchCount())
	}
	// Clean up behind the revoked key.
	if err := r.api.Delete(inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestListFindsEachGroupByName(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	a, b := tags("inst-a", "linux/ppc64le"), tags("inst-b", "linux/ppc64le")
	launched := map[string]string{} // id → installation
	for i, tg := range []map[string]string{a, a, b} {
		tok := strings.Replace(token, "0f8c", "0f8"+string(rune('a'+i)), 1)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: tok, Tags: tg})
		if err != nil {
			t.Fatal(err)
		}
		launched[inst.ID] = tg[cloud.TagInstallation]
	}
	for _, tg := range []map[string]string{a, b} {
		list, err := p.List(ctx, tg)
		if err != nil {
			t.Fatal(err)
		}
		want := 2
		if tg[cloud.TagInstallation] == "inst-b" {
			want = 1
		}
		if len(list) != want {
			t.Fatalf("%s: listed %d, want %d", tg[cloud.TagInstallation], len(list), want)
		}
		for _, inst := range list {
			if launched[inst.ID] != tg[cloud.TagInstallation] || inst.Tags[cloud.TagInstallation] != tg[cloud.TagInstallation] || inst.Token == "" {
				t.Errorf("%s listed %+v", tg[cloud.TagInstallation], inst)
			}
		}
	}
	for id := range launched {
		if err := p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := p.List(ctx, a); err != nil || len(list) != 0 {
		t.Errorf("after terminating: %+v, %v", list, err)
	}
}

func TestNamesGiveTheTokenBack(t *testing.T) {
	tg := tags("inst-a", "linux/ppc64le")
	for _, tok := range []string{token, "0f8c6a0e-1b2c-4d3e-9f00-123456789abc-9999"} {
		name := instanceName(tg, tok)
		if len(name) > maxNameLen || !strings.HasPrefix(name, groupPrefix(tg)) || tokenOf(name) != tok {
			t.Errorf("token %s: name %s gives back %q", tok, name, tokenOf(name))
		}
	}
	// Other tokens are hashed: the name fits, and does not pretend to know the token.
	name := instanceName(tg, strings.Repeat("Some-Other-Token/", 10))
	if len(name) > maxNameLen || tokenOf(name) != "" || instanceName(tg, "x") == instanceName(tg, "y") {
		t.Errorf("hashed name %s", name)
	}
}

// waitFor polls until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// workspaceInstance is the stand-in's view of instance id.
func (r *rig) workspaceInstance(id string) powerfake.Instance {
	r.t.Helper()
	for _, inst := range r.api.Instances() {
		if inst.ID == id {
			return inst
		}
	}
	r.t.Fatalf("the workspace has no instance %s", id)
	return powerfake.Instance{}
}

func (r *rig) machineRunning(id string) bool {
	m, ok := r.machines.Instance(r.workspaceInstance(id).VMID)
	return ok && m.State == vmcloud.Running
}

func TestDiskIsGrownBeforeTheVMRuns(t *testing.T) {
	r := newRig(t) // disk 200; the image's boot volume is 100 GB
	p := r.provider()
	ctx := context.Background()
	// The resize stays under way until released.
	r.api.HoldResizes(true)
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the resize", func() bool {
		got, err := p.Get(ctx, inst.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != cloud.StatePending || got.Address != "" {
			t.Fatalf("before its disk is grown the VM is %s at %q, want pending without an address", got.State, got.Address)
		}
		return len(r.api.Resizes()) > 0
	})
	// Up, with a 100 GB disk being grown: still pending, for this provider and for one
	// started after a crash, and neither asks for a second resize.
	for _, prov := range []*Provider{p, r.provider()} {
		got, err := prov.Get(ctx, inst.ID)
		if err != nil || got.State != cloud.StatePending || got.Address != "" {
			t.Fatalf("while the resize is under way: %+v, %v; want pending without an address", got, err)
		}
	}
	r.api.HoldResizes(false)
	running := waitRunning(t, p, inst.ID)
	if running.Address == "" {
		t.Errorf("running without an address: %+v", running)
	}
	ws := r.workspaceInstance(inst.ID)
	resizes := r.api.Resizes()
	if ws.BootSize != 200 || len(resizes) != 1 || resizes[0] != (powerfake.Resize{VolumeID: ws.BootVolumeID, InstanceID: inst.ID, From: 100, To: 200}) {
		t.Fatalf("boot volume %v GB after resizes %+v; want one resize of %s from 100 to 200", ws.BootSize, resizes, ws.BootVolumeID)
	}
	// Later looks, and a restarted provider's, leave the grown volume alone.
	if got, err := r.provider().Get(ctx, inst.ID); err != nil || got.State != cloud.StateRunning {
		t.Fatalf("after a restart: %+v, %v", got, err)
	}
	if list, err := p.List(ctx, tags("inst-a", "linux/ppc64le")); err != nil || len(list) != 1 || list[0].State != cloud.StateRunning {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if n := len(r.api.Resizes()); n != 1 {
		t.Errorf("%d resizes, want 1", n)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if r.machines.LaunchCount() != 1 {
		t.Errorf("%d machines launched, want 1", r.machines.LaunchCount())
	}
}

func TestNoResizeUnlessTheDiskIsLarger(t *testing.T) {
	for _, disk := range []string{"", "50", "100"} {
		t.Run("disk="+disk, func(t *testing.T) {
			r := newRig(t)
			r.values["disk"] = disk
			p := r.provider()
			ctx := context.Background()
			inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")})
			if err != nil {
				t.Fatal(err)
			}
			waitRunning(t, p, inst.ID)
			if resizes := r.api.Resizes(); len(resizes) != 0 || r.workspaceInstance(inst.ID).BootSize != 100 {
				t.Errorf("resizes %+v; want none, and the image's 100 GB", resizes)
			}
			if err := p.Terminate(ctx, inst.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestResizeFailuresAreRetried(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	tg := tags("inst-a", "linux/ppc64le")

	// Two 500s are retried inline.
	r.api.FailResizes(2)
	retried, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	waitRunning(t, p, retried.ID)

	// A resize that went through but whose answer was lost: the retry is refused as not
	// growing the volume, and that is no failure.
	lost, err := p.Launch(ctx, cloud.LaunchRequest{Token: "1f8c6a0e-1b2c-4d3e-9f00-123456789abc-0", Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the instance to be up", func() bool { return r.machineRunning(lost.ID) })
	r.api.LoseResizeAnswers(1)
	if got, err := p.Get(ctx, lost.ID); err != nil || got.State != cloud.StatePending {
		t.Fatalf("after a lost resize answer: %+v, %v; want pending", got, err)
	}
	waitRunning(t, p, lost.ID)

	// A resize that keeps failing goes back to berth as transient, and the VM is not
	// handed out; once the API recovers the disk is grown.
	failing, err := p.Launch(ctx, cloud.LaunchRequest{Token: "2f8c6a0e-1b2c-4d3e-9f00-123456789abc-0", Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the instance to be up", func() bool { return r.machineRunning(failing.ID) })
	r.api.FailResizes(100)
	_, err = p.Get(ctx, failing.ID)
	wantKind(t, err, cloud.Transient)
	r.api.FailResizes(0)
	waitRunning(t, p, failing.ID)

	for _, id := range []string{retried.ID, lost.ID, failing.ID} {
		if size := r.workspaceInstance(id).BootSize; size != 200 {
			t.Errorf("instance %s has a %v GB boot volume, want 200", id, size)
		}
		if err := p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(r.api.Resizes()); n != 3 {
		t.Errorf("%d resizes, want one per instance: %+v", n, r.api.Resizes())
	}
	if r.machines.LaunchCount() != 3 {
		t.Errorf("%d machines launched, want 3", r.machines.LaunchCount())
	}
}

func TestAddressIsTheExternalIPOnAPublicNetwork(t *testing.T) {
	r := newRig(t)
	r.values["network"] = "public-net, berth-net"
	p := r.provider()
	ctx := context.Background()
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tags("inst-a", "linux/ppc64le")})
	if err != nil {
		t.Fatal(err)
	}
	running := waitRunning(t, p, inst.ID)
	ws := r.workspaceInstance(inst.ID)
	m, _ := r.machines.Instance(ws.VMID)
	public := ws.Networks[0]
	if public.NetworkName != "public-net" || public.ExternalIP != m.Address || public.IPAddress == "" || public.IPAddress == m.Address {
		t.Fatalf("the stand-in shows %+v for a machine at %s: want it as the externalIP, and another ipAddress", public, m.Address)
	}
	// docs/clouds/ibmp.md: the externalIP on the first network, not the ipAddress there.
	if running.Address != public.ExternalIP {
		t.Errorf("address %s, want the external IP %s (not the internal %s)", running.Address, public.ExternalIP, public.IPAddress)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
}

func TestShutoffIsStoppedListedAndDeleted(t *testing.T) {
	r := newRig(t)
	p := r.provider()
	ctx := context.Background()
	tg := tags("inst-a", "linux/ppc64le")
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: token, Tags: tg})
	if err != nil {
		t.Fatal(err)
	}
	waitRunning(t, p, inst.ID)

	// Stopped from the console: Power VS keeps it, SHUTOFF, and bills it until it is deleted.
	if err := r.api.Shutoff(inst.ID); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, inst.ID)
	if err != nil || got.State != cloud.StateStopped || got.Address != "" {
		t.Fatalf("a shut-off instance: %+v, %v; want stopped, without an address", got, err)
	}
	list, err := p.List(ctx, tg)
	if err != nil || len(list) != 1 || list[0].ID != inst.ID || list[0].State != cloud.StateStopped {
		t.Fatalf("list: %+v, %v; want the stopped instance, so that the sweeper finds it", list, err)
	}
	if left := r.api.Instances(); len(left) != 1 {
		t.Fatalf("instances in the workspace: %+v; a look must not delete it behind its record", left)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	// Deleted: nothing is left in the workspace, and no machine runs.
	if left := r.api.Instances(); len(left) != 0 {
		t.Errorf("instances left in the workspace: %+v", left)
	}
	_, err = p.Get(ctx, inst.ID)
	wantKind(t, err, cloud.NotFound)
}
