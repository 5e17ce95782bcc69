package v1alpha1

import (
	"encoding/json"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MicroTime is a time kept to the microsecond, for the moments latencies are measured from
// (a metav1.Time keeps whole seconds). Unlike metav1.MicroTime it also reads the whole-second
// times that records written before these fields were MicroTimes hold, so a berth upgraded in
// place still reads every record it left.
//
// +kubebuilder:validation:Type=string
// +kubebuilder:validation:Format=date-time
type MicroTime struct {
	metav1.MicroTime `json:",inline"`
}

// NewMicroTime wraps t.
func NewMicroTime(t time.Time) MicroTime { return MicroTime{metav1.NewMicroTime(t)} }

// UnmarshalJSON reads an RFC 3339 time with or without its fraction of a second, or null.
func (t *MicroTime) UnmarshalJSON(b []byte) error {
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	if s == nil {
		t.MicroTime = metav1.MicroTime{}
		return nil
	}
	parsed, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil {
		return err
	}
	t.MicroTime = metav1.NewMicroTime(parsed.Local())
	return nil
}

// DeepCopyInto copies t into out; a MicroTime holds no references.
func (t *MicroTime) DeepCopyInto(out *MicroTime) { *out = *t }

// Get is the time t holds, the zero time when t is nil (not set).
func (t *MicroTime) Get() time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.Time
}
