package taskgen

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	yaml "go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden.yaml with what Generate makes now")

// golden compares got with testdata/<name>.golden.yaml, or writes it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden.yaml")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./internal/taskgen -update writes it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("the remote Task differs from %s (after a deliberate change, go test ./internal/taskgen -update rewrites it):\n%s",
			path, firstDifference(string(want), string(got)))
	}
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func generate(t *testing.T, in []byte, o Options) []byte {
	t.Helper()
	out, err := Generate(in, o)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func decode(t *testing.T, data []byte) *pipelinev1.Task {
	t.Helper()
	var task pipelinev1.Task
	if err := sigsyaml.UnmarshalStrict(data, &task); err != nil {
		t.Fatal(err)
	}
	return &task
}

func TestBuildahTwin(t *testing.T) {
	in := read(t, "buildah.yaml")
	out := generate(t, in, Options{})
	golden(t, "buildah-remote", out)

	task := decode(t, out)
	if task.Name != "buildah-remote" {
		t.Errorf("name %q, want buildah-remote", task.Name)
	}
	build := task.Spec.Steps[0]
	scriptIsBash(t, build.Script)
	original := decode(t, in).Spec.Steps[0].Script
	if !strings.Contains(build.Script, "\n"+original+"BERTH_STEP_SCRIPT\n") {
		t.Errorf("the build step's own script is not in the rewritten one word for word")
	}
	if build.Image != decode(t, in).Spec.Steps[0].Image {
		t.Errorf("the build step's image changed to %s without RunnerImage", build.Image)
	}
}

func scriptIsBash(t *testing.T, script string) {
	t.Helper()
	cmd := exec.Command("bash", "-n")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("bash -n of the rewritten script: %v\n%s", err, out)
	}
}

// What taskgen does not rewrite is in the twin byte for byte: steps, params, results,
// volumes, the rewritten step's other fields, every comment; and the twin has no lines
// beyond the ones taskgen adds.
func TestUnchangedPartsAreByteIdentical(t *testing.T) {
	in := read(t, "buildah.yaml")
	out := string(generate(t, in, Options{}))
	src, err := parseSource(string(in))
	if err != nil {
		t.Fatal(err)
	}
	span := func(n *yaml.Node) string {
		end, err := src.itemEnd(n)
		if err != nil {
			t.Fatal(err)
		}
		return src.text[src.lineStarts[n.Line-1]:end]
	}
	_, spec := get(src.root, "spec")
	for _, key := range []string{"params", "results", "steps", "volumes", "workspaces"} {
		_, seq := get(spec, key)
		for _, item := range seq.Content {
			if _, name := get(item, "name"); key == "steps" && name.Value == "build" {
				continue
			}
			if s := span(item); !strings.Contains(out, s) {
				t.Errorf("%s item at line %d is not in the twin as it was:\n%s", key, item.Line, s)
			}
		}
	}
	_, steps := get(spec, "steps")
	build := steps.Content[0]
	for i := 0; i+1 < len(build.Content); i += 2 {
		if k, v := build.Content[i], build.Content[i+1]; k.Value != "script" {
			s := src.text[src.lineStarts[k.Line-1]:src.entryEnd(k, v)]
			if !strings.Contains(out, s) {
				t.Errorf("the build step's %s is not in the twin as it was:\n%s", k.Value, s)
			}
		}
	}
	for _, key := range []string{"stepTemplate", "description"} {
		k, v := get(spec, key)
		if s := src.text[src.lineStarts[k.Line-1]:src.entryEnd(k, v)]; !strings.Contains(out, s) {
			t.Errorf("spec.%s is not in the twin as it was:\n%s", key, s)
		}
	}
	k, v := get(build, "script")
	scriptFirst, scriptLast := k.Line, strings.Count(src.text[:src.entryEnd(k, v)], "\n")
	var comments int
	for i, l := range strings.Split(src.text, "\n") {
		if n := i + 1; strings.HasPrefix(strings.TrimSpace(l), "#") && (n < scriptFirst || n > scriptLast) {
			comments++
			if !strings.Contains(out, l+"\n") {
				t.Errorf("comment %q is gone", l)
			}
		}
	}
	if comments < 5 {
		t.Fatalf("only %d comments in the input: the check proves little", comments)
	}

	// The input's lines, less the name and the build step's script, are the twin's lines in
	// order, and the twin's others are the ones taskgen adds.
	_, meta := get(src.root, "metadata")
	nameKey, _ := get(meta, "name")
	var kept []string
	for i, l := range strings.Split(src.text, "\n") {
		if n := i + 1; n != nameKey.Line && (n < scriptFirst || n > scriptLast) {
			kept = append(kept, l)
		}
	}
	outLines := strings.Split(out, "\n")
	j := 0
	for _, l := range outLines {
		if j < len(kept) && l == kept[j] {
			j++
		}
	}
	if j < len(kept) {
		t.Fatalf("input line %q is not in the twin in its place", kept[j])
	}
	script := decode(t, []byte(out)).Spec.Steps[0].Script
	added := []int{1, 1 + strings.Count(script, "\n"), 3, 4, 3} // name, script, param, volume, mount
	want := 0
	for _, n := range added {
		want += n
	}
	if got := len(outLines) - len(kept); got != want {
		t.Errorf("the twin has %d lines the input lacks, want %d (name, script, param, volume, mount)", got, want)
	}
}

