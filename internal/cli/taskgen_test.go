package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// taskgenTestdata is the generator's own testdata: the Tasks and their golden twins.
func taskgenTestdata(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join("..", "taskgen", "testdata", name)
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// The command writes what the generator makes, from a file to a file and from stdin to
// stdout, each flag reaching its option.
func TestTaskgenCommand(t *testing.T) {
	out := filepath.Join(t.TempDir(), "buildah-remote.yaml")
	if msg, err := berth(t, "taskgen", taskgenTestdata(t, "buildah.yaml"), "-o", out); err != nil {
		t.Fatalf("%v: %s", err, msg)
	}
	if readFile(t, out) != readFile(t, taskgenTestdata(t, "buildah-remote.golden.yaml")) {
		t.Errorf("berth taskgen -o wrote another Task than the golden buildah-remote")
	}

	cmd := NewRootCommand()
	var stdout, stderr bytes.Buffer
	cmd.SetIn(strings.NewReader(readFile(t, taskgenTestdata(t, "go-build.yaml"))))
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"taskgen", "--step", "compile", "--step=test", "--name", "go-build-on-host",
		"--runner-image", "quay.io/konflux-ci/task-runner:1.6.0", "--host-image", "docker.io/library/golang:1.26-bookworm",
		"--registry-credentials=false", "--host-epilogue", "go vet ./...", "--pod-epilogue", "#!/bin/bash\nls bin"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if stdout.String() != readFile(t, taskgenTestdata(t, "go-build-on-host.golden.yaml")) {
		t.Errorf("berth taskgen < go-build.yaml with flags wrote another Task than the golden go-build-on-host")
	}
}

func TestTaskgenCommandErrors(t *testing.T) {
	notATask := filepath.Join(t.TempDir(), "cm.yaml")
	if err := os.WriteFile(notATask, []byte("apiVersion: v1\nkind: ConfigMap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out.yaml")
	for _, tc := range []struct {
		args  []string
		wants string
	}{
		{[]string{notATask, "-o", out}, notATask + ": the input is not a Tekton Task"},
		{[]string{taskgenTestdata(t, "buildah.yaml"), "--step", "compile"}, `no step "compile"`},
		{[]string{taskgenTestdata(t, "buildah.yaml"), "--scratch", "cache"}, `scratch volume "cache"`},
		{[]string{filepath.Join(t.TempDir(), "missing.yaml")}, "no such file"},
	} {
		msg, err := berth(t, append([]string{"taskgen"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.wants) {
			t.Errorf("berth taskgen %v: %v (%s); want an error saying %q", tc.args, err, msg, tc.wants)
		}
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a failed taskgen left %s behind: %v", out, err)
	}
}
