package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/dev/testground/missing"
)

// binDir is where make build put bin/berth and bin/berth-dev ($BERTH_BIN_DIR, which make test
// sets). Only those binaries carry the version make build stamps, so without it the tests are
// skipped, and fail under CI.
func binDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("BERTH_BIN_DIR")
	if dir == "" {
		msg := "BERTH_BIN_DIR is not set: run make build, then BERTH_BIN_DIR=$PWD/bin go test ./cmd/berth"
		missing.Skip(t, msg)
	}
	return dir
}

// git runs git in the checkout and returns its output's one line.
func git(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", args...).Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// checkout is what make build stamped into the binaries of this checkout: the version git
// describes and the commit HEAD is.
func checkout(t *testing.T) (version, commit string) {
	t.Helper()
	return git(t, "describe", "--tags", "--always", "--dirty"), git(t, "rev-parse", "HEAD")
}

// berth version (and berth-dev version) print the version git describes and the commit of HEAD,
// with the Go release and platform they were built by and for.
func TestVersionIsTheCheckouts(t *testing.T) {
	dir := binDir(t)
	wantVersion, wantCommit := checkout(t)
	for _, bin := range []string{"berth", "berth-dev"} {
		t.Run(bin, func(t *testing.T) {
			out, err := exec.Command(filepath.Join(dir, bin), "version").Output()
			if err != nil {
				t.Fatalf("%s version: %v", bin, err)
			}
			got := map[string]string{}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				k, v, ok := strings.Cut(line, ": ")
				if !ok {
					t.Fatalf("%s version printed %q, not key: value", bin, line)
				}
				got[k] = v
			}
			want := map[string]string{"version": wantVersion, "commit": wantCommit, "go": runtime.Version(), "platform": runtime.GOOS + "/" + runtime.GOARCH}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s version: %s %q, want %q (make build stamps the checkout's; rebuild after changing it)", bin, k, got[k], v)
				}
			}
			if len(got) != len(want) {
				t.Errorf("%s version printed %v, want only %v", bin, got, want)
			}
		})
	}
}

// The first line a long-running berth process logs names its version and commit, whether it
// then starts or not (here it cannot: its kubeconfig does not exist).
func TestFirstLogLineSaysTheVersion(t *testing.T) {
	dir := binDir(t)
	wantVersion, wantCommit := checkout(t)
	missing := filepath.Join(t.TempDir(), "no-kubeconfig")
	for _, args := range [][]string{
		{"controller", "--kubeconfig", missing},
		{"otp-server", "--kubeconfig", missing, "--cert-dir", t.TempDir()},
	} {
		t.Run(args[0], func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(filepath.Join(dir, "berth"), args...)
			cmd.Stderr = &stderr
			if err := cmd.Run(); err == nil {
				t.Fatalf("berth %s started without a kubeconfig", strings.Join(args, " "))
			}
			first, _, _ := bufio.NewReader(&stderr).ReadLine()
			var line struct {
				Msg, Version, Commit string
			}
			if err := json.Unmarshal(first, &line); err != nil {
				t.Fatalf("the first line of berth %s is not a JSON log line: %q (%v)", args[0], first, err)
			}
			if line.Version != wantVersion || line.Commit != wantCommit || !strings.HasPrefix(line.Msg, "starting") {
				t.Errorf("the first log line of berth %s is %s; want a starting line with version %q and commit %q", args[0], first, wantVersion, wantCommit)
			}
		})
	}
}
