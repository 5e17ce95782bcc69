//go:build linux

package awsec2

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/cloudfake"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/ec2fake"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

const (
	accessKeyID     = "AKIAIOSFODNN7EXAMPLE"
	secretAccessKey = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
	secretName      = "aws-account"
	keyPair         = "konflux-prod-int-mab01"
	image           = "ami-03d6a5256a46c9feb"
	privateSubnet   = "subnet-0aa719a6c5b602b16"
	publicSubnet    = "subnet-0bb719a6c5b602b17"
)

// secrets stands in for the controller's namespace.
type secrets = cloudfake.Secrets

func goodSecrets() secrets {
	return secrets{secretName: {"access-key-id": []byte(accessKeyID), "secret-access-key": []byte(secretAccessKey + "\n")}}
}

func startEC2(t *testing.T) *ec2fake.Server {
	return ec2fake.NewForTest(t, ec2fake.Options{
		AccessKeyID:     accessKeyID,
		SecretAccessKey: secretAccessKey,
		Region:          "us-east-1",
		KeyPairs:        []string{keyPair},
		Images:          []string{image},
		Subnets:         []ec2fake.Subnet{{ID: privateSubnet}, {ID: publicSubnet, MapPublicIPOnLaunch: true}},
		Logf:            t.Logf,
	})
}

// values are a platform's keys as the real configs write them.
func values(endpoint string) map[string]string {
	return map[string]string{
		"region":            "us-east-1",
		"ami":               image,
		"instance-type":     "m6g.large",
		"key-name":          keyPair,
		"aws-secret":        secretName,
		"security-group-id": "sg-0903aedd465be979e",
		"subnet-id":         privateSubnet,
		"endpoint":          endpoint,
	}
}

func newTestProvider(t *testing.T, v map[string]string, s secrets) *Provider {
	t.Helper()
	p, err := newProvider(cloud.Settings{Platform: "linux/arm64", Values: v, Secret: s.Read}, tuning{
		backoff:  retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return time.Millisecond, nil }),
		pageSize: 5,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func setup(t *testing.T) (*ec2fake.Server, *Provider) {
	srv := startEC2(t)
	return srv, newTestProvider(t, values(srv.URL()), goodSecrets())
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// noneLeft checks what a user would: nothing runs on, and no launch went twice.
func noneLeft(t *testing.T, srv *ec2fake.Server, launches int) {
	t.Helper()
	for _, m := range srv.Machines().Instances() {
		if m.State != vmcloud.Gone {
			t.Errorf("machine %s (%s) is %s at the end", m.ID, m.Token, m.State)
		}
	}
	if n := srv.Machines().LaunchCount(); n != launches {
		t.Errorf("LaunchCount %d, want %d", n, launches)
	}
}

func wantKind(t *testing.T, what string, err error, kind cloud.Kind, mention ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %s", what, kind)
	}
	if got := cloud.KindOf(err); got != kind {
		t.Fatalf("%s: kind %s (%v), want %s", what, got, err, kind)
	}
	for _, m := range mention {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("%s: %q does not mention %s", what, err, m)
		}
	}
	if strings.Contains(err.Error(), secretAccessKey) {
		t.Errorf("%s: the error shows the secret access key: %q", what, err)
	}
}

func lastCall(t *testing.T, srv *ec2fake.Server, action string) ec2fake.Call {
	t.Helper()
	calls := srv.Calls(action)
	if len(calls) == 0 {
		t.Fatalf("no %s call reached EC2", action)
	}
	return calls[len(calls)-1]
}

func ids(insts []cloud.Instance) []string {
	out := []string{}
	for _, i := range insts {
		out = append(out, i.ID)
	}
	slices.Sort(out)
	return out
}

