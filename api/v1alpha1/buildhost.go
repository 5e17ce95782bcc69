package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BuildHostSpec is what an operator decides about a host.
type BuildHostSpec struct {
	// HostName is the host's name in the config (the record's name may differ: it must be a
	// DNS name).
	HostName string `json:"hostName"`
	// Drained hosts take no new task; running tasks finish (berth host drain / undrain).
	Drained bool `json:"drained,omitempty"`
	// Forget asks berth to drop every build user still owed to this host (berth host forget):
	// for a host that is gone for good. berth clears it once done and leaves the host drained.
	Forget bool `json:"forget,omitempty"`
}

// BuildHostStatus is what berth has seen of the host.
type BuildHostStatus struct {
	Platform string `json:"platform,omitempty"`
	Address  string `json:"address,omitempty"`
	// Quarantined hosts failed a check or their cleanups; a passing check lifts it after
	// the host's pending cleans are done.
	Quarantined      bool         `json:"quarantined,omitempty"`
	QuarantineReason string       `json:"quarantineReason,omitempty"`
	LastCheck        *metav1.Time `json:"lastCheck,omitempty"`
	// PendingCleans counts build users still to be removed from the host.
	PendingCleans int `json:"pendingCleans,omitempty"`
}

// BuildHost records a static host (and, later, a VM) berth serves from.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=bhost
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.spec.hostName`
// +kubebuilder:printcolumn:name="Platform",type=string,JSONPath=`.status.platform`
// +kubebuilder:printcolumn:name="Drained",type=boolean,JSONPath=`.spec.drained`
// +kubebuilder:printcolumn:name="Quarantined",type=boolean,JSONPath=`.status.quarantined`
// +kubebuilder:printcolumn:name="Pending-Cleans",type=integer,JSONPath=`.status.pendingCleans`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.quarantineReason`,priority=1
// +kubebuilder:printcolumn:name="Last-Check",type=date,JSONPath=`.status.lastCheck`
type BuildHost struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   BuildHostSpec   `json:"spec"`
	Status BuildHostStatus `json:"status,omitempty"`
}

// BuildHostList is a list of BuildHosts.
//
// +kubebuilder:object:root=true
type BuildHostList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BuildHost `json:"items"`
}

func init() { SchemeBuilder.Register(&BuildHost{}, &BuildHostList{}) }
