//go:build linux

package tekton

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// The real multi-platform pipeline, as Konflux publishes it, and the names this test takes
// from it: its pipeline task that fans out over the platforms, and the array param that lists
// them.
const (
	realPipelineFile    = "tasks/docker-build-multi-platform-oci-ta-16d92d2b.yaml"
	buildImagesTask     = "build-images"
	buildPlatformsParam = "build-platforms"
	appendPlatformParam = "IMAGE_APPEND_PLATFORM"
)

// givenParams are the values the test's PipelineRun gives the real pipeline's params that have
// no default, as a tenant's PipelineRun must. Only output-image reaches build-images (as IMAGE).
var givenParams = map[string]string{
	"git-url":      "https://git.testground.invalid/tenant/app",
	"output-image": "registry.testground.invalid/tenant/app:built",
}

// taskResultRef is a reference to another pipeline task's result, which only that task's run
// would give a value.
var taskResultRef = regexp.MustCompile(`\$\(tasks\.[^.()]+\.results\.[^()]+\)`)

// The real pipeline's build-images task, as the file has it, run by real Tekton with berth: its
// matrix over PLATFORM, fed from the pipeline's build-platforms array, its params as they are
// (IMAGE_APPEND_PLATFORM among them) and the pipeline's params with their defaults. Over a
// static, a VM and a local platform, each TaskRun is served its own way and cleaned, as in
// TestMatrixPipelineRunServesEachPlatformItsWay, and carries the params Tekton resolved from
// the file.
func TestRealPipelinesMatrixServesEachPlatform(t *testing.T) {
	pipeline := realPipeline(t)
	pt := buildImages(t, pipeline)
	ns := namespace(t)
	create(t, buildTask(ns, pt.TaskRef.Name, paramSpecsOf(t, pt)...))

	pr := &pipelinev1.PipelineRun{
		ObjectMeta: metav1.ObjectMeta{Name: "real-multi-arch", Namespace: ns, Annotations: held()},
		Spec: pipelinev1.PipelineRunSpec{
			Params: runParams(t, pipeline, staticPlatform, vmPlatform, localPlatform),
			// Of the real pipeline only its params and build-images: the other tasks pull
			// images from bundles and push to registries, which the test ground has not, and
			// its results and workspaces belong to those tasks.
			PipelineSpec: &pipelinev1.PipelineSpec{Params: pipeline.Spec.Params, Tasks: []pipelinev1.PipelineTask{pt}},
		},
	}
	create(t, pr)
	runs := taskRunsOf(t, pr, 3)

	// As the file sets it, not as the test's copy of the pipeline task has it.
	want := paramOf(fileTask(pipeline).Params, appendPlatformParam).Value.StringVal
	for platform, tr := range runs {
		if got := stringParam(tr, appendPlatformParam); got != want {
			t.Errorf("%s (%s) has %s %q, want %q as the file sets it", tr.Name, platform, appendPlatformParam, got, want)
		}
		if got := stringParam(tr, "IMAGE"); got != givenParams["output-image"] {
			t.Errorf("%s (%s) has IMAGE %q, want the PipelineRun's output-image %q", tr.Name, platform, got, givenParams["output-image"])
		}
		for _, p := range pt.Params {
			got := paramOf(tr.Spec.Params, p.Name)
			if got == nil {
				t.Errorf("%s (%s) lacks the pipeline task's param %s", tr.Name, platform, p.Name)
				continue
			}
			if left := slices.ContainsFunc(append([]string{got.Value.StringVal}, got.Value.ArrayVal...), func(v string) bool {
				return strings.Contains(v, "$(")
			}); left {
				t.Errorf("%s (%s) has %s = %v, a reference Tekton left unresolved", tr.Name, platform, p.Name, got.Value)
			}
		}
	}
	servedEachItsWay(t, ns, pr, runs)
}

// realPipeline reads the real multi-platform pipeline.
func realPipeline(t *testing.T) *pipelinev1.Pipeline {
	t.Helper()
	raw, err := realdata.File(realPipelineFile)
	if err != nil {
		t.Fatal(err)
	}
	var pipeline pipelinev1.Pipeline
	if err := yaml.Unmarshal(raw, &pipeline); err != nil {
		t.Fatalf("%s: %v", realPipelineFile, err)
	}
	if pipeline.Kind != "Pipeline" {
		t.Fatalf("%s: kind %q, want Pipeline", realPipelineFile, pipeline.Kind)
	}
	return &pipeline
}

