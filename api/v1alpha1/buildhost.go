package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BuildHostSpec is what an operator decides about a host.
type BuildHostSpec struct {
	// HostName is the host's name in the config (the record's name may differ: it must be a
	// DNS name). Empty on a VM's record, whose own name is the host's.
	HostName string `json:"hostName,omitempty"`
	// Drained hosts take no new task; running tasks finish (berth host drain / undrain).
	Drained bool `json:"drained,omitempty"`
	// Forget asks berth to drop every build user still owed to this host (berth host forget):
	// for a host that is gone for good. berth clears it once done and leaves the host drained.
	Forget bool `json:"forget,omitempty"`
	// Instance is set on the record of a VM berth launched: what it asked the cloud for. The
	// record is written before the cloud is called, so a VM is never launched unrecorded.
	Instance *InstanceSpec `json:"instance,omitempty"`
}

// InstanceSpec is berth's intent for one VM.
type InstanceSpec struct {
	Platform string `json:"platform"`
	// Provider is the platform's provider type when the VM was launched (aws, local-vm, ...).
	Provider string `json:"provider"`
	// Settings are the provider's settings the VM was launched with (region, ami, the names
	// of Secrets; never their contents). berth reaches the VM through them for its whole life,
	// so a config change (another region, account or cloud) cannot lose a running VM.
	Settings map[string]string `json:"settings,omitempty"`
	// AdminUser and AdminSecret are how berth logs in to the VM (the provider's user and the
	// platform's ssh-secret), copied at launch so that cleanup works whatever the config says
	// later.
	AdminUser   string `json:"adminUser"`
	AdminSecret string `json:"adminSecret"`
	// Slots is how many tasks the VM takes at once (a pool's concurrency, else 1).
	Slots int `json:"slots"`
	// Pooled VMs are reused by many tasks; the others serve one task each and go.
	Pooled bool `json:"pooled,omitempty"`
	// Attempt numbers the launches of this record: the cloud's idempotency token is the
	// record's UID and the attempt, so a relaunch after a lost instance gets a new VM and a
	// repeated call after a crash gets the same one.
	Attempt int `json:"attempt"`
	// Fallback is which of the platform's instance types this launch asks for: 0 the
	// configured one, i the i-th of its fallbacks (fallback-instance-types), taken when the
	// types before had no capacity. It is part of the launch token, so each type is asked
	// under a token of its own.
	Fallback int `json:"fallback,omitempty"`
	// Retire stops the VM taking new tasks; it is terminated once its last task is cleaned.
	Retire string `json:"retire,omitempty"`
}

// InstancePhase is where a VM is in its life.
type InstancePhase string

const (
	// InstanceLaunching: recorded; the cloud is being asked for it.
	InstanceLaunching InstancePhase = "Launching"
	// InstanceBooting: the cloud gave an instance id; berth waits for its address and SSH.
	InstanceBooting InstancePhase = "Booting"
	// InstanceReady: berth logged in and pinned its host key; it takes tasks.
	InstanceReady InstancePhase = "Ready"
	// InstanceTerminating: being terminated; the record goes once the cloud confirms.
	InstanceTerminating InstancePhase = "Terminating"
)

// InstanceStatus is what berth has seen of the VM.
type InstanceStatus struct {
	Phase InstancePhase `json:"phase,omitempty"`
	ID    string        `json:"id,omitempty"`
	// HostKey is the key the VM presented at berth's first login (or the configured one): the
	// only key accepted from it afterwards.
	HostKey string `json:"hostKey,omitempty"`
	// To the microsecond: the boot time measured from them is not whole seconds.
	LaunchedAt *MicroTime `json:"launchedAt,omitempty"`
	ReadyAt    *MicroTime `json:"readyAt,omitempty"`
	// InstanceType is the instance type that served, when the platform lists fallbacks.
	InstanceType string `json:"instanceType,omitempty"`
	// Failures counts failed cloud calls in a row; it spaces out retries (RetryAt).
	Failures int `json:"failures,omitempty"`
	// RetryAt is when a launch or terminate the cloud failed is asked again: no call is made
	// before, whatever wakes the record, and a restarted berth keeps the wait. Unset until a
	// call fails, and again when the phase moves on.
	RetryAt *MicroTime `json:"retryAt,omitempty"`
	Message string     `json:"message,omitempty"`
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
	// Leftovers are build users whose clean fails on what they left on the host (a process
	// that would not die, a path that would not go). Each keeps only its own slot, owed and
	// counted against its namespace, while its clean is retried; they never quarantine the
	// host. An entry goes once its user is removed, or forgotten with the host.
	Leftovers []Leftover `json:"leftovers,omitempty"`
	// Instance is set on a VM's record.
	Instance *InstanceStatus `json:"instance,omitempty"`
	// ObservedGeneration is the metadata.generation of the spec this status was computed from:
	// a drain, undrain or retirement is not reflected yet while it is behind.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions are Ready, Quarantined and Draining (see SetConditions), kept alongside the
	// fields above, which they summarise.
	//
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Leftover is a build user whose clean fails on what it left.
type Leftover struct {
	BuildUser string `json:"buildUser"`
	// TaskRun is the namespace/name of the task the user served.
	TaskRun string `json:"taskRun"`
	// What is what the clean could not remove, as the host reported it.
	What string `json:"what"`
	// Failures counts the failed cleans in a row.
	Failures    int         `json:"failures"`
	LastFailure metav1.Time `json:"lastFailure"`
}

// BuildHost records a static host, or a VM berth launched, that berth serves from.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bhost
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.spec.hostName`
// +kubebuilder:printcolumn:name="Platform",type=string,JSONPath=`.status.platform`
// +kubebuilder:printcolumn:name="VM",type=string,JSONPath=`.status.instance.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Drained",type=boolean,JSONPath=`.spec.drained`
// +kubebuilder:printcolumn:name="Quarantined",type=string,JSONPath=`.status.conditions[?(@.type=="Quarantined")].status`
// +kubebuilder:printcolumn:name="Pending-Cleans",type=integer,JSONPath=`.status.pendingCleans`
// +kubebuilder:printcolumn:name="Why",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Quarantined")].message`,priority=1
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

// Host is the host's name in the ledger and in the records of its tasks: the config's name of a
// static host, the record's own name for a VM.
func (b *BuildHost) Host() string {
	if b.Spec.Instance != nil {
		return b.Name
	}
	return b.Spec.HostName
}