func TestEveryKeyReachesRunInstances(t *testing.T) {
	srv := startEC2(t)
	ctx := testContext(t)
	userData := "Content-Type: multipart/mixed; boundary=\"//\"\nMIME-Version: 1.0\n\n--//\n#cloud-config\n"
	v := values(srv.URL())
	maps.Copy(v, map[string]string{
		"security-group":            "launch-wizard-1",
		"instance-profile-name":     "otelcol-for-mpc-runner",
		"instance-profile-arn":      "arn:aws:iam::418272753558:instance-profile/otelcol-for-mpc-runner",
		"strict-public-address":     "true",
		"disk":                      "160",
		"iops":                      "16000",
		"throughput":                "1000",
		"user-data":                 userData,
		"tenancy":                   "host",
		"host-resource-group-arn":   "arn:aws:resource-groups:us-east-1:123456789012:group/mac-hosts",
		"license-configuration-arn": "arn:aws:license-manager:us-east-1:123456789012:license-configuration:lic-0123456789abcdef0",
	})
	p := newTestProvider(t, v, goodSecrets())
	tags := map[string]string{cloud.TagInstallation: "inst-a", cloud.TagPlatform: "linux-arm64", "team": "build"}
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "uid-1-0", Name: "linux-arm64-abcde", Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	got := lastCall(t, srv, "RunInstances").Params
	want := map[string]string{
		"ClientToken":                         "uid-1-0",
		"ImageId":                             image,
		"InstanceType":                        "m6g.large",
		"KeyName":                             keyPair,
		"MinCount":                            "1",
		"MaxCount":                            "1",
		"SecurityGroup.1":                     "launch-wizard-1",
		"SecurityGroupId.1":                   "sg-0903aedd465be979e",
		"SubnetId":                            privateSubnet,
		"IamInstanceProfile.Name":             "otelcol-for-mpc-runner",
		"IamInstanceProfile.Arn":              v["instance-profile-arn"],
		"BlockDeviceMapping.1.DeviceName":     "/dev/sda1",
		"BlockDeviceMapping.1.Ebs.VolumeSize": "160",
		"BlockDeviceMapping.1.Ebs.VolumeType": "gp3",
		"BlockDeviceMapping.1.Ebs.Iops":       "16000",
		"BlockDeviceMapping.1.Ebs.Throughput": "1000",
		"BlockDeviceMapping.1.Ebs.DeleteOnTermination": "true",
		"UserData":                       base64.StdEncoding.EncodeToString([]byte(userData)),
		"Placement.Tenancy":              "host",
		"Placement.HostResourceGroupArn": v["host-resource-group-arn"],
		"LicenseSpecification.1.LicenseConfigurationArn": v["license-configuration-arn"],
		"InstanceInitiatedShutdownBehavior":              "terminate",
		"TagSpecification.1.ResourceType":                "instance",
		"TagSpecification.2.ResourceType":                "volume",
	}
	for k, w := range want {
		if g := got.Get(k); g != w {
			t.Errorf("RunInstances %s = %q, want %q", k, g, w)
		}
	}
	for i := 1; i <= 2; i++ {
		prefix := fmt.Sprintf("TagSpecification.%d.Tag.", i)
		sent := map[string]string{}
		for j := 1; got.Has(fmt.Sprintf("%s%d.Key", prefix, j)); j++ {
			sent[got.Get(fmt.Sprintf("%s%d.Key", prefix, j))] = got.Get(fmt.Sprintf("%s%d.Value", prefix, j))
		}
		wantTags := maps.Clone(tags)
		wantTags["Name"] = "linux-arm64-abcde"
		if !maps.Equal(sent, wantTags) {
			t.Errorf("tags of the %s: %v, want %v", got.Get(fmt.Sprintf("TagSpecification.%d.ResourceType", i)), sent, wantTags)
		}
	}
	if inst.Token != "uid-1-0" || inst.Tags["team"] != "build" || inst.Tags["Name"] != "linux-arm64-abcde" || inst.LaunchedAt.IsZero() {
		t.Errorf("launched %+v", inst)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, srv, 1)
}

