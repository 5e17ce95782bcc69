package taskrun

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MetadataPatch is metadataPatch as the bytes berth sends, for the tests on the apiserver.
func MetadataPatch(before, after *metav1.ObjectMeta) ([]byte, error) {
	return json.Marshal(metadataPatch(before, after))
}

// TestFailed is testFailed.
var TestFailed = testFailed
