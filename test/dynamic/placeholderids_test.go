package dynamic

import (
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/stacktest"
)

// A real overlay (production-downstream-kflux-lw-p01 in ../shared/real) ships the placeholders
// SG_ID and SUBNET_ID. The config loads with the platform in service and a warning on the
// ConfigMap naming key and value; the launch goes to EC2, which refuses the ids as malformed:
// the task gets an error secret, the operator EC2's code, and no VM is started or left.
func TestPlaceholderIDsFailTheLaunchNotTheConfig(t *testing.T) {
	ns := namespace(t)
	const platform = "linux/arm64"
	launches := stack.EC2.Machines().LaunchCount()
	useConfig(t, platform, devstack.DynamicSettings{Provider: devstack.ProviderAWS, MaxInstances: 1,
		Settings: map[string]string{"security-group-id": "SG_ID", "subnet-id": "SUBNET_ID"}})
	eventWith(t, "ConfigWarnings", `dynamic.linux-arm64.security-group-id: "SG_ID" is not a security group id`)

	tr := task(t, ns, "placeholder", platform)
	msg := string(stacktest.SecretOf(t, c(), tr).Data["error"])
	for _, want := range []string{platform, "bad configuration"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error secret does not say %q: %q", want, msg)
		}
	}
	eventWith(t, "LaunchFailed", "InvalidSubnetID.Malformed")

	finish(t, tr)
	settled(t, ns, 0)
	refused := 0
	for _, call := range stack.EC2.Calls("RunInstances") {
		if call.Error == "InvalidSubnetID.Malformed" || call.Error == "InvalidGroupId.Malformed" {
			refused++
		}
	}
	if refused == 0 {
		t.Error("EC2 never refused a malformed id: the task failed before asking it")
	}
	if n := stack.EC2.Machines().LaunchCount(); n != launches {
		t.Errorf("%d machines launched with malformed ids", n-launches)
	}
}
