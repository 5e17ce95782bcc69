package taskrun

import (
	"time"

	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/controller/capacity"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/provision"
)

// The phases of a user task, each holding only what it uses. Reconcile runs the one the
// task's record is in (see reconcileUser); a phase that moves the task on hands it to the next
// in the same pass: admit to reserve, reserve to provision, and a failed provisioning back to
// reserve for another host, so that a task is served without waiting for another reconcile.

// admitPhase decides how a user TaskRun without a record is served: refused, served where it runs, or handed to reserve.
type admitPhase struct {
	gate      gate
	config    *hostconfig.Store
	line      *line
	secrets   *taskSecrets
	mirror    *taskMirror
	records   *recordStore
	reserving *reservePhase
}

// reservePhase takes a slot of a host for a task, or keeps it waiting in line with its place shown; a reserved slot goes on to provisioning at once.
type reservePhase struct {
	capacity     *capacity.Capacity
	strategies   strategies
	keyring      *keyring
	records      *recordStore
	mirror       *taskMirror
	recorder     events.EventRecorder
	now          func() time.Time
	waitTimeout  time.Duration
	answers      *answers
	provisioning *provisionPhase
}

// provisionPhase sees a build user made on the reserved host and its secret handed over; a failed attempt is owed a clean and the task goes back to reserve for another host.
type provisionPhase struct {
	provisioner provision.Provisioner
	config      *hostconfig.Store
	keyring     *keyring
	records     *recordStore
	secrets     *taskSecrets
	capacity    *capacity.Capacity
	debts       *debts
	apiReader   client.Reader
	namespace   string
	recorder    events.EventRecorder
	now         func() time.Time
	reserving   *reservePhase
	guarding    *guardPhase
}

// guardPhase keeps a handed-over secret as berth wrote it: a tenant's edit turns it into an error, and the user is never used again.
type guardPhase struct {
	apiReader client.Reader
	secrets   *taskSecrets
	records   *recordStore
	keyring   *keyring
	mirror    *taskMirror
	recorder  events.EventRecorder
}

// retryPhase follows Tekton's retries of a task: the attempt goes on its record, and its owner hears what the attempt keeps.
type retryPhase struct {
	records  *recordStore
	recorder events.EventRecorder
	oneTime  bool // tasks get one-time tokens (OneTimeKeys), which each attempt redeems
}

// answers answers a task with an error once it cannot be served, and pays what its record still owes.
type answers struct {
	secrets *taskSecrets
	records *recordStore
	debts   *debts
}

// finishPhase lets go of what an ended task held, in an order a crash at any point leaves repairable.
type finishPhase struct {
	capacity *capacity.Capacity
	keyring  *keyring
	secrets  *taskSecrets
	mirror   *taskMirror
	debts    *debts
	now      func() time.Time
}
