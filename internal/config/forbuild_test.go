package config

import (
	"slices"
	"testing"
)

// A build user on a VM gets its platform's sudo-commands, as real configs give them to the
// platforms whose builds run podman as root (linux-root-arm64 in production-downstream
// kflux-ocp-p01: "/usr/bin/podman, /usr/bin/rm /usr/share/containers/mounts.conf"); one on a
// static host gets none, and each gets the limits of where it runs.
func TestAVMsBuildUserGetsItsPlatformsSudoCommands(t *testing.T) {
	const root = "linux/root-arm64"
	cfg, problems := Parse(map[string]string{
		"dynamic-platforms":             root,
		"dynamic.linux-root-arm64.type": "aws", "dynamic.linux-root-arm64.max-instances": "2",
		"dynamic.linux-root-arm64.ssh-secret": "aws-ssh", "dynamic.linux-root-arm64.region": "us-east-1",
		"dynamic.linux-root-arm64.ami": "ami-0123456789abcdef0", "dynamic.linux-root-arm64.instance-type": "m6g.large",
		"dynamic.linux-root-arm64.key-name": "berth", "dynamic.linux-root-arm64.aws-secret": "aws-creds",
		"dynamic.linux-root-arm64.sudo-commands": "/usr/bin/podman, /usr/bin/rm /usr/share/containers/mounts.conf",
		"dynamic.linux-root-arm64.nproc-hard":    "20000",
		"host.h1.address":                        "10.0.0.1", "host.h1.user": "root", "host.h1.platform": "linux/s390x",
		"host.h1.secret": "admin-key", "host.h1.concurrency": "1", "host.h1.nproc-hard": "9000",
	})
	if problems.HasErrors() || !cfg.Usable(root) {
		t.Fatalf("the config: %v", problems.Errors())
	}
	limits, sudo := cfg.ForBuild("h1", root, true)
	if want := []string{"/usr/bin/podman", "/usr/bin/rm /usr/share/containers/mounts.conf"}; !slices.Equal(sudo, want) {
		t.Errorf("a VM's build user may run %q as root; want its platform's %q", sudo, want)
	}
	if limits.Processes.Hard != 20000 {
		t.Errorf("a VM's build user gets nproc %d; want its platform's 20000", limits.Processes.Hard)
	}
	limits, sudo = cfg.ForBuild("h1", "linux/s390x", false)
	if len(sudo) > 0 || limits.Processes.Hard != 9000 {
		t.Errorf("a static host's build user may run %q as root with nproc %d; want nothing and its host's 9000", sudo, limits.Processes.Hard)
	}
}
