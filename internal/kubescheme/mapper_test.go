package kubescheme_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/restmapper"

	"github.com/berth-ci/berth/internal/kubescheme"
)

// countingMapper answers from a discovery mapper of groups, once it is told they exist, and
// counts what it was asked.
type countingMapper struct {
	meta.RESTMapper
	asked int
	known bool
}

func (c *countingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	c.asked++
	if !c.known {
		return nil, &meta.NoKindMatchError{GroupKind: gk, SearchedVersions: versions}
	}
	return c.RESTMapper.RESTMapping(gk, versions...)
}

var taskRunKind = schema.GroupKind{Group: "tekton.dev", Kind: "TaskRun"}

func TestAMappingFoundIsNotLookedUpAgain(t *testing.T) {
	delegate := &countingMapper{RESTMapper: discoveryMapper(), known: true}
	m := kubescheme.Remembering(delegate)
	first, err := m.RESTMapping(taskRunKind, "v1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := m.RESTMapping(taskRunKind, "v1")
	if err != nil {
		t.Fatal(err)
	}
	if first != again || delegate.asked != 1 {
		t.Fatalf("the second lookup asked the delegate again (asked %d times) or answered differently", delegate.asked)
	}
	if first.Resource.Resource != "taskruns" || first.Scope.Name() != meta.RESTScopeNameNamespace {
		t.Fatalf("mapping %v, scope %s: want taskruns, namespaced", first.Resource, first.Scope.Name())
	}
	// Another version list is another question.
	if _, err := m.RESTMapping(taskRunKind); err != nil || delegate.asked != 2 {
		t.Fatalf("asked %d times, err %v: a lookup without versions must reach the delegate", delegate.asked, err)
	}
}

func TestAKindNotFoundIsLookedUpAgain(t *testing.T) {
	delegate := &countingMapper{RESTMapper: discoveryMapper()}
	m := kubescheme.Remembering(delegate)
	if _, err := m.RESTMapping(taskRunKind, "v1"); !meta.IsNoMatchError(err) {
		t.Fatalf("err %v: want the delegate's no-match", err)
	}
	delegate.known = true // the CRD is installed now
	mapping, err := m.RESTMapping(taskRunKind, "v1")
	if err != nil || mapping.Resource.Resource != "taskruns" {
		t.Fatalf("mapping %v, err %v: a kind that appears later must be found", mapping, err)
	}
	if delegate.asked != 2 {
		t.Fatalf("asked %d times: want 2", delegate.asked)
	}
}

// BenchmarkRESTMapping compares a lookup of the dynamic mapper's shape (one discovery mapper
// over the groups a berth controller reads) with the remembering one.
func BenchmarkRESTMapping(b *testing.B) {
	for _, c := range []struct {
		name   string
		mapper meta.RESTMapper
	}{{"discovery", discoveryMapper()}, {"remembering", kubescheme.Remembering(discoveryMapper())}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.mapper.RESTMapping(taskRunKind, "v1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// discoveryMapper is what controller-runtime's dynamic mapper builds from discovery, for the
// groups berth's controller uses.
func discoveryMapper() meta.RESTMapper {
	group := func(name, version string, resources ...metav1.APIResource) *restmapper.APIGroupResources {
		gv := metav1.GroupVersionForDiscovery{GroupVersion: version, Version: version}
		if name != "" {
			gv.GroupVersion = name + "/" + version
		}
		return &restmapper.APIGroupResources{
			Group:              metav1.APIGroup{Name: name, Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv},
			VersionedResources: map[string][]metav1.APIResource{version: resources},
		}
	}
	res := func(name, kind string, namespaced bool) metav1.APIResource {
		return metav1.APIResource{Name: name, Kind: kind, Namespaced: namespaced}
	}
	return restmapper.NewDiscoveryRESTMapper([]*restmapper.APIGroupResources{
		group("", "v1", res("secrets", "Secret", true), res("configmaps", "ConfigMap", true), res("namespaces", "Namespace", false)),
		group("coordination.k8s.io", "v1", res("leases", "Lease", true)),
		group("events.k8s.io", "v1", res("events", "Event", true)),
		group("berth.dev", "v1alpha1", res("allocations", "Allocation", true), res("buildhosts", "BuildHost", true)),
		group("tekton.dev", "v1", res("taskruns", "TaskRun", true), res("tasks", "Task", true)),
	})
}