func TestLaunchIsIdempotentOnToken(t *testing.T) {
	srv, p := setup(t)
	ctx := testContext(t)
	req := cloud.LaunchRequest{Token: "uid-2-0", Name: "vm-2", Tags: map[string]string{cloud.TagInstallation: "a", cloud.TagPlatform: "linux-arm64"}}
	first, err := p.Launch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first.ID, "i-0") || first.State == cloud.StateGone {
		t.Fatalf("launched %+v", first)
	}
	again, err := p.Launch(ctx, req)
	if err != nil || again.ID != first.ID {
		t.Fatalf("relaunch with the same token: %+v, %v; want %s", again, err, first.ID)
	}
	machine, ok := srv.Instance(first.ID)
	if !ok {
		t.Fatalf("the stand-in has no %s", first.ID)
	}
	m, err := srv.Machines().WaitFor(ctx, machine.MachineID, vmcloud.Running)
	if err != nil {
		t.Fatal(err)
	}
	running, err := p.Get(ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if running.State != cloud.StateRunning || running.Address != m.Address || running.Token != req.Token || running.Tags[cloud.TagInstallation] != "a" {
		t.Fatalf("running: %+v, want address %s", running, m.Address)
	}

	if err := p.Terminate(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Terminate(ctx, first.ID); err != nil {
		t.Fatalf("terminating twice: %v", err)
	}
	if gone, err := p.Get(ctx, first.ID); err != nil || gone.State != cloud.StateGone || gone.Address != "" {
		t.Fatalf("after terminate: %+v, %v", gone, err)
	}
	// EC2 remembers the token: the same launch answers the terminated instance, and berth
	// relaunches under a new token.
	after, err := p.Launch(ctx, req)
	if err != nil || after.ID != first.ID || after.State != cloud.StateGone {
		t.Fatalf("relaunch after terminate: %+v, %v; want %s gone", after, err, first.ID)
	}
	if err := p.Terminate(ctx, "i-0123456789abcdef0"); err != nil {
		t.Fatalf("terminating an unknown instance: %v", err)
	}
	if _, err := p.Get(ctx, "i-0123456789abcdef0"); cloud.KindOf(err) != cloud.NotFound {
		t.Fatalf("get unknown: %v, want NotFound", err)
	}
	noneLeft(t, srv, 1)
}

// The config changed between a launch and its retry: EC2 refuses the token with other
// settings, and the provider answers the instance the token made.
func TestChangedSettingsUnderOneTokenReturnTheOriginal(t *testing.T) {
	srv, p := setup(t)
	ctx := testContext(t)
	req := cloud.LaunchRequest{Token: "uid-3-0", Name: "vm-3"}
	first, err := p.Launch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	v := values(srv.URL())
	v["instance-type"], v["disk"] = "m6g.xlarge", "200"
	changed := newTestProvider(t, v, goodSecrets())
	again, err := changed.Launch(ctx, req)
	if err != nil || again.ID != first.ID {
		t.Fatalf("launch with changed settings: %+v, %v; want %s", again, err, first.ID)
	}
	if c := lastCall(t, srv, "RunInstances"); c.Error != "IdempotentParameterMismatch" {
		t.Fatalf("EC2 answered the changed launch with %q, want IdempotentParameterMismatch", c.Error)
	}
	if err := changed.Terminate(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, srv, 1)
}

func TestAddresses(t *testing.T) {
	srv := startEC2(t)
	ctx := testContext(t)
	for _, tc := range []struct {
		name, subnet, strict string
		public               bool // the reachable address is the public one
		none                 bool
	}{
		{name: "private subnet", subnet: privateSubnet},
		{name: "public subnet", subnet: publicSubnet, public: true},
		{name: "public subnet, strict", subnet: publicSubnet, strict: "true", public: true},
		{name: "private subnet, strict", subnet: privateSubnet, strict: "true", none: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := values(srv.URL())
			v["subnet-id"], v["strict-public-address"] = tc.subnet, tc.strict
			p := newTestProvider(t, v, goodSecrets())
			inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "addr-" + strings.ReplaceAll(tc.name, " ", "")})
			if err != nil {
				t.Fatal(err)
			}
			view, _ := srv.Instance(inst.ID)
			m, err := srv.Machines().WaitFor(ctx, view.MachineID, vmcloud.Running)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Get(ctx, inst.ID)
			if err != nil {
				t.Fatal(err)
			}
			view, _ = srv.Instance(inst.ID)
			switch {
			case tc.none && got.Address != "":
				t.Errorf("address %q without a public one; want none", got.Address)
			case tc.public && (got.Address != m.Address || view.PublicIP != m.Address || view.PrivateIP == m.Address):
				t.Errorf("address %q, want the public %s (private %s)", got.Address, m.Address, view.PrivateIP)
			case !tc.public && !tc.none && (got.Address != m.Address || view.PublicIP != ""):
				t.Errorf("address %q, want the private %s", got.Address, m.Address)
			}
			if err := p.Terminate(ctx, inst.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
	noneLeft(t, srv, 4)
}

func TestListByTags(t *testing.T) {
	srv, p := setup(t)
	ctx := testContext(t)
	group := func(inst, platform string) map[string]string {
		return map[string]string{cloud.TagInstallation: inst, cloud.TagPlatform: platform}
	}
	want := map[string][]string{}
	var all []string
	// Seven of one group: more than a page of five.
	for i, g := range []struct{ inst, platform string }{
		{"a", "linux-arm64"}, {"a", "linux-arm64"}, {"a", "linux-arm64"}, {"a", "linux-arm64"},
		{"a", "linux-arm64"}, {"a", "linux-arm64"}, {"a", "linux-arm64"},
		{"a", "linux-amd64"}, {"b", "linux-arm64"}, {"b", "linux-arm64"},
	} {
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: fmt.Sprintf("list-%d", i), Tags: group(g.inst, g.platform)})
		if err != nil {
			t.Fatal(err)
		}
		want[g.inst+"/"+g.platform] = append(want[g.inst+"/"+g.platform], inst.ID)
		all = append(all, inst.ID)
	}
	// One of group a/arm64 goes: List shows it no more.
	gone := want["a/linux-arm64"][0]
	if err := p.Terminate(ctx, gone); err != nil {
		t.Fatal(err)
	}
	want["a/linux-arm64"] = want["a/linux-arm64"][1:]
	for key, w := range want {
		inst, platform, _ := strings.Cut(key, "/")
		got, err := p.List(ctx, group(inst, platform))
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(w)
		if !slices.Equal(ids(got), w) {
			t.Errorf("List(%s) = %v, want %v", key, ids(got), w)
		}
	}
	if got, err := p.List(ctx, group("c", "linux-arm64")); err != nil || len(got) != 0 {
		t.Errorf("List of another installation: %v, %v", ids(got), err)
	}
	if n := len(srv.Calls("DescribeInstances")); n < 5 {
		t.Errorf("%d DescribeInstances calls; six of one group take two pages", n)
	}
	for _, id := range all {
		if err := p.Terminate(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	noneLeft(t, srv, 10)
}

// Each fault reaches berth as the kind of error that tells it what to do.
func TestFaults(t *testing.T) {
	srv, p := setup(t)
	ctx := testContext(t)
	launches := 0

	t.Run("5xx is retried", func(t *testing.T) {
		srv.InternalErrors(2)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "5xx"})
		if err != nil {
			t.Fatalf("launch after two 500s: %v", err)
		}
		launches++
		srv.Unavailable(2)
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatalf("terminate after two 503s: %v", err)
		}
	})

	t.Run("lasting 5xx is Transient", func(t *testing.T) {
		srv.InternalErrors(100)
		_, err := p.List(ctx, nil)
		srv.InternalErrors(0)
		wantKind(t, "list under lasting 500s", err, cloud.Transient, "InternalError")
	})

	t.Run("throttling is honoured", func(t *testing.T) {
		srv.Throttle(3)
		before := len(srv.Calls("DescribeInstances"))
		if _, err := p.List(ctx, nil); err != nil {
			t.Fatalf("list after three throttled answers: %v", err)
		}
		if n := len(srv.Calls("DescribeInstances")) - before; n != 4 {
			t.Errorf("%d calls for one list throttled three times, want 4", n)
		}
		srv.Throttle(100)
		_, err := p.Get(ctx, "i-0123456789abcdef0")
		srv.Throttle(0)
		wantKind(t, "get under lasting throttling", err, cloud.Throttled)
	})

	t.Run("capacity", func(t *testing.T) {
		srv.InsufficientCapacity(1)
		before := len(srv.Calls("RunInstances"))
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "cap"})
		wantKind(t, "launch without capacity", err, cloud.Capacity, "InsufficientInstanceCapacity")
		if n := len(srv.Calls("RunInstances")) - before; n != 1 {
			t.Errorf("%d RunInstances calls; a capacity error is berth's to retry, not the SDK's", n)
		}
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "cap"})
		if err != nil {
			t.Fatalf("launch once there is capacity again: %v", err)
		}
		launches++
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("quota", func(t *testing.T) {
		srv.SetQuota(1)
		defer srv.SetQuota(0)
		first, err := p.Launch(ctx, cloud.LaunchRequest{Token: "q1"})
		if err != nil {
			t.Fatal(err)
		}
		launches++
		_, err = p.Launch(ctx, cloud.LaunchRequest{Token: "q2"})
		wantKind(t, "launch over quota", err, cloud.Quota, "InstanceLimitExceeded")
		if err := p.Terminate(ctx, first.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("stuck pending", func(t *testing.T) {
		srv.SetBootDelay(time.Hour)
		defer srv.SetBootDelay(0)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "stuck"})
		if err != nil {
			t.Fatal(err)
		}
		launches++
		if got, err := p.Get(ctx, inst.ID); err != nil || got.State != cloud.StatePending || got.Address != "" {
			t.Fatalf("stuck instance: %+v, %v", got, err)
		}
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
		if got, err := p.Get(ctx, inst.ID); err != nil || got.State != cloud.StateGone {
			t.Fatalf("after terminate: %+v, %v", got, err)
		}
	})

	t.Run("terminated behind berth's back", func(t *testing.T) {
		tags := map[string]string{cloud.TagInstallation: "a", cloud.TagPlatform: "console"}
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "console", Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		launches++
		if err := srv.TerminateFromConsole(inst.ID); err != nil {
			t.Fatal(err)
		}
		if got, err := p.Get(ctx, inst.ID); err != nil || got.State != cloud.StateGone {
			t.Fatalf("get: %+v, %v; want gone", got, err)
		}
		if l, err := p.List(ctx, tags); err != nil || len(l) != 0 {
			t.Fatalf("List shows %v, %v", ids(l), err)
		}
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatalf("terminating it again: %v", err)
		}
	})

	t.Run("not known yet is not gone", func(t *testing.T) {
		srv.HideNewInstances(time.Hour)
		defer srv.HideNewInstances(0)
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "eventual"})
		if err != nil {
			t.Fatal(err)
		}
		launches++
		if got, err := p.Get(ctx, inst.ID); err != nil || got.State != cloud.StatePending {
			t.Fatalf("get right after launch: %+v, %v; want pending", got, err)
		}
		wantKind(t, "terminate right after launch", p.Terminate(ctx, inst.ID), cloud.Transient)
		srv.HideNewInstances(0)
		if err := p.Terminate(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("bad settings", func(t *testing.T) {
		for key, value := range map[string]string{"key-name": "nosuch-key", "ami": "ami-0123456789abcdef0", "subnet-id": "subnet-0123456789abcdef0"} {
			v := values(srv.URL())
			v[key] = value
			_, err := newTestProvider(t, v, goodSecrets()).Launch(ctx, cloud.LaunchRequest{Token: "bad-" + key})
			wantKind(t, "launch with an unknown "+key, err, cloud.BadConfig, key, "linux/arm64")
		}
	})
	noneLeft(t, srv, launches)
}

