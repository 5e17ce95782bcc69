package hosts

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// Refusals as the providers word them for the operator (see awsec2.failure, ibmp.classify,
// ibmz): each names the account, the principal or the workspace.
var refusals = []struct {
	name string
	err  error
	// reason is what the waiting tasks get once their allocation timeout has passed.
	reason string
}{
	{"EC2 UnauthorizedOperation", &cloud.Error{Kind: cloud.Auth, Op: "launch", Err: errors.New(
		"platform linux/arm64: EC2 answered UnauthorizedOperation (the AWS key is in Secret aws-account, keys access-key-id and secret-access-key): You are not authorized to perform this operation. User: arn:aws:iam::123456789012:user/berth-launcher is not authorized to perform: ec2:RunInstances on resource: arn:aws:ec2:us-east-1:123456789012:instance/* because no identity-based policy allows the ec2:RunInstances action. Encoded authorization failure message: q8Zk3v-Xb_1")},
		"CloudRefused"},
	{"Power VS forbidden", &cloud.Error{Kind: cloud.Auth, Op: "launch", Err: errors.New(
		"Power VS workspace 0d5c7a3e-1b1f at https://us-south.power-iaas.cloud.ibm.com answered 403: forbidden: user IBMid-2700012345 has no access to crn:v1:bluemix:public:power-iaas:dal10:a/4f1e2d3c:0d5c7a3e::")},
		"CloudRefused"},
	{"VPC bad image", &cloud.Error{Kind: cloud.BadConfig, Op: "launch", Err: errors.New(
		"VPC API https://us-south.iaas.cloud.ibm.com/v1 answered 400: image r006-1234 not found in account a/4f1e2d3c")},
		"CloudRefused"},
	{"EC2 no capacity", &cloud.Error{Kind: cloud.Capacity, Op: "launch", Err: errors.New(
		"platform linux/arm64: EC2 answered InsufficientInstanceCapacity: We currently do not have sufficient m6g.large capacity in the Availability Zone you requested (us-east-1a) for account 123456789012")},
		"NoCapacity"},
}

var cloudsWords = []string{"arn:aws", "123456789012", "Encoded authorization", "IBMid", "crn:v1", "a/4f1e2d3c", "aws-account", "us-south", "r006-1234", "us-east-1a"}

// TestUnservableTellsTheKindNotTheCloudsWords: what a platform's waiting tasks are told (their
// error secret and the Event on their TaskRun) names the kind of failure, what to do, and a
// reference; the cloud's answer stays with the operator.
func TestUnservableTellsTheKindNotTheCloudsWords(t *testing.T) {
	cfg, problems := config.Parse(map[string]string{
		"dynamic-platforms": "linux/arm64", "dynamic.linux-arm64.type": "aws", "dynamic.linux-arm64.region": "us-east-1",
		"dynamic.linux-arm64.ami": "ami-0123456789abcdef0", "dynamic.linux-arm64.instance-type": "m6g.large",
		"dynamic.linux-arm64.key-name": "builders", "dynamic.linux-arm64.aws-secret": "aws-account",
		"dynamic.linux-arm64.ssh-secret": "ssh", "dynamic.linux-arm64.security-group-id": "sg-0123456789abcdef0",
		"dynamic.linux-arm64.subnet-id": "subnet-0123456789abcdef0", "dynamic.linux-arm64.max-instances": "2",
		"dynamic.linux-arm64.allocation-timeout": "600",
	})
	if !cfg.Usable("linux/arm64") {
		t.Fatalf("the test's platform is not usable: %v", problems)
	}
	store := hostconfig.NewStore()
	store.Apply(cfg)
	refShape := regexp.MustCompile(`ref-[0-9a-f]{10}`)
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			f := &Owner{Namespace: "berth-system", Config: store, Capacity: restoredCapacity(), Debts: noDebts{}}
			f.init()
			ref := f.trouble.note("linux/arm64", tc.err)
			if again := f.trouble.note("linux/arm64", tc.err); again != ref {
				t.Errorf("a second failure of the same run got ref %s, not %s", again, ref)
			}
			reason, msg, _ := f.Unservable("linux/arm64", 11*time.Minute)
			if reason != tc.reason {
				t.Fatalf("reason %q, want %s (message %q)", reason, tc.reason, msg)
			}
			for _, want := range []string{"linux/arm64", cloud.KindOf(tc.err).String(), string(ref), "berth-system", "platform team"} {
				if !strings.Contains(msg, want) {
					t.Errorf("the tenant's message does not say %q: %s", want, msg)
				}
			}
			if !refShape.MatchString(msg) {
				t.Errorf("no reference in %q", msg)
			}
			for _, leak := range cloudsWords {
				if strings.Contains(msg, leak) {
					t.Errorf("the tenant's message carries %q of the cloud's answer: %s", leak, msg)
				}
			}
		})
	}
}