// A Task written in the other common style (sequences indented under their key), with no
// params or volumes to extend, two steps rewritten and every option set.
func TestOptionsAndIndentedStyle(t *testing.T) {
	in := read(t, "go-build.yaml")
	out := generate(t, in, Options{
		Steps:                []string{"compile", "test"},
		Name:                 "go-build-on-host",
		RunnerImage:          "quay.io/konflux-ci/task-runner:1.6.0",
		HostImage:            "docker.io/library/golang:1.26-bookworm",
		KeepCredentialsInPod: true,
		HostEpilogue:         "go vet ./...",
		PodEpilogue:          "#!/bin/bash\nls bin",
	})
	golden(t, "go-build-on-host", out)
	task := decode(t, out)
	for i, name := range []string{"compile", "test"} {
		step := task.Spec.Steps[i]
		scriptIsBash(t, step.Script)
		if step.Name != name || step.Image != "quay.io/konflux-ci/task-runner:1.6.0" {
			t.Errorf("step %d: %s in %s, want %s in the runner image", i, step.Name, step.Image, name)
		}
		if !strings.Contains(step.Script, " docker.io/library/golang:1.26-bookworm /bin/sh -c '\"$0\" \"$@\" && exec /tekton/scripts/"+name+"-epilogue.sh' /tekton/scripts/"+name+".sh ") {
			t.Errorf("step %s does not run the host image", name)
		}
		if strings.Contains(step.Script, ".docker") {
			t.Errorf("step %s sends the registry credentials to the host", name)
		}
		if !strings.Contains(step.Script, "\n#!/bin/sh\nset -e\ngo vet ./...\n") || !strings.Contains(step.Script, "\n#!/bin/bash\nls bin\n") {
			t.Errorf("step %s lacks the epilogues", name)
		}
	}
	if !strings.Contains(task.Spec.Steps[0].Script, "args+=(--user=1000:1000)") {
		t.Errorf("the compile step's runAsUser/runAsGroup are not podman's --user")
	}
	if task.Spec.Steps[2].Script != "echo done" {
		t.Errorf("the report step changed: %q", task.Spec.Steps[2].Script)
	}
}

