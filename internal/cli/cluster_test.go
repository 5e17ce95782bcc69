package cli

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	tektonconfig "github.com/tektoncd/pipeline/pkg/apis/config"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// installServiceCRDs installs the CRDs of the space and cluster-templates services
// (../shared/real/crds) that the cluster commands talk to.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// clusterTasks are the Tasks of config/tasks/cluster, by file name.
func clusterTasks(t *testing.T) map[string]*pipelinev1.Task {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "config", "tasks", "cluster")
	var kustomization struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(raw, &kustomization); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var listed []string
	for _, f := range files {
		if filepath.Base(f) != "kustomization.yaml" {
			listed = append(listed, filepath.Base(f))
		}
	}
	slices.Sort(kustomization.Resources)
	if !slices.Equal(kustomization.Resources, listed) {
		t.Fatalf("the kustomization lists %v, the directory holds %v", kustomization.Resources, listed)
	}
	tasks := map[string]*pipelinev1.Task{}
	for _, f := range listed {
		raw, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		var kind struct{ Kind string }
		if err := yaml.Unmarshal(raw, &kind); err != nil {
			t.Fatal(err)
		}
		if kind.Kind == "ClusterRole" {
			continue // the tenant's RBAC for the Tasks, checked where they run
		}
		var task pipelinev1.Task
		if err := yaml.UnmarshalStrict(raw, &task); err != nil {
			t.Fatalf("%s is not a Tekton v1 Task: %v", f, err)
		}
		tasks[f] = &task
	}
	return tasks
}

// The ephemeral-cluster Tasks run in tenants' namespaces, not berth's: they stay out of the
// kustomization of berth's own host Tasks.
func TestClusterTasksAreNotBerthsHostTasks(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "tasks", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "cluster") {
		t.Fatalf("config/tasks/kustomization.yaml includes the cluster Tasks:\n%s", raw)
	}
}

