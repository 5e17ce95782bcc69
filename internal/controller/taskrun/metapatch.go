package taskrun

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The mirrors are written with a JSON patch (RFC 6902) that names only what berth changes and
// tests only what that change rests on: the value of each label or annotation it removes or
// replaces, and the finalizer list it rewrites. A status update by Tekton between berth's read
// and its write (the usual case right after a TaskRun starts or ends) does not refuse it, as a
// resourceVersion precondition would; an edit of the same entries by someone else does.

// patchOp is one operation of a JSON patch.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// testOp asserts the value at path; a nil value asserts that there is none.
func testOp(path string, value any) patchOp { return patchOp{Op: "test", Path: path, Value: value} }

// MarshalJSON writes value for every op but remove: a test of null must say null.
func (p patchOp) MarshalJSON() ([]byte, error) {
	if p.Op == "remove" {
		return json.Marshal(struct {
			Op   string `json:"op"`
			Path string `json:"path"`
		}{p.Op, p.Path})
	}
	return json.Marshal(struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}{p.Op, p.Path, p.Value})
}

// metadataPatch is the JSON patch that turns before's labels, annotations and finalizers into
// after's; nil when they are the same.
func metadataPatch(before, after *metav1.ObjectMeta) []patchOp {
	var ops []patchOp
	ops = append(ops, mapPatch("/metadata/labels", before.Labels, after.Labels)...)
	ops = append(ops, mapPatch("/metadata/annotations", before.Annotations, after.Annotations)...)
	if !slices.Equal(before.Finalizers, after.Finalizers) {
		const path = "/metadata/finalizers"
		ops = append(ops, testOp(path, orNil(before.Finalizers)))
		if len(after.Finalizers) == 0 {
			ops = append(ops, patchOp{Op: "remove", Path: path})
		} else {
			ops = append(ops, patchOp{Op: "add", Path: path, Value: after.Finalizers})
		}
	}
	return ops
}

// mapPatch changes the keys of a string map that differ. A map that is not there yet (nil) is
// added whole, after a test that it is still not there. An empty map that is not nil is one
// the cache cut down (stripTaskRun): the object has one, holding keys berth does not read, so
// keys are added to it one by one.
func mapPatch(path string, before, after map[string]string) []patchOp {
	if maps.Equal(before, after) {
		return nil
	}
	if before == nil {
		return []patchOp{testOp(path, orNil(before)), {Op: "add", Path: path, Value: after}}
	}
	var ops []patchOp
	for _, k := range slices.Sorted(maps.Keys(before)) {
		v, kept := after[k]
		switch {
		case !kept:
			ops = append(ops, testOp(path+"/"+pointerEscape(k), before[k]), patchOp{Op: "remove", Path: path + "/" + pointerEscape(k)})
		case v != before[k]:
			ops = append(ops, testOp(path+"/"+pointerEscape(k), before[k]), patchOp{Op: "replace", Path: path + "/" + pointerEscape(k), Value: v})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, had := before[k]; !had {
			// add sets a member whether or not it is there: a key someone else set meanwhile
			// is berth's mirror to write all the same.
			ops = append(ops, patchOp{Op: "add", Path: path + "/" + pointerEscape(k), Value: after[k]})
		}
	}
	return ops
}

// orNil is v, or nil (a test that nothing is there) when v is empty.
func orNil[T any](v T) any {
	switch x := any(v).(type) {
	case map[string]string:
		if len(x) == 0 {
			return nil
		}
	case []string:
		if len(x) == 0 {
			return nil
		}
	}
	return v
}

// pointerEscape escapes a map key for a JSON pointer (RFC 6901).
func pointerEscape(key string) string {
	return pointerEscaper.Replace(key)
}

// pointerEscaper is made once: a Replacer builds its tables on first use, about 6 KB, and
// every TaskRun patch escapes a few keys. It is safe for concurrent use.
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// testFailed tells a patch refused because it no longer applies (a test failed, or a member it
// removes is gone): what it rests on changed since the cache was read, a conflict like a stale
// resourceVersion. kube-apiserver answers that 422 without details, where a refusal by
// validation names the object and its causes.
func testFailed(err error) bool {
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d == nil || (d.Kind == "" && d.Name == "" && len(d.Causes) == 0)
}
