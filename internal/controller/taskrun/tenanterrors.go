package taskrun

import (
	"context"
	"errors"
	"fmt"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/hostops"
	"github.com/berth-ci/berth/internal/incident"
)

// hostFailed tells of a failed attempt on a host in two voices, joined by a fresh reference:
// the TaskRun's owner learns the kind of failure (an Event on the TaskRun, in its namespace);
// the operator learns what actually went wrong, which may name admin users, addresses, host
// key fingerprints or what a script printed (an Event on the record, in berth's namespace,
// and the log line).
func (p *provisionPhase) hostFailed(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, host, reason string, cause error, detail string) {
	ref := incident.NewRef()
	tellRecord(ctx, p.recorder, rec, host, corev1.EventTypeWarning, reason, "host %s (%s): %s; the task tries another host", host, ref, detail)
	kind := incident.Provisioning(cause)
	if errors.Is(cause, hostops.ErrUserExists) {
		kind = "a build user of that name was left there by an attempt cut short"
	}
	p.recorder.Eventf(tr, nil, corev1.EventTypeWarning, reason, reason, "%s", incident.Note(fmt.Sprintf(
		"host %s: %s; trying another host. If no host works, %s", host, kind, ref.Where(p.namespace))))
}