// The cluster Tasks must be what Tekton accepts (its own validation, stable API fields only) and
// the apiserver stores, reference only what they declare, keep the contract their users rely on
// (param and result names, the wait → diagnose → fail order), and run `berth cluster ...`
// command lines that the real CLI parses with every required flag.
func TestClusterTasksAreValidAndRunTheClusterCommands(t *testing.T) {
	tasks := clusterTasks(t)
	contract := map[string]struct {
		params, results, workspaces []string
		steps                       []string
	}{
		"provision-space.yaml": {
			params:  []string{"tierName", "ownerKind", "ownerName", "ownerUid", "api", "timeout", "image"},
			results: []string{"secretRef", "namespace"},
			steps:   []string{"provision-space"},
		},
		"ephemeral-cluster.yaml": {
			params: []string{"eaasSpaceSecretRef", "spaceNamespace", "template", "version", "instanceType", "timeout",
				"credentialsSecret", "parameters", "image"},
			results:    []string{"clusterName", "apiServerURL", "kubeconfig"},
			workspaces: []string{"credentials"},
			steps:      []string{"provision", "wait", "diagnose", "kubeconfig", "require-ready"},
		},
	}
	if len(tasks) != len(contract) {
		t.Fatalf("want the Tasks %v, found %d", slices.Collect(maps.Keys(contract)), len(tasks))
	}
	image := deploymentImage(t)
	ns := "cluster-tasks-check"
	if err := cp.EnsureNamespace(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	for file, want := range contract {
		t.Run(file, func(t *testing.T) {
			task := tasks[file]
			if task == nil {
				t.Fatalf("no %s", file)
			}
			ctx := tektonconfig.ToContext(context.Background(), stableTekton(t))
			checked := task.DeepCopy()
			checked.SetDefaults(ctx)
			if err := checked.Validate(ctx); err != nil {
				t.Fatalf("Tekton rejects the Task: %v", err)
			}

			if got := names(task.Spec.Params, func(p pipelinev1.ParamSpec) string { return p.Name }); !slices.Equal(got, want.params) {
				t.Errorf("params %v, want %v", got, want.params)
			}
			if got := names(task.Spec.Results, func(r pipelinev1.TaskResult) string { return r.Name }); !slices.Equal(got, want.results) {
				t.Errorf("results %v, want %v", got, want.results)
			}
			if got := names(task.Spec.Workspaces, func(w pipelinev1.WorkspaceDeclaration) string { return w.Name }); !slices.Equal(got, want.workspaces) {
				t.Errorf("workspaces %v, want %v", got, want.workspaces)
			}
			if got := names(task.Spec.Steps, func(s pipelinev1.Step) string { return s.Name }); !slices.Equal(got, want.steps) {
				t.Errorf("steps %v, want %v", got, want.steps)
			}
			for _, p := range task.Spec.Params {
				if p.Name == "image" && (p.Default == nil || p.Default.StringVal != image) {
					t.Errorf("the image param defaults to %v, the controller runs %s", p.Default, image)
				}
			}

			checkReferences(t, task)
			for _, step := range task.Spec.Steps {
				runsClusterCommand(t, task, step)
			}

			stored := task.DeepCopy()
			stored.Namespace = ns
			if err := cp.Client.Create(context.Background(), stored); err != nil {
				t.Fatalf("the apiserver refused the Task: %v", err)
			}
		})
	}

	// A failed wait goes on to diagnose, and the Task still fails at its end.
	steps := tasks["ephemeral-cluster.yaml"].Spec.Steps
	if steps[1].OnError != pipelinev1.Continue || steps[2].OnError != pipelinev1.Continue {
		t.Errorf("wait and diagnose must continue on error, got %q and %q", steps[1].OnError, steps[2].OnError)
	}
	for _, s := range steps[2:] {
		if !slices.Contains(s.Args, "--wait-exit-code-file=$(steps.step-wait.exitCode.path)") {
			t.Errorf("step %s does not read the wait step's exit code", s.Name)
		}
	}
	if last := steps[len(steps)-1]; last.OnError != "" || !slices.Contains(last.Args, "require-ready") {
		t.Errorf("the last step must fail the Task when the wait failed, got %s", last.Name)
	}
}

func names[T any](items []T, name func(T) string) []string {
	var out []string
	for _, i := range items {
		out = append(out, name(i))
	}
	return out
}

// stableTekton is a Tekton configuration with only stable API fields enabled: the Tasks must
// run on any Tekton installation.
func stableTekton(t *testing.T) *tektonconfig.Config {
	t.Helper()
	flags, err := tektonconfig.NewFeatureFlagsFromMap(map[string]string{"enable-api-fields": tektonconfig.StableAPIFields})
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := tektonconfig.NewDefaultsFromMap(map[string]string{})
	if err != nil {
		t.Fatal(err)
	}
	return &tektonconfig.Config{FeatureFlags: flags, Defaults: defaults}
}

// deploymentImage is the image config/manager/deployment.yaml runs the controller from.
func deploymentImage(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "config", "manager", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+image:\s*(\S+)\s*$`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatal("no image in config/manager/deployment.yaml")
	}
	return m[1]
}

var variable = regexp.MustCompile(`\$\(([^)]*)\)`)

// checkReferences holds every $(...) in the Task to what it declares: its params (arrays only
// whole, as [*]), results, workspaces, the TaskRun's context, and the exit code of an earlier
// step that continues on error.
func checkReferences(t *testing.T, task *pipelinev1.Task) {
	t.Helper()
	known := map[string]bool{"context.taskRun.name": true, "context.taskRun.namespace": true, "context.taskRun.uid": true}
	for _, p := range task.Spec.Params {
		if p.Type == pipelinev1.ParamTypeArray {
			known["params."+p.Name+"[*]"] = true
		} else {
			known["params."+p.Name] = true
		}
	}
	for _, r := range task.Spec.Results {
		known["results."+r.Name+".path"] = true
	}
	for _, w := range task.Spec.Workspaces {
		known["workspaces."+w.Name+".path"] = true
	}
	check := func(where, s string) {
		for _, m := range variable.FindAllStringSubmatch(s, -1) {
			if !known[m[1]] {
				t.Errorf("%s uses $(%s), which the Task does not declare", where, m[1])
			}
		}
	}
	strs := func(where string, c *pipelinev1.Step) {
		check(where+" image", c.Image)
		for _, s := range append(slices.Clone(c.Command), c.Args...) {
			check(where, s)
		}
		for _, e := range c.Env {
			check(where+" env "+e.Name, e.Value)
		}
		for _, v := range c.VolumeMounts {
			check(where+" volume mount", v.Name+" "+v.MountPath)
		}
	}
	if tmpl := task.Spec.StepTemplate; tmpl != nil {
		check("stepTemplate image", tmpl.Image)
		for _, v := range tmpl.VolumeMounts {
			check("stepTemplate volume mount", v.Name+" "+v.MountPath)
		}
	}
	for _, v := range task.Spec.Volumes {
		if v.Secret != nil {
			check("volume "+v.Name, v.Secret.SecretName)
		}
	}
	for i := range task.Spec.Steps {
		step := &task.Spec.Steps[i]
		strs("step "+step.Name, step)
		// Later steps may read this one's exit code, if it lets them run after a failure.
		if step.OnError == pipelinev1.Continue {
			known["steps.step-"+step.Name+".exitCode.path"] = true
		}
	}
}

// runsClusterCommand parses a step's command line with the real CLI, each variable replaced by
// the param's default or a value as a caller would pass it.
func runsClusterCommand(t *testing.T, task *pipelinev1.Task, step pipelinev1.Step) {
	t.Helper()
	if !slices.Equal(step.Command, []string{"berth"}) {
		t.Fatalf("step %s runs %v, not berth", step.Name, step.Command)
	}
	values := map[string][]string{
		"context.taskRun.name": {"it-run-x7k2p"}, "context.taskRun.namespace": {"tenant"}, "context.taskRun.uid": {"6a1f3c2e-8b4d-4e5f-9a7c-1d2e3f4a5b6c"},
	}
	for _, p := range task.Spec.Params {
		switch {
		case p.Type == pipelinev1.ParamTypeArray:
			values["params."+p.Name+"[*]"] = []string{"fips=true", "imageContentSources=-"}
		case p.Default != nil:
			values["params."+p.Name] = []string{p.Default.StringVal}
		default:
			values["params."+p.Name] = []string{"given"}
		}
	}
	for _, r := range task.Spec.Results {
		values["results."+r.Name+".path"] = []string{"/tekton/results/" + r.Name}
	}
	for _, w := range task.Spec.Workspaces {
		values["workspaces."+w.Name+".path"] = []string{"/workspace/" + w.Name}
	}
	var args []string
	for _, a := range step.Args {
		if m := variable.FindStringSubmatch(a); m != nil && m[0] == a && strings.HasSuffix(m[1], "[*]") {
			args = append(args, values[m[1]]...) // an array param expands into separate arguments
			continue
		}
		args = append(args, variable.ReplaceAllStringFunc(a, func(v string) string {
			name := v[2 : len(v)-1]
			if strings.HasPrefix(name, "steps.") {
				return "/tekton/steps/" + strings.Split(name, ".")[1] + "/exitCode"
			}
			if v, ok := values[name]; ok {
				return v[0]
			}
			return "undeclared" // checkReferences reports it
		}))
	}
	cmd, rest, err := NewRootCommand().Find(args)
	if err != nil || cmd.Parent() == nil || cmd.Parent().Name() != "cluster" {
		t.Fatalf("step %s: %v is not a berth cluster command: %v", step.Name, args, err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("step %s: berth cluster %s rejects the Task's flags: %v", step.Name, cmd.Name(), err)
	}
	if err := cmd.ValidateRequiredFlags(); err != nil {
		t.Errorf("step %s leaves a required flag unset: %v", step.Name, err)
	}
	if err := cmd.ValidateFlagGroups(); err != nil {
		t.Errorf("step %s: %v", step.Name, err)
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		t.Errorf("step %s: berth cluster %s rejects its arguments: %v", step.Name, cmd.Name(), err)
	}
}

// The commands as the Tasks' steps run them, against services whose state the test sets: each
// writes its Tekton results, the gated steps act only on the wait step's verdict, and
// deprovision gives everything back.
func TestClusterCommandsRunAsTaskSteps(t *testing.T) {
	ctx := context.Background()
	tenant, space := "cluster-steps", "cluster-steps-space"
	for _, ns := range []string{tenant, space} {
		if err := cp.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	result := func(name string) string { return filepath.Join(dir, "result-"+name) }
	readResult := func(name string) string {
		raw, err := os.ReadFile(result(name))
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	tenantArgs := []string{"--kubeconfig", kubeconfig, "--namespace", tenant}
	spaceArgs := append([]string{"--space-secret", "space-kubeconfig", "--space-namespace", space}, tenantArgs...)

	// The space service has served the SpaceRequest of an earlier try of this TaskRun.
	run := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "it-run"},
		Spec: pipelinev1.TaskRunSpec{TaskRef: &pipelinev1.TaskRef{Name: "berth-provision-space"}}}
	sr := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "toolchain.dev.openshift.com/v1alpha1", "kind": "SpaceRequest",
		"metadata": map[string]any{"namespace": tenant, "name": "it-run"}, "spec": map[string]any{"tierName": "appstudio-env"}}}
	secrets := []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "space-kubeconfig"}, Data: map[string][]byte{"kubeconfig": cp.KubeConfig}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "my-aws"}, Data: map[string][]byte{"aws_secret_access_key": []byte("not-a-real-key")}},
	}
	for _, o := range append([]client.Object{run, sr}, secrets...) {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	sr.Object["status"] = map[string]any{
		"namespaceAccess": []any{map[string]any{"name": space, "secretRef": "space-kubeconfig"}},
		"conditions":      []any{map[string]any{"type": "Ready", "status": "True", "reason": "Provisioned"}},
	}
	if err := cp.Client.Status().Update(ctx, sr); err != nil {
		t.Fatal(err)
	}
	out, err := berth(t, append([]string{"cluster", "provision-space", "--space-request", "it-run", "--tier", "appstudio-env",
		"--owner-kind", "TaskRun", "--owner-name", "it-run", "--owner-uid", string(run.UID),
		"--result-secret-ref-file", result("secretRef"), "--result-namespace-file", result("namespace")}, tenantArgs...)...)
	if err != nil {
		t.Fatalf("provision-space: %v\n%s", err, out)
	}
	if readResult("secretRef") != "space-kubeconfig" || readResult("namespace") != space {
		t.Fatalf("provision-space results: secretRef %q, namespace %q", readResult("secretRef"), readResult("namespace"))
	}

	makeTemplate := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "clustertemplate.openshift.io/v1alpha1", "kind": "ClusterTemplate",
		"metadata": map[string]any{"name": "hypershift-aws-byoc"}, "spec": map[string]any{"clusterDefinition": "hypershift", "cost": int64(1)}}}
	if err := cp.Client.Create(ctx, makeTemplate); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	out, err = berth(t, append([]string{"cluster", "provision", "--cluster-name", "it-run", "--template", "hypershift-aws-byoc",
		"--version", "4.17.3", "--instance-type", "", "--timeout", "30m", "--credentials-secret", "my-aws",
		"--result-cluster-name-file", result("clusterName")}, append(spaceArgs, "--", "fips=true")...)...)
	if err != nil {
		t.Fatalf("provision: %v\n%s", err, out)
	}
	if readResult("clusterName") != "it-run" {
		t.Fatalf("clusterName result %q", readResult("clusterName"))
	}
	cti := &unstructured.Unstructured{}
	cti.SetAPIVersion("clustertemplate.openshift.io/v1alpha1")
	cti.SetKind("ClusterTemplateInstance")
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: space, Name: "it-run"}, cti); err != nil {
		t.Fatal(err)
	}
	params, _, _ := unstructured.NestedSlice(cti.Object, "spec", "parameters")
	wantParams := []any{
		map[string]any{"name": "version", "value": "4.17.3"}, map[string]any{"name": "timeout", "value": "30m"},
		map[string]any{"name": "fips", "value": "true"}, map[string]any{"name": "credentialsSecret", "value": "my-aws"},
	}
	if !equalJSON(params, wantParams) {
		t.Errorf("the instance's parameters are %v, want %v", params, wantParams)
	}
	if strings.Contains(out, "not-a-real-key") {
		t.Fatalf("provision printed the credentials:\n%s", out)
	}

	// The service makes the cluster.
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Namespace: space, Name: "it-run-kubeconfig"}, Data: map[string][]byte{"kubeconfig": []byte("cluster kubeconfig")}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: space, Name: "it-run-admin"}, Data: map[string][]byte{"username": []byte("kubeadmin"), "password": []byte("hunter2-but-longer")}},
	} {
		if err := cp.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	cti.Object["status"] = map[string]any{"phase": "Ready", "message": "", "apiServerURL": "https://api.it-run.example:6443",
		"kubeconfig": map[string]any{"name": "it-run-kubeconfig"}, "adminPassword": map[string]any{"name": "it-run-admin"},
		"conditions": []any{map[string]any{"type": "Ready", "status": "True", "reason": "Ready", "message": "up", "lastTransitionTime": metav1.Now().UTC().Format("2006-01-02T15:04:05Z")}}}
	if err := cp.Client.Status().Update(ctx, cti); err != nil {
		t.Fatal(err)
	}
	out, err = berth(t, append([]string{"cluster", "wait", "--cluster-name", "it-run", "--timeout", "1m", "--poll-interval", "100ms"}, spaceArgs...)...)
	if err != nil || !strings.Contains(out, "cluster it-run is ready: https://api.it-run.example:6443") {
		t.Fatalf("wait: %v\n%s", err, out)
	}

	exitCode := func(code string) string {
		path := filepath.Join(dir, "exitCode-"+code)
		if err := os.WriteFile(path, []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	out, err = berth(t, append([]string{"cluster", "diagnose", "--cluster-name", "it-run", "--wait-exit-code-file", exitCode("0")}, spaceArgs...)...)
	if err != nil || !strings.Contains(out, "nothing to diagnose") {
		t.Fatalf("diagnose after a successful wait: %v\n%s", err, out)
	}
	out, err = berth(t, append([]string{"cluster", "diagnose", "--cluster-name", "it-run", "--wait-exit-code-file", exitCode("1")}, spaceArgs...)...)
	if err != nil || !strings.Contains(out, "phase:      Ready") {
		t.Fatalf("diagnose after a failed wait: %v\n%s", err, out)
	}

	credentials := filepath.Join(dir, "credentials")
	out, err = berth(t, append([]string{"cluster", "kubeconfig", "--cluster-name", "it-run", "--credentials-dir", credentials,
		"--wait-exit-code-file", exitCode("1")}, spaceArgs...)...)
	if err != nil || !strings.Contains(out, "has no credentials to write") {
		t.Fatalf("kubeconfig after a failed wait: %v\n%s", err, out)
	}
	if _, err := os.Stat(credentials); !os.IsNotExist(err) {
		t.Fatalf("kubeconfig wrote credentials after a failed wait: %v", err)
	}
	out, err = berth(t, append([]string{"cluster", "kubeconfig", "--cluster-name", "it-run", "--credentials-dir", credentials,
		"--result-api-url-file", result("apiServerURL"), "--result-kubeconfig-file", result("kubeconfig"),
		"--wait-exit-code-file", exitCode("0")}, spaceArgs...)...)
	if err != nil {
		t.Fatalf("kubeconfig: %v\n%s", err, out)
	}
	if readResult("apiServerURL") != "https://api.it-run.example:6443" || readResult("kubeconfig") != "it-run/kubeconfig" {
		t.Fatalf("kubeconfig results: apiServerURL %q, kubeconfig %q", readResult("apiServerURL"), readResult("kubeconfig"))
	}
	if raw, err := os.ReadFile(filepath.Join(credentials, readResult("kubeconfig"))); err != nil || string(raw) != "cluster kubeconfig" {
		t.Fatalf("the kubeconfig result does not lead to the kubeconfig: %q, %v", raw, err)
	}
	if strings.Contains(out, "hunter2") || strings.Contains(out, "cluster kubeconfig") {
		t.Fatalf("kubeconfig printed a credential:\n%s", out)
	}

	if out, err := berth(t, append([]string{"cluster", "require-ready", "--cluster-name", "it-run", "--wait-exit-code-file", exitCode("0")}, spaceArgs...)...); err != nil {
		t.Fatalf("require-ready after a successful wait: %v\n%s", err, out)
	}
	_, err = berth(t, append([]string{"cluster", "require-ready", "--cluster-name", "it-run", "--wait-exit-code-file", exitCode("1")}, spaceArgs...)...)
	if err == nil || !strings.Contains(err.Error(), "cluster it-run did not become ready (the wait step exited with 1); it is in phase Ready") {
		t.Fatalf("require-ready after a failed wait: %v", err)
	}

	out, err = berth(t, append([]string{"cluster", "deprovision", "--cluster-name", "it-run", "--space-request", "it-run", "--timeout", "1m", "--poll-interval", "100ms"}, spaceArgs...)...)
	if err != nil {
		t.Fatalf("deprovision: %v\n%s", err, out)
	}
	for _, o := range []client.Object{cti, sr} {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
			t.Errorf("%s %s is still there after deprovision: %v", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
}

func equalJSON(a, b any) bool {
	ja, _ := yaml.Marshal(a)
	jb, _ := yaml.Marshal(b)
	return string(ja) == string(jb)
}
