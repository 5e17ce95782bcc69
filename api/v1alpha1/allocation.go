package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Phase is where an allocation stands.
type Phase string

const (
	// PhaseWaiting: every host of the platform is busy; the task is queued.
	PhaseWaiting Phase = "Waiting"
	// PhaseProvisioning: a slot is reserved and the record names the host and the build user
	// before anything is done on the host (reserving and provisioning are one write). It stays
	// so while the task runs: once the task's secret carries berth's seal for the build user
	// (see SealKey), the user is ready.
	PhaseProvisioning Phase = "Provisioning"
	// PhaseReady: the build user exists and the task's secret holds its key. berth writes it
	// only for a TaskRun it adopted from the controller it replaced; a record of its own
	// stays Provisioning, and its sealed secret tells that the user is ready (see SealKey).
	PhaseReady Phase = "Ready"
	// PhaseCleaning: the task has ended; the record holds what is still owed to hosts. It is
	// written only when a debt outlives a pass (a clean failed): a record that holds a slot
	// for a TaskRun that has ended owes its build user all the same.
	PhaseCleaning Phase = "Cleaning"
)

// TaskRunRef names the user TaskRun an allocation serves. The UID tells a TaskRun from a
// later one re-created under the same name.
type TaskRunRef struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
}

// Key is namespace/name.
func (r TaskRunRef) Key() string { return r.Namespace + "/" + r.Name }

// HostLogin is how berth reaches a host as its admin, copied from the config when the slot was
// reserved, so that cleanup works whatever the config says later.
type HostLogin struct {
	// Host is the host's name in the config (host.<name>.*).
	Host    string `json:"host"`
	Address string `json:"address"`
	// AdminUser logs in with the key in AdminSecret (key id_rsa) of the controller's namespace.
	AdminUser   string `json:"adminUser"`
	AdminSecret string `json:"adminSecret"`
	// HostKey is the host's pinned SSH key, if the config pins one.
	HostKey string `json:"hostKey,omitempty"`
	// Platform is the platform the host serves (it decides how users are made there).
	Platform string `json:"platform"`
	// Instance is the cloud instance id when the host is a VM berth launched: once its record
	// is gone, the VM is too, and nothing is owed to it any more.
	Instance string `json:"instance,omitempty"`
}

// Debt is a build user that must be removed from a host.
type Debt struct {
	HostLogin `json:",inline"`
	BuildUser string `json:"buildUser"`
	// HoldsSlot is set when the debt keeps a slot of the host busy until the user is gone.
	HoldsSlot bool `json:"holdsSlot,omitempty"`
	// RetryAt is when the user's clean is tried again after it failed: no attempt starts before,
	// whatever wakes the record, and a restarted berth keeps the wait. Unset for a debt not yet
	// tried.
	RetryAt *MicroTime `json:"retryAt,omitempty"`
}

// AllocationSpec is what the task asked for; it does not change.
type AllocationSpec struct {
	TaskRun  TaskRunRef `json:"taskRun"`
	Platform string     `json:"platform"`
	// Strategy is how the platform is served (static, dynamic, ...).
	Strategy string `json:"strategy"`
	// Queued orders waiters of a namespace: first queued, first served.
	Queued metav1.Time `json:"queued"`
}

// AllocationStatus is berth's bookkeeping, written before each step on a host.
type AllocationStatus struct {
	Phase Phase `json:"phase,omitempty"`
	// Login is the host the task holds a slot of, with how to reach it.
	Login *HostLogin `json:"login,omitempty"`
	// BuildUser is the task's user on that host; its name carries the TaskRun's UID and the
	// attempt, so no two attempts or TaskRuns ever share one.
	BuildUser string `json:"buildUser,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`
	UserDir   string `json:"userDir,omitempty"`
	// TaskRunAttempt is the attempt of its TaskRun berth last saw (1 + the length of its
	// status.retriesStatus): Tekton retries a failed attempt in place, and every attempt keeps
	// the task's host and build user. Unset until the first retry.
	TaskRunAttempt int `json:"taskRunAttempt,omitempty"`
	// FailedHosts are hosts whose provisioning failed for this task.
	FailedHosts []string `json:"failedHosts,omitempty"`
	// Debts are build users still to be removed: from earlier attempts, and the task's own
	// once it has ended. The record goes only when none is left.
	Debts []Debt `json:"debts,omitempty"`
	// SealKey keys the seal berth puts on the task's secret (an HMAC of its data, its build
	// user and attempt): a secret that carries a valid seal was written by berth for the
	// current build user, which is how a record that holds a slot tells, after a restart,
	// that its build user was made and handed over without a write of its own. It is made
	// when the slot is reserved and never leaves berth's namespace.
	SealKey []byte `json:"sealKey,omitempty"`
	// SecretDigest is the SHA-256 of the error berth wrote into the task's secret once the
	// tenant changed the secret (see SecretTampered), or of what an earlier version wrote.
	SecretDigest string `json:"secretDigest,omitempty"`
	// SecretTampered is set once the tenant changed or deleted the secret: the host is never
	// touched again for this user except to remove it.
	SecretTampered bool `json:"secretTampered,omitempty"`
	// Message is the last error, for people.
	Message string `json:"message,omitempty"`
	// CleanFailures counts failed clean attempts in a row; it spaces out retries (each failed
	// debt's RetryAt).
	CleanFailures int `json:"cleanFailures,omitempty"`
	// When the task got a slot, when its secret was handed over, and when it ended: to the
	// microsecond, so that latencies measured from them are not whole seconds.
	ReservedAt *MicroTime `json:"reservedAt,omitempty"`
	ReadyAt    *MicroTime `json:"readyAt,omitempty"`
	EndedAt    *MicroTime `json:"endedAt,omitempty"`
}

// Allocation records one user TaskRun that holds or waits for capacity. Its name is the
// TaskRun's UID.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=alloc
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.taskRun.namespace`
// +kubebuilder:printcolumn:name="TaskRun",type=string,JSONPath=`.spec.taskRun.name`
// +kubebuilder:printcolumn:name="Platform",type=string,JSONPath=`.spec.platform`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.status.login.host`
// +kubebuilder:printcolumn:name="User",type=string,JSONPath=`.status.buildUser`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.message`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Allocation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AllocationSpec   `json:"spec"`
	Status AllocationStatus `json:"status,omitempty"`
}

// AllocationList is a list of Allocations.
//
// +kubebuilder:object:root=true
type AllocationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Allocation `json:"items"`
}

func init() { SchemeBuilder.Register(&Allocation{}, &AllocationList{}) }