func TestCredentials(t *testing.T) {
	srv := startEC2(t)
	ctx := testContext(t)
	for _, tc := range []struct {
		name    string
		secrets secrets
		kind    cloud.Kind
		mention []string
	}{
		{"wrong secret key", secrets{secretName: {"access-key-id": []byte(accessKeyID), "secret-access-key": []byte("not-the-key")}}, cloud.Auth, []string{secretName, "AuthFailure"}},
		{"unknown key id", secrets{secretName: {"access-key-id": []byte("AKIAEXAMPLEUNKNOWN00"), "secret-access-key": []byte(secretAccessKey)}}, cloud.Auth, []string{secretName, "AuthFailure"}},
		{"no secret", secrets{}, cloud.Auth, []string{secretName, "does not exist"}},
		{"no key id", secrets{secretName: {"secret-access-key": []byte(secretAccessKey)}}, cloud.Auth, []string{secretName, "access-key-id"}},
		{"empty secret key", secrets{secretName: {"access-key-id": []byte(accessKeyID), "secret-access-key": []byte(" \n")}}, cloud.Auth, []string{secretName, "secret-access-key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestProvider(t, values(srv.URL()), tc.secrets)
			_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "auth"})
			wantKind(t, "launch", err, tc.kind, tc.mention...)
			if strings.Contains(err.Error(), "not-the-key") {
				t.Errorf("the error shows a key: %q", err)
			}
		})
	}

	t.Run("Secret unreadable for now", func(t *testing.T) {
		p, err := newProvider(cloud.Settings{Platform: "p", Values: values(srv.URL()), Secret: func(context.Context, string) (map[string][]byte, error) {
			return nil, errors.New("connection to the apiserver refused")
		}}, tuning{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.List(ctx, nil)
		wantKind(t, "list while Secrets cannot be read", err, cloud.Transient)
	})

	t.Run("IAM denies RunInstances", func(t *testing.T) {
		const principal = "arn:aws:iam::210987654321:user/berth-launcher"
		srv.Deny("RunInstances", principal)
		defer srv.Allow("RunInstances")
		p := newTestProvider(t, values(srv.URL()), goodSecrets())
		before := len(srv.Calls("RunInstances"))
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "denied"})
		// The operator's error keeps EC2's words: they say which principal lacks which action.
		wantKind(t, "launch IAM denies", err, cloud.Auth, "UnauthorizedOperation", principal, "ec2:RunInstances", secretName)
		// One call, and one more with the credentials read again (see call): not the SDK's
		// retries of a refusal for good.
		if n := len(srv.Calls("RunInstances")) - before; n != 2 {
			t.Errorf("RunInstances called %d times, want 2", n)
		}
		if _, err := p.List(ctx, nil); err != nil {
			t.Errorf("list, which IAM allows: %v", err)
		}
	})

	t.Run("revoked and rotated", func(t *testing.T) {
		s := goodSecrets()
		p := newTestProvider(t, values(srv.URL()), s)
		if _, err := p.List(ctx, nil); err != nil {
			t.Fatal(err)
		}
		srv.RevokeAccessKey(accessKeyID)
		_, err := p.List(ctx, nil)
		wantKind(t, "list with a revoked key", err, cloud.Auth, secretName)
		// A new key in the Secret takes effect at the next call, though the old one was
		// cached.
		srv.AddAccessKey("AKIAROTATEDEXAMPLE01", "rotated/secret/key")
		s[secretName] = map[string][]byte{"access-key-id": []byte("AKIAROTATEDEXAMPLE01"), "secret-access-key": []byte("rotated/secret/key")}
		if _, err := p.List(ctx, nil); err != nil {
			t.Fatalf("list after the key was rotated: %v", err)
		}
	})
	noneLeft(t, srv, 0)
}