// buildImages is the real pipeline's build-images task as the file has it, with only what the
// test ground cannot serve replaced:
//   - its taskRef, a bundle on quay.io, by the test's Task of the same name;
//   - its runAfter, the tasks this test does not run;
//   - every reference to another task's result, by a literal stand-in (logged), as Tekton
//     refuses a reference to a task the pipeline has not.
//
// It fails if the file no longer has the shape this test is about: build-images with a matrix
// over PLATFORM fed from the build-platforms array, and an IMAGE_APPEND_PLATFORM param.
func buildImages(t *testing.T, pipeline *pipelinev1.Pipeline) pipelinev1.PipelineTask {
	t.Helper()
	file := fileTask(pipeline)
	if file == nil {
		t.Fatalf("%s has no pipeline task %s: its shape changed, so must this test", realPipelineFile, buildImagesTask)
	}
	pt := *file.DeepCopy()
	if pt.Matrix == nil {
		t.Fatalf("%s's %s has no matrix: its shape changed, so must this test", realPipelineFile, buildImagesTask)
	}
	platforms := paramOf(pt.Matrix.Params, contract.PlatformParam)
	if platforms == nil || !slices.ContainsFunc(platforms.Value.ArrayVal, func(v string) bool {
		return strings.Contains(v, "$(params."+buildPlatformsParam)
	}) {
		t.Fatalf("%s's %s has no matrix over %s from $(params.%s) (it has %v): its shape changed, so must this test",
			realPipelineFile, buildImagesTask, contract.PlatformParam, buildPlatformsParam, pt.Matrix.Params)
	}
	if spec := paramSpecOf(pipeline.Spec.Params, buildPlatformsParam); spec == nil || spec.Type != pipelinev1.ParamTypeArray {
		t.Fatalf("%s has no array param %s: its shape changed, so must this test", realPipelineFile, buildPlatformsParam)
	}
	if paramOf(pt.Params, appendPlatformParam) == nil {
		t.Fatalf("%s's %s passes no %s: its shape changed, so must this test", realPipelineFile, buildImagesTask, appendPlatformParam)
	}

	pt.TaskRef = &pipelinev1.TaskRef{Name: buildImagesTask}
	pt.RunAfter = nil
	var standIns []string
	standIn := func(v string) string {
		return taskResultRef.ReplaceAllStringFunc(v, func(ref string) string {
			standIns = append(standIns, ref)
			return "stand-in-for-" + strings.Trim(ref, "$()")
		})
	}
	for _, params := range []pipelinev1.Params{pt.Params, pt.Matrix.Params} {
		for j := range params {
			v := &params[j].Value
			v.StringVal = standIn(v.StringVal)
			for k := range v.ArrayVal {
				v.ArrayVal[k] = standIn(v.ArrayVal[k])
			}
		}
	}
	t.Logf("%s's %s: results of other tasks stood in for by literals: %s", realPipelineFile, buildImagesTask, strings.Join(standIns, ", "))
	return pt
}

// fileTask is the pipeline's build-images task as the file has it, or nil.
func fileTask(pipeline *pipelinev1.Pipeline) *pipelinev1.PipelineTask {
	if i := slices.IndexFunc(pipeline.Spec.Tasks, func(pt pipelinev1.PipelineTask) bool { return pt.Name == buildImagesTask }); i >= 0 {
		return &pipeline.Spec.Tasks[i]
	}
	return nil
}

// paramSpecsOf declares every param the pipeline task passes, so that Tekton's validation
// accepts them all: a param the file adds is declared too. A matrix param is a string, one
// value of it per TaskRun; any other has its value's type (an array reference is an array).
func paramSpecsOf(t *testing.T, pt pipelinev1.PipelineTask) []pipelinev1.ParamSpec {
	t.Helper()
	var specs []pipelinev1.ParamSpec
	declare := func(name string, typ pipelinev1.ParamType) {
		if paramSpecOf(specs, name) == nil {
			specs = append(specs, pipelinev1.ParamSpec{Name: name, Type: typ})
		}
	}
	for _, p := range pt.Matrix.Params {
		declare(p.Name, pipelinev1.ParamTypeString)
	}
	for _, inc := range pt.Matrix.Include {
		for _, p := range inc.Params {
			declare(p.Name, pipelinev1.ParamTypeString)
		}
	}
	for _, p := range pt.Params {
		switch p.Value.Type {
		case pipelinev1.ParamTypeString, pipelinev1.ParamTypeArray:
			declare(p.Name, p.Value.Type)
		default:
			t.Fatalf("%s's %s passes %s of type %q: this test declares only strings and arrays", realPipelineFile, pt.Name, p.Name, p.Value.Type)
		}
	}
	return specs
}

// runParams are the PipelineRun's params: build-platforms as given, and a value for each of
// the pipeline's params with no default.
func runParams(t *testing.T, pipeline *pipelinev1.Pipeline, platforms ...string) pipelinev1.Params {
	t.Helper()
	params := pipelinev1.Params{{Name: buildPlatformsParam, Value: pipelinev1.ParamValue{Type: pipelinev1.ParamTypeArray, ArrayVal: platforms}}}
	for _, spec := range pipeline.Spec.Params {
		if spec.Default != nil || spec.Name == buildPlatformsParam {
			continue
		}
		v, ok := givenParams[spec.Name]
		if !ok {
			t.Fatalf("%s's param %s has no default: give it a value in givenParams", realPipelineFile, spec.Name)
		}
		params = append(params, pipelinev1.Param{Name: spec.Name, Value: *pipelinev1.NewStructuredValues(v)})
	}
	return params
}

// stringParam is the TaskRun's string param name, or "" if it has none.
func stringParam(tr *pipelinev1.TaskRun, name string) string {
	if p := paramOf(tr.Spec.Params, name); p != nil {
		return p.Value.StringVal
	}
	return ""
}

func paramOf(params pipelinev1.Params, name string) *pipelinev1.Param {
	if i := slices.IndexFunc(params, func(p pipelinev1.Param) bool { return p.Name == name }); i >= 0 {
		return &params[i]
	}
	return nil
}

func paramSpecOf(specs []pipelinev1.ParamSpec, name string) *pipelinev1.ParamSpec {
	if i := slices.IndexFunc(specs, func(s pipelinev1.ParamSpec) bool { return s.Name == name }); i >= 0 {
		return &specs[i]
	}
	return nil
}
