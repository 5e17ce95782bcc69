package cli

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// The Tasks berth ships must be what the apiserver accepts, declare the params berth's
// internal TaskRuns pass (internal/provision/taskruns.go), and run a `berth host ...` command
// line that the real CLI parses with every required flag.
func TestShippedTasksRunTheHostCommands(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	contract := map[string][]string{
		"provision-shared-host": {"USER_NAME", "AUTHORIZED_KEY", "OWNER", "HOST", "USER", "SUDO_COMMANDS", "RAW_PLATFORM", "HOST_KEY", "UID_RANGE", "LIMITS"},
		"clean-shared-host":     {"USER_NAME", "HOST", "USER", "RAW_PLATFORM", "HOST_KEY"},
		"update-host":           {"HOST", "USER"},
	}
	ref := regexp.MustCompile(`\$\((params\.[A-Z_]+|workspaces\.ssh\.path)\)`)
	for name, params := range contract {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root, "config", "tasks", name+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			var task pipelinev1.Task
			if err := yaml.UnmarshalStrict(data, &task); err != nil {
				t.Fatalf("not a Tekton v1 Task: %v", err)
			}
			task.Namespace = "tasks-check"
			if err := cp.EnsureNamespace(context.Background(), task.Namespace); err != nil {
				t.Fatal(err)
			}
			if err := cp.Client.Create(context.Background(), &task); err != nil {
				t.Fatalf("the apiserver refused the Task: %v", err)
			}
			declared := map[string]bool{}
			values := map[string]string{}
			for _, p := range task.Spec.Params {
				declared[p.Name] = true
				values["$(params."+p.Name+")"] = "x"
				if p.Default != nil {
					values["$(params."+p.Name+")"] = p.Default.StringVal
				}
			}
			for _, p := range params {
				if !declared[p] {
					t.Errorf("param %s missing", p)
				}
			}
			if len(task.Spec.Workspaces) != 1 || task.Spec.Workspaces[0].Name != "ssh" {
				t.Errorf("want the ssh workspace, got %+v", task.Spec.Workspaces)
			}
			step := task.Spec.Steps[0]
			if len(step.Command) != 1 || step.Command[0] != "berth" {
				t.Fatalf("the step runs %v, not berth", step.Command)
			}
			var args []string
			for _, a := range step.Args {
				args = append(args, ref.ReplaceAllStringFunc(a, func(m string) string {
					if strings.Contains(m, "workspaces") {
						return "/workspace/ssh"
					}
					v, ok := values[m]
					if !ok {
						t.Errorf("the step uses %s, which the Task does not declare", m)
					}
					return v // its default, or a value as the caller would pass
				}))
			}
			cmd, rest, err := NewRootCommand().Find(args)
			if err != nil || cmd.Name() != strings.Split(name, "-")[0] {
				t.Fatalf("%v does not find the %s command: %v", args[:2], name, err)
			}
			if err := cmd.ParseFlags(rest); err != nil {
				t.Fatalf("berth %s rejects the Task's flags: %v", cmd.Name(), err)
			}
			if err := cmd.ValidateRequiredFlags(); err != nil {
				t.Fatalf("the Task leaves a required flag unset: %v", err)
			}
		})
	}
}