func TestSetup(t *testing.T) {
	if !slices.Contains(cloud.Types(), "aws") {
		t.Fatalf("aws is not registered: %v", cloud.Types())
	}
	read := goodSecrets().Read
	for key, value := range map[string]string{
		"region":                    "",
		"ami":                       "rhel-9",
		"instance-type":             "",
		"key-name":                  "",
		"aws-secret":                "Not_A_Name",
		"instance-profile-arn":      "otelcol",
		"strict-public-address":     "yes please",
		"disk":                      "big",
		"iops":                      "-1",
		"throughput":                "1e3",
		"user-data":                 strings.Repeat("x", 16<<10+1),
		"tenancy":                   "shared",
		"host-resource-group-arn":   "arn:aws:resource-groups:us-east-1:123456789012:group/mac", // without tenancy host
		"license-configuration-arn": "lic-1",
		"endpoint":                  "ec2.example.com",
	} {
		v := values("http://127.0.0.1:1")
		v[key] = value
		_, err := cloud.New("aws", cloud.Settings{Platform: "linux/arm64", Values: v, Secret: read})
		wantKind(t, key+"="+value[:min(len(value), 20)], err, cloud.BadConfig, key, "linux/arm64")
	}
	p, err := cloud.New("aws", cloud.Settings{Platform: "linux/arm64", Values: values(""), Secret: read})
	if err != nil {
		t.Fatal(err)
	}
	if p.AdminUser() != "ec2-user" {
		t.Errorf("AdminUser %q", p.AdminUser())
	}
	_, err = p.Launch(t.Context(), cloud.LaunchRequest{Token: strings.Repeat("t", 65)})
	wantKind(t, "a token over 64 characters", err, cloud.BadConfig)
}

