// Package contract holds the names berth shares with existing Tekton tasks and configs (the
// multi-platform controller's contract): labels, annotations, params, the finalizer. Nothing
// else in berth spells them out.
package contract

const prefix = "build.appstudio.redhat.com/"

// Labels.
const (
	TaskTypeLabel           = prefix + "task-type" // provision, clean, update on internal TaskRuns
	UserTaskNameLabel       = prefix + "user-task-name"
	UserTaskNamespaceLabel  = prefix + "user-task-namespace"
	AssignedHostLabel       = prefix + "assigned-host"
	TargetPlatformLabel     = prefix + "target-platform"
	WaitingForPlatformLabel = prefix + "waiting-for-platform"
	SecretLabel             = prefix + "multi-platform-secret"
	ConfigLabel             = prefix + "multi-platform-config"
)

// Annotations.
const (
	FailedHostsAnnotation         = prefix + "failed-hosts"
	CloudInstanceIDAnnotation     = prefix + "cloud-instance-id"
	CloudAddressAnnotation        = prefix + "cloud-address"
	CloudFailureCountAnnotation   = prefix + "cloud-failure-count"
	AllocationStartTimeAnnotation = prefix + "allocation-start-time"
)

// QueuePositionAnnotation is berth's own, beside the contract: on a user TaskRun that waits for
// a host, its place in its platform's queue (1 = next). It is rewritten at most once per
// TaskRun every 10 seconds, only when the place moved, and goes when the task is served or
// ends.
const QueuePositionAnnotation = "berth.dev/queue-position"

// Task types of internal TaskRuns.
const (
	TaskTypeProvision = "provision"
	TaskTypeClean     = "clean"
	TaskTypeUpdate    = "update"
)

// Finalizer is on user TaskRuns that hold a host, so cleanup runs before they go.
const Finalizer = "appstudio.io/multi-platform-finalizer"

// PlatformParam is the user TaskRun's param naming its platform.
const PlatformParam = "PLATFORM"

// SecretPrefix starts the name of the secret a user task mounts: SecretPrefix + TaskRun name.
const SecretPrefix = "multi-platform-ssh-"

// Localhost is the assigned host, and the secret's host, of tasks on local platforms.
const Localhost = "localhost"

// PlatformLabelValue is a platform as a label value: '/' becomes '-'.
func PlatformLabelValue(platform string) string {
	out := []byte(platform)
	for i, c := range out {
		if c == '/' {
			out[i] = '-'
		}
	}
	return string(out)
}
