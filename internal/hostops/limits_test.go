package hostops

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
	"github.com/berth-ci/berth/internal/remote"
)

// The creation of a build user hands the host its limits.d file and slice properties as
// arguments: the upstream controller's limits unless the config says otherwise, and no
// open-file limit or TasksMax unless it sets them.
func TestCreateUserSendsTheLimits(t *testing.T) {
	const user = "u-5a0d7f3b8e2c4b6d9f1a7c9e-1"
	cases := []struct {
		name              string
		limits            config.BuildLimits
		wantConf, wantSet string
	}{
		{"defaults", config.BuildLimits{},
			user + " soft nproc 8192\n" + user + " hard nproc 16384\n" + user + " soft cpu 480\n" + user + " hard cpu 720\n",
			"MemoryMax=90%\nCPUQuota=90\nCPUWeight=100"},
		{"configured", config.BuildLimits{Processes: config.LimitPair{Soft: 2000, Hard: 2000},
			CPUMinutes: config.LimitPair{Soft: config.Unlimited, Hard: config.Unlimited}, OpenFiles: config.LimitPair{Soft: 1024, Hard: 524288},
			MemoryMax: "16G", CPUWeight: 50, TasksMax: "3000"},
			user + " soft nproc 2000\n" + user + " hard nproc 2000\n" + user + " soft cpu unlimited\n" + user + " hard cpu unlimited\n" +
				user + " soft nofile 1024\n" + user + " hard nofile 524288\n",
			"MemoryMax=16G\nCPUWeight=50\nTasksMax=3000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			relay, target := fakeHost(t, "root", func(sshfake.Command) sshfake.Reply { return sshfake.Reply{Stdout: "/home/" + user + "\n"} })
			p := newBuilt(t, user)
			if _, err := CreateUser(context.Background(), target, NewUser{Name: user, AuthorizedKey: p.authorized, Owner: "builds/x", Limits: c.limits}); err != nil {
				t.Fatal(err)
			}
			line := relay.Commands()[0].Line
			for what, arg := range map[string]string{"limits.d file": c.wantConf, "slice properties": c.wantSet} {
				q, err := remote.Quote(arg)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(line, " "+q+" ") {
					t.Errorf("the creation does not pass the %s %q: %.300q", what, arg, line[strings.LastIndex(line, "berth "):])
				}
			}
		})
	}
}

// sliceLimits, run with stand-ins for systemctl and getconf, asks systemd for exactly the
// slice's properties, with CPUQuota turned from percent of the host's CPUs into systemd's
// percent of one CPU, after dropping what earlier users of the UID were given.
func TestSliceLimitsSetTheSlicesProperties(t *testing.T) {
	cases := []struct{ props, want string }{
		{"MemoryMax=90%\nCPUQuota=90\nCPUWeight=100", "revert user-1879048192.slice\nset-property --runtime user-1879048192.slice MemoryMax=90% CPUQuota=360% CPUWeight=100\n"},
		{"TasksMax=3000", "revert user-1879048192.slice\nset-property --runtime user-1879048192.slice TasksMax=3000\n"},
		// Nothing set: earlier properties still go, none come.
		{"", "revert user-1879048192.slice\n"},
	}
	for _, c := range cases {
		dir := t.TempDir()
		calls := filepath.Join(dir, "calls")
		for name, body := range map[string]string{
			"systemctl": `echo "$*" >> "` + calls + `"`,
			"getconf":   `[ "$1" = _NPROCESSORS_ONLN ] && echo 4`,
		} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("sh", "-c", "set -eu\nuid=1879048192 slice_props=$1\n"+sliceLimits, "sh", c.props)
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%q: %v: %s", c.props, err, out)
		}
		got, _ := os.ReadFile(calls)
		if string(got) != c.want {
			t.Errorf("for %q systemctl was called with\n%s\nwant\n%s", c.props, got, c.want)
		}
	}
}

// A host without systemd still takes builds, but its check warns that no build is bounded as
// a whole; a host with systemd gets no warning.
func TestCheckWarnsWhereSystemdDoesNotRun(t *testing.T) {
	for _, systemd := range []string{"no", "yes"} {
		_, target := fakeHost(t, "root", func(sshfake.Command) sshfake.Reply {
			return sshfake.Reply{Stdout: "disk 1000000000 900000000\nnow 1700000000\nsystemd " + systemd + "\n"}
		})
		healthy, reason, warning := CheckOn(context.Background(), target, "linux/s390x", 1)
		if !healthy {
			t.Fatalf("systemd %s: unhealthy: %s", systemd, reason)
		}
		if got := strings.Contains(warning, "no build is bounded as a whole"); got != (systemd == "no") {
			t.Errorf("systemd %s: warning %q", systemd, warning)
		}
	}
}

// On a real sshd host the build user's login has the limits: pam_limits reads the limits.d
// file the creation wrote.
func TestBuildUserLogsInWithItsLimits(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[0]
	for _, c := range []struct {
		name   string
		limits config.BuildLimits
		want   string // ulimit -Su -Hu -St -Ht -Hn
	}{
		{"defaults", config.BuildLimits{}, "8192 16384 28800 43200"},
		{"configured", config.BuildLimits{Processes: config.LimitPair{Soft: 300, Hard: 400}, CPUMinutes: config.LimitPair{Soft: 1, Hard: 2},
			OpenFiles: config.LimitPair{Soft: 100, Hard: 200}}, "300 400 60 120 100 200"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newBuilt(t, UserName("7b1e2c3d-4f5a-4b6c-8d7e-"+map[string]string{"defaults": "000000000001", "configured": "000000000002"}[c.name], 1))
			dir, err := CreateUser(context.Background(), adminTarget(f, h), NewUser{Name: p.User, AuthorizedKey: p.authorized, Owner: "builds/limits x", Limits: c.limits})
			if err != nil {
				t.Fatal(err)
			}
			p.Dir = dir
			t.Cleanup(func() { _ = Clean(context.Background(), adminTarget(f, h), p.User) })
			cmd := `echo $(ulimit -Su) $(ulimit -Hu) $(ulimit -St) $(ulimit -Ht)`
			if c.limits.OpenFiles != (config.LimitPair{}) {
				cmd += ` $(ulimit -Sn) $(ulimit -Hn)`
			}
			out, err := asBuildUser(t, h, &p.built, "bash -c '"+cmd+"'")
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.TrimSpace(out); got != c.want {
				t.Errorf("the build user's limits are %q, want %q", got, c.want)
			}
		})
	}
}