// A security group or subnet id of the wrong form builds a provider, as every other key of the
// platform may be right and config.Parse warns of it; EC2 is the judge, and its refusal fails
// the launch as BadConfig naming the key and EC2's code, before anything is launched. (The
// values are mistakes seen in configs: a group's name, an id without its prefix.)
func TestMalformedIDsAreRefusedByEC2(t *testing.T) {
	srv := startEC2(t)
	ctx := testContext(t)
	for _, tc := range []struct{ key, value, code string }{
		{"security-group-id", "launch-wizard-1", "InvalidGroupId.Malformed"},
		{"subnet-id", "0aa719a6", "InvalidSubnetID.Malformed"},
		{"subnet-id", "SUBNET_ID", "InvalidSubnetID.Malformed"},
	} {
		v := values(srv.URL())
		v[tc.key] = tc.value
		p := newTestProvider(t, v, goodSecrets())
		before := len(srv.Calls("RunInstances"))
		_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "malformed-" + tc.key})
		wantKind(t, tc.key+"="+tc.value, err, cloud.BadConfig, tc.code, "check "+tc.key, "linux/arm64")
		if n := len(srv.Calls("RunInstances")) - before; n != 1 {
			t.Errorf("%s=%s: RunInstances called %d times; a malformed id is refused for good, not retried", tc.key, tc.value, n)
		}
	}
	noneLeft(t, srv, 0)
}

// placeholderIDs counts, per real config, the aws platforms whose security-group-id or
// subnet-id is not an EC2 id: the lw-p01 overlay ships SG_ID and SUBNET_ID.
var placeholderIDs = map[string]int{
	"rendered/production-downstream-kflux-lw-p01.yaml": 2,
}

// malformedCodes are EC2's answers to an id of the wrong form in RunInstances.
var malformedCodes = map[string]string{"security-group-id": "InvalidGroupId.Malformed", "subnet-id": "InvalidSubnetID.Malformed"}

