package taskrun

import (
	"slices"
	"testing"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
)

// A build user on a VM gets its platform's sudo-commands, as real configs give them to the
// platforms whose builds run podman as root (linux-root-arm64 in production-downstream
// kflux-ocp-p01: "/usr/bin/podman, /usr/bin/rm /usr/share/containers/mounts.conf"); one on a
// static host gets none, and each gets the limits of where it runs.
func TestAVMsBuildUserGetsItsPlatformsSudoCommands(t *testing.T) {
	const root = "linux/root-arm64"
	cfg, problems := config.Parse(with(hostsConfig(1, "h1"), "dynamic-platforms", root,
		"dynamic.linux-root-arm64.type", "aws", "dynamic.linux-root-arm64.max-instances", "2",
		"dynamic.linux-root-arm64.ssh-secret", "aws-ssh", "dynamic.linux-root-arm64.region", "us-east-1",
		"dynamic.linux-root-arm64.ami", "ami-0123456789abcdef0", "dynamic.linux-root-arm64.instance-type", "m6g.large",
		"dynamic.linux-root-arm64.key-name", "berth", "dynamic.linux-root-arm64.aws-secret", "aws-creds",
		"dynamic.linux-root-arm64.sudo-commands", "/usr/bin/podman, /usr/bin/rm /usr/share/containers/mounts.conf",
		"dynamic.linux-root-arm64.nproc-hard", "20000",
		"host.h1.nproc-hard", "9000"))
	if problems.HasErrors() || !cfg.Usable(root) {
		t.Fatalf("the config: %v", problems.Errors())
	}
	limits, sudo := hostRules(cfg, berthv1.HostLogin{Host: "h1", Platform: root, Instance: "i-0123456789abcdef0"})
	if want := []string{"/usr/bin/podman", "/usr/bin/rm /usr/share/containers/mounts.conf"}; !slices.Equal(sudo, want) {
		t.Errorf("a VM's build user may run %q as root; want its platform's %q", sudo, want)
	}
	if limits.Processes.Hard != 20000 {
		t.Errorf("a VM's build user gets nproc %d; want its platform's 20000", limits.Processes.Hard)
	}
	limits, sudo = hostRules(cfg, berthv1.HostLogin{Host: "h1", Platform: s390x})
	if len(sudo) > 0 || limits.Processes.Hard != 9000 {
		t.Errorf("a static host's build user may run %q as root with nproc %d; want nothing and its host's 9000", sudo, limits.Processes.Hard)
	}
}
