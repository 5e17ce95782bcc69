package devstack

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// The real Konflux eaas steps find, in the images they name, the programs their scripts call.
func TestStepImagesCarryWhatTheRealEaasStepsCall(t *testing.T) {
	contents := map[string][]string{}
	for _, img := range stepImageContents("/berth", "/bin/k8s") {
		for _, p := range img.programs {
			contents[img.image] = append(contents[img.image], p.name)
		}
	}
	for file, calls := range map[string][]string{
		"eaas-create-ephemeral-cluster-hypershift-aws.yaml": {"kubectl", "yq"},
		"eaas-get-ephemeral-cluster-credentials.yaml":       {"oc"},
		"eaas-provision-space.yaml":                         {"oc"},
	} {
		task, err := realdata.Task(file)
		if err != nil {
			t.Fatal(err)
		}
		images := stepImagesOf(t, task)
		if len(images) == 0 {
			t.Fatalf("%s names no step image", file)
		}
		for _, image := range images {
			programs, ok := contents[repository(image)]
			if !ok {
				t.Errorf("%s: the dev stack gives steps of %s nothing", file, image)
				continue
			}
			for _, c := range calls {
				if !slices.Contains(programs, c) {
					t.Errorf("%s: steps of %s find %v, want %s among them", file, image, programs, c)
				}
			}
		}
	}
}

// stepImagesOf is the image of a StepAction, or those of a Task's steps.
func stepImagesOf(t *testing.T, obj *unstructured.Unstructured) []string {
	t.Helper()
	if image, ok, _ := unstructured.NestedString(obj.Object, "spec", "image"); ok {
		return []string{image}
	}
	steps, _, err := unstructured.NestedSlice(obj.Object, "spec", "steps")
	if err != nil {
		t.Fatal(err)
	}
	var images []string
	for _, s := range steps {
		if step, ok := s.(map[string]any); ok {
			if image, ok := step["image"].(string); ok {
				images = append(images, image)
			}
		}
	}
	return images
}

// repository is an image reference without its tag and digest.
func repository(ref string) string {
	ref, _, _ = strings.Cut(ref, "@")
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		ref = ref[:i]
	}
	return ref
}

// An older bin/k8s without yq (or kubectl) still gives the dev stack its step images: the
// images lose only what is missing, and a program a former stack put there does not linger.
func TestStepImagesGoWithoutWhatTestbinLacks(t *testing.T) {
	dir := t.TempDir()
	bins := filepath.Join(dir, "k8s")
	root := filepath.Join(dir, "images")
	berth := filepath.Join(dir, "berth-build")
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(berth, "berth")
	write(filepath.Join(bins, "kubectl"), "kubectl")
	write(filepath.Join(bins, "yq"), "yq")
	// files lists each image's directory as name=content.
	files := func(images map[string]string) map[string]string {
		t.Helper()
		out := map[string]string{}
		for image, d := range images {
			entries, err := os.ReadDir(d)
			if err != nil {
				t.Fatal(err)
			}
			var list []string
			for _, e := range entries {
				path := filepath.Join(d, e.Name())
				content, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
					t.Errorf("%s is not executable", path)
				}
				list = append(list, e.Name()+"="+string(bytes.TrimSpace(content)))
			}
			out[image] = strings.Join(list, " ")
		}
		return out
	}
	check := func(step string, got, want map[string]string) {
		t.Helper()
		for image, w := range want {
			if got[image] != w {
				t.Errorf("%s: %s has %q, want %q", step, image, got[image], w)
			}
		}
		for image, g := range got {
			if _, ok := want[image]; !ok {
				t.Errorf("%s: %s has %q, want no directory", step, image, g)
			}
		}
	}

	images, _, err := copyStepImages(root, stepImageContents(berth, bins))
	if err != nil {
		t.Fatal(err)
	}
	check("full bin/k8s", files(images), map[string]string{
		BerthImage:        "berth=berth",
		KubectlImage:      "kubectl=kubectl",
		OpenShiftCLIImage: "oc=kubectl",
		TaskRunnerImage:   "kubectl=kubectl yq=yq",
	})

	if err := os.Remove(filepath.Join(bins, "yq")); err != nil {
		t.Fatal(err)
	}
	images, _, err = copyStepImages(root, stepImageContents(berth, bins))
	if err != nil {
		t.Fatal(err)
	}
	check("no yq", files(images), map[string]string{
		BerthImage:        "berth=berth",
		KubectlImage:      "kubectl=kubectl",
		OpenShiftCLIImage: "oc=kubectl",
		TaskRunnerImage:   "kubectl=kubectl",
	})

	if err := os.Remove(filepath.Join(bins, "kubectl")); err != nil {
		t.Fatal(err)
	}
	images, _, err = copyStepImages(root, stepImageContents("", bins))
	if err != nil {
		t.Fatal(err)
	}
	check("neither, nor berth", files(images), map[string]string{})

	if _, _, err := copyStepImages(root, stepImageContents(filepath.Join(dir, "nowhere"), bins)); err == nil || !strings.Contains(err.Error(), BerthImage) {
		t.Errorf("a missing berth binary: %v, want an error naming %s", err, BerthImage)
	}
}