// Every aws platform of the real configs builds a provider and launches in the stand-in, whose
// checks are EC2's (user data within its limit, well-formed ids, block devices, placement).
// Where config.Parse warns of a malformed id, the provider builds all the same, and EC2's
// refusal fails the launch as BadConfig naming the key, with nothing launched.
func TestRealConfigsBuildProviders(t *testing.T) {
	configs, err := realdata.HostConfigs()
	if err != nil {
		t.Fatal(err)
	}
	type platformCase struct {
		file     string
		platform config.Platform
		values   map[string]string
		warned   []string // the id keys config.Parse warned of
	}
	var cases []platformCase
	regions, keyPairs := map[string]bool{}, map[string]bool{}
	warnedIn := map[string]int{}
	for _, hc := range configs {
		cfg, problems := config.Parse(hc.Data)
		for _, platform := range slices.Sorted(maps.Keys(cfg.Dynamic)) {
			d := cfg.Dynamic[platform]
			if d.Type != "aws" {
				continue
			}
			c := platformCase{file: hc.Name, platform: platform, values: d.Settings}
			for key := range malformedCodes {
				full := "dynamic." + platform.Label() + "." + key
				for _, p := range problems {
					if p.Key != full {
						continue
					}
					if p.Severity != config.Warning || !strings.Contains(p.Message, strconv.Quote(d.Settings[key])) {
						t.Errorf("%s: %s: want a warning that quotes the value %q, got %s", hc.Name, platform, d.Settings[key], p)
					}
					c.warned = append(c.warned, key)
				}
			}
			if len(c.warned) > 0 {
				warnedIn[hc.Name]++
			}
			regions[d.Settings["region"]], keyPairs[d.Settings["key-name"]] = true, true
			cases = append(cases, c)
		}
	}
	if !maps.Equal(warnedIn, placeholderIDs) {
		t.Errorf("platforms with a malformed id, per config: %v, want %v", warnedIn, placeholderIDs)
	}
	if len(cases) < 100 {
		t.Errorf("only %d aws platforms in the real configs", len(cases))
	}

	servers := map[string]*ec2fake.Server{}
	for region := range regions {
		servers[region] = ec2fake.NewForTest(t, ec2fake.Options{AccessKeyID: accessKeyID, SecretAccessKey: secretAccessKey,
			Region: region, KeyPairs: slices.Collect(maps.Keys(keyPairs))})
	}
	ctx := testContext(t)
	launched, windows, macs := 0, 0, 0
	for i, c := range cases {
		what := c.file + ": " + string(c.platform)
		srv := servers[c.values["region"]]
		v := maps.Clone(c.values)
		v["endpoint"] = srv.URL()
		// The key under the Secret name the platform gives (aws-account, or awsiam upstream).
		s := secrets{v["aws-secret"]: goodSecrets()[secretName]}
		p, err := New(cloud.Settings{Platform: string(c.platform), Values: v, Secret: s.Read})
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		before := srv.Machines().LaunchCount()
		inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: fmt.Sprintf("real-%d", i), Name: fmt.Sprintf("%s-%d", c.platform.Label(), i),
			Tags: map[string]string{cloud.TagInstallation: "real", cloud.TagPlatform: c.platform.Label()}})
		if len(c.warned) == 0 {
			if err != nil {
				t.Errorf("%s: launch: %v", what, err)
				continue
			}
			launched++
			sentKeys(t, what, lastCall(t, srv, "RunInstances").Params, v)
			switch config.Platform(c.platform).OS() {
			case "windows":
				windows++
				if p.AdminUser() != "Administrator" {
					t.Errorf("%s: berth logs in as %s, want Administrator", what, p.AdminUser())
				}
			case "darwin":
				macs++
				if p.AdminUser() != "ec2-user" {
					t.Errorf("%s: berth logs in as %s, want ec2-user", what, p.AdminUser())
				}
			}
			if err := p.Terminate(ctx, inst.ID); err != nil {
				t.Errorf("%s: terminate: %v", what, err)
			}
			continue
		}
		if err == nil || cloud.KindOf(err) != cloud.BadConfig {
			t.Errorf("%s: launch with malformed %v: %v, want EC2's refusal as BadConfig", what, c.warned, err)
		} else if !slices.ContainsFunc(c.warned, func(key string) bool {
			return strings.Contains(err.Error(), malformedCodes[key]) && strings.Contains(err.Error(), "check "+key)
		}) {
			t.Errorf("%s: %q names neither EC2's code nor the key of %v", what, err, c.warned)
		}
		if n := srv.Machines().LaunchCount(); n != before {
			t.Errorf("%s: a refused launch started %d machines", what, n-before)
		}
	}
	if n := len(cases) - sumValues(warnedIn); launched != n {
		t.Errorf("%d of %d well-formed platforms launched", launched, n)
	}
	// ../shared/real/README.md: two rendered clusters run macOS on dedicated hosts and Windows.
	if windows < 2 || macs < 2 {
		t.Errorf("launched %d Windows and %d macOS platforms of the real configs, want at least 2 of each", windows, macs)
	}
	for region, srv := range servers {
		for _, m := range srv.Machines().Instances() {
			if m.State != vmcloud.Gone {
				t.Errorf("%s: machine %s (%s) is %s at the end", region, m.ID, m.Token, m.State)
			}
		}
	}
}

// wireFields are the RunInstances fields each provider key fills; "" for keys that shape the
// call but no field of it (where it goes, with which credentials, how berth reads the answer).
var wireFields = map[string]string{
	"ami": "ImageId", "instance-type": "InstanceType", "key-name": "KeyName",
	"security-group": "SecurityGroup.1", "security-group-id": "SecurityGroupId.1", "subnet-id": "SubnetId",
	"instance-profile-name": "IamInstanceProfile.Name", "instance-profile-arn": "IamInstanceProfile.Arn",
	"disk": "BlockDeviceMapping.1.Ebs.VolumeSize", "iops": "BlockDeviceMapping.1.Ebs.Iops",
	"throughput": "BlockDeviceMapping.1.Ebs.Throughput", "user-data": "UserData",
	"tenancy": "Placement.Tenancy", "host-resource-group-arn": "Placement.HostResourceGroupArn",
	"license-configuration-arn": "LicenseSpecification.1.LicenseConfigurationArn",
	"region":                    "", "aws-secret": "", "endpoint": "", "strict-public-address": "",
	// The launch's InstanceType only once a type before it had no capacity.
	"fallback-instance-types": "",
}

// sentKeys checks that every provider key a platform sets reached its RunInstances field as
// it was configured, so no key of a real config is dropped on the way to EC2.
func sentKeys(t *testing.T, what string, sent url.Values, values map[string]string) {
	t.Helper()
	for key, value := range values {
		field, known := wireFields[key]
		switch {
		case !known:
			t.Errorf("%s: key %s has no RunInstances field this test knows: add it to wireFields", what, key)
		case field == "UserData":
			if sent.Get(field) != base64.StdEncoding.EncodeToString([]byte(value)) {
				t.Errorf("%s: user-data did not reach RunInstances byte for byte", what)
			}
		case field != "" && sent.Get(field) != strings.TrimSpace(value):
			t.Errorf("%s: %s = %q reached RunInstances %s as %q", what, key, value, field, sent.Get(field))
		}
	}
}