func TestRefusals(t *testing.T) {
	buildah := string(read(t, "buildah.yaml"))
	edit := func(old, new string) string {
		if !strings.Contains(buildah, old) {
			t.Fatalf("testdata/buildah.yaml has no %q", old)
		}
		return strings.Replace(buildah, old, new, 1)
	}
	for _, tc := range []struct {
		name  string
		in    string
		opts  Options
		wants string
	}{
		{"not a Task", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n", Options{}, `not a Tekton Task: its kind is "ConfigMap"`},
		{"v1beta1", edit("tekton.dev/v1\n", "tekton.dev/v1beta1\n"), Options{}, "apiVersion is tekton.dev/v1beta1"},
		{"two documents", buildah + "---\n" + buildah, Options{}, "more than one YAML document"},
		{"CRLF", strings.ReplaceAll(buildah, "\n", "\r\n"), Options{}, "line endings"},
		{"not YAML", "kind: [", Options{}, "not YAML"},
		{"invalid Task", edit("- name: push", "- name: Push_It"), Options{}, "fails Tekton's validation"},
		{"unknown field", edit("  workspaces:\n", "  workspace:\n  - name: x\n  workspaces:\n"), Options{}, "does not read as a tekton.dev/v1 Task"},
		{"no such step", buildah, Options{Steps: []string{"compile"}}, `no step "compile"; its steps are build, push, sbom-syft-generate, upload-sbom`},
		{"step twice", buildah, Options{Steps: []string{"build", "build"}}, `step "build" is named twice`},
		{"PLATFORM already", edit("  - name: IMAGE\n", "  - name: PLATFORM\n    type: string\n  - name: IMAGE\n"), Options{}, "has a PLATFORM param already"},
		{"berth's secret already", edit("  - name: shared\n    emptyDir: {}\n", "  - name: shared\n    emptyDir: {}\n  - name: keys\n    secret:\n      secretName: multi-platform-ssh-$(context.taskRun.name)\n"), Options{}, "mounts berth's secret"},
		{"a volume named ssh", edit("  - name: shared\n    emptyDir: {}\n", "  - name: shared\n    emptyDir: {}\n  - name: ssh\n    emptyDir: {}\n"), Options{}, `volume named "ssh" already`},
		{"command step", mini("    command: [make, image]\n"), Options{}, "it has no script"},
		{"step results", mini("    script: echo x > $(step.results.out.path)\n    results:\n    - name: out\n"), Options{}, "step results"},
		{"envFrom", edit("    env:\n    - name: TASKRUN_NAME", "    envFrom:\n    - configMapRef:\n        name: settings\n    env:\n    - name: TASKRUN_NAME"), Options{Steps: []string{"push"}}, "envFrom"},
		{"step exit codes", edit("      set -euo pipefail\n      sbom_digest", "      set -euo pipefail\n      cat $(steps.step-push.exitCode.path)\n      sbom_digest"), Options{Steps: []string{"upload-sbom"}}, "$(steps."},
		{"a mount at /ssh", edit("    - mountPath: /entitlement\n", "    - mountPath: /ssh\n"), Options{}, "at /ssh"},
		{"unknown scratch volume", buildah, Options{Scratch: []string{"cache"}}, `scratch volume "cache"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Generate([]byte(tc.in), tc.opts)
			switch {
			case err == nil:
				t.Fatalf("no error; want one saying %q", tc.wants)
			case !strings.Contains(err.Error(), tc.wants):
				t.Fatalf("%v; want it to say %q", err, tc.wants)
			}
		})
	}
}

// mini is a Task with one step, build, of the given fields beyond name and image.
func mini(fields string) string {
	return "apiVersion: tekton.dev/v1\nkind: Task\nmetadata:\n  name: t\nspec:\n  steps:\n  - name: build\n    image: alpine\n" + fields
}

// However the step's script is written, the rewritten step carries it word for word, and a
// comment after it stays.
func TestScriptForms(t *testing.T) {
	for _, tc := range []struct{ name, field, script string }{
		{"literal", "    script: |\n      echo one\n\n      echo two\n", "echo one\n\necho two\n"},
		{"literal with header comment", "    script: |-  # build it\n      echo one\n", "echo one"},
		{"kept final newlines", "    script: |+\n      echo one\n\n    workingDir: /w\n", "echo one\n\n"},
		{"folded", "    script: >\n      echo\n      one\n", "echo one\n"},
		{"plain with comment", "    script: echo 'it''s'  # quick\n", "echo 'it''s'"},
		{"double-quoted", "    script: \"printf '%s\\\\n' \\\"$HOME\\\" # not a comment\"  # a comment\n", "printf '%s\\n' \"$HOME\" # not a comment"},
		{"double-quoted over lines", "    script: \"echo one\n      two\"  # gone with it\n", "echo one two"},
		{"plain below its key", "    script:\n      echo one\n", "echo one"},
		{"last, no final newline", "    script: echo done", "echo done"},
		{"heredoc marker inside", "    script: |\n      cat <<'BERTH_STEP_SCRIPT'\n      x\n      BERTH_STEP_SCRIPT\n", "cat <<'BERTH_STEP_SCRIPT'\nx\nBERTH_STEP_SCRIPT\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := mini(tc.field)
			if got := decode(t, []byte(in)).Spec.Steps[0].Script; got != tc.script {
				t.Fatalf("the test's script reads as %q, want %q", got, tc.script)
			}
			out := string(generate(t, []byte(in), Options{}))
			script := decode(t, []byte(out)).Spec.Steps[0].Script
			scriptIsBash(t, script)
			own := tc.script
			if !strings.HasSuffix(own, "\n") {
				own += "\n"
			}
			if !strings.Contains(script, "\n#!/bin/sh\nset -e\n"+own+"BERTH_STEP_SCRIPT") {
				t.Errorf("the step's script is not carried word for word:\n%s", script)
			}
			if i := strings.Index(tc.field, "  # "); i >= 0 && !strings.Contains(tc.name, "over lines") {
				if comment, _, _ := strings.Cut(tc.field[i:], "\n"); !strings.Contains(out, comment+"\n") {
					t.Errorf("comment %q is gone:\n%s", comment, out)
				}
			}
		})
	}
}

// Flow-style sequences cannot take an item by a text edit: taskgen says so.
func TestFlowStyleIsRefusedClearly(t *testing.T) {
	in := strings.Replace(mini("    script: echo\n"), "spec:\n", "spec:\n  params: []\n", 1)
	_, err := Generate([]byte(in), Options{})
	if err == nil || !strings.Contains(err.Error(), "params is empty or written in flow style") {
		t.Fatalf("%v", err)
	}
}

// shellWord's words reach bash as the very strings, once Tekton has replaced its references.
func TestShellWord(t *testing.T) {
	tekton := strings.NewReplacer("$(workspaces.source.path)", "/workspace/source", "$(params.X)", "/x")
	for _, s := range []string{"/shared", "it's", `a "b" $HOME \ ` + "`x`", "line\nbreak", "$(workspaces.source.path)/sub dir", `$(params.X)'s "$y"`} {
		w, err := shellWord(s)
		if err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("bash", "-c", "printf %s "+tekton.Replace(w)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != tekton.Replace(s) {
			t.Errorf("%q quoted as %s reads back as %q", s, w, out)
		}
	}
	if _, err := shellWord("a\x00b"); err == nil {
		t.Error("a NUL quoted")
	}
}

// firstDifference shows the lines of want and got around their first difference.
func firstDifference(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	from := max(0, i-3)
	return "want:\n" + strings.Join(w[from:min(len(w), i+5)], "\n") + "\ngot:\n" + strings.Join(g[from:min(len(g), i+5)], "\n")
}