func sumValues(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestAStoppedInstanceIsReportedStoppedListedAndTerminated: EC2 keeps a stopped instance, and
// bills it and its volumes, until it is terminated. Get says stopped (berth then terminates
// it), List finds it (so the sweeper does too), and Terminate ends it: nothing is left.
func TestAStoppedInstanceIsReportedStoppedListedAndTerminated(t *testing.T) {
	srv, p := setup(t)
	ctx := testContext(t)
	tags := map[string]string{cloud.TagInstallation: "a", cloud.TagPlatform: "linux-arm64"}
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "stopped-1", Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range srv.Instances() {
		if i.ID == inst.ID {
			if _, err := srv.Machines().WaitFor(ctx, i.MachineID, vmcloud.Running); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := srv.StopFromConsole(inst.ID); err != nil {
		t.Fatal(err)
	}
	got, err := p.Get(ctx, inst.ID)
	if err != nil || got.State != cloud.StateStopped || got.Address != "" {
		t.Fatalf("get: %+v, %v; want stopped, without an address", got, err)
	}
	listed, err := p.List(ctx, tags)
	if err != nil || len(listed) != 1 || listed[0].ID != inst.ID || listed[0].State != cloud.StateStopped {
		t.Fatalf("list: %+v, %v; want the stopped instance", listed, err)
	}
	var states []string
	for k, v := range lastCall(t, srv, "DescribeInstances").Params {
		if strings.HasPrefix(k, "Filter.1.Value.") {
			states = append(states, v...)
		}
	}
	if slices.Sort(states); !slices.Equal(states, []string{"pending", "running", "stopped", "stopping"}) {
		t.Errorf("List asked for the states %v", states)
	}
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, srv, 1)
}

// TestMacInstancesHaveTheDedicatedHostsMinimumLife: EC2 Mac instances run on dedicated hosts
// allocated for 24 hours at the least; other types have no minimum.
func TestMacInstancesHaveTheDedicatedHostsMinimumLife(t *testing.T) {
	srv := startEC2(t)
	for typ, want := range map[string]time.Duration{
		"mac1.metal": 24 * time.Hour, "mac2.metal": 24 * time.Hour, "mac2-m2.metal": 24 * time.Hour,
		"mac2-m2pro.metal": 24 * time.Hour, "mac-m4.metal": 24 * time.Hour,
		"m6g.large": 0, "c5.4xlarge": 0, "g6.xlarge": 0,
	} {
		v := values(srv.URL())
		v["instance-type"] = typ
		if got := cloud.MinimumLife(newTestProvider(t, v, goodSecrets()), ""); got != want {
			t.Errorf("%s: minimum life %s, want %s", typ, got, want)
		}
		// A VM of a fallback type has that type's minimum, whatever the platform's first type.
		v["instance-type"] = "m6g.large"
		if got := cloud.MinimumLife(newTestProvider(t, v, goodSecrets()), typ); got != want {
			t.Errorf("%s as the fallback of m6g.large: minimum life %s, want %s", typ, got, want)
		}
	}
}

// TestFallbackInstanceTypes: a launch asks for the type its Fallback picks, each under its own
// client token; a type EC2 has no capacity for fails as Capacity, so berth can move on.
func TestFallbackInstanceTypes(t *testing.T) {
	srv := startEC2(t)
	ctx := testContext(t)
	v := values(srv.URL())
	v["instance-type"], v["fallback-instance-types"] = "mac2.metal", " mac2-m2.metal , mac2-m2pro.metal"
	p := newTestProvider(t, v, goodSecrets())
	if got := cloud.InstanceTypes(p); !slices.Equal(got, []string{"mac2.metal", "mac2-m2.metal", "mac2-m2pro.metal"}) {
		t.Fatalf("instance types %v", got)
	}
	srv.NoCapacityFor("mac2.metal")
	_, err := p.Launch(ctx, cloud.LaunchRequest{Token: "uid-1-1", Tags: map[string]string{cloud.TagInstallation: "a"}})
	wantKind(t, "the first type", err, cloud.Capacity, "mac2.metal")
	inst, err := p.Launch(ctx, cloud.LaunchRequest{Token: "uid-1-1-f1", Tags: map[string]string{cloud.TagInstallation: "a"}, Fallback: 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := lastCall(t, srv, "RunInstances").Params.Get("InstanceType"); got != "mac2-m2.metal" {
		t.Errorf("the fallback launch asked for %s", got)
	}
	_, err = p.Launch(ctx, cloud.LaunchRequest{Token: "uid-1-1-f3", Fallback: 3})
	wantKind(t, "a fallback the platform does not have", err, cloud.BadConfig)
	if err := p.Terminate(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	noneLeft(t, srv, 1)

	for _, bad := range []string{"mac2.metal", "m6g.xlarge,m6g.xlarge", "not a type"} {
		v["fallback-instance-types"] = bad
		if _, err := New(cloud.Settings{Platform: "macos/arm64", Values: v, Secret: goodSecrets().Read}); cloud.KindOf(err) != cloud.BadConfig || !strings.Contains(err.Error(), "fallback-instance-types") {
			t.Errorf("fallback-instance-types %q: %v; want a BadConfig naming the key", bad, err)
		}
	}
}
