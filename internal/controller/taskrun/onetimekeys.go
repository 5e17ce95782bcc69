package taskrun

import (
	"context"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/otp/keyserver"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// OneTimeKeys hands tasks a one-time token for their key instead of the key (the OTP option):
// the key is kept sealed in Keys, and the task redeems the token once at URL, whose
// certificate CA signs. See docs/otp.md.
type OneTimeKeys struct {
	Keys *keyserver.Store
	// URL is the full URL tasks POST their token to, /otp included.
	URL string
	// CA reads the CA certificate of the server's certificate, current at each call (a
	// rotated CA reaches the next task's secret).
	CA func() ([]byte, error)
}

// secretFor is the secret of a task whose build user is ready: its key, or with the OTP
// option a token for it. The key is kept before the secret is written, and bound to the record
// and its build user: a crash before the secret is written leaves a key whose token nobody
// has, which the record's next build user (see redo) or its end makes unredeemable, and the
// sweeper deletes.
func (k *keyring) secretFor(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, userDir string, private []byte) (*corev1.Secret, error) {
	host := rec.Status.BuildUser + "@" + rec.Status.Login.Address
	if k.otp == nil {
		return tasksecret.ForHost(ownerOf(tr), tasksecret.Name(tr.Name), host, userDir, private), nil
	}
	ca, err := k.otp.CA()
	if err != nil {
		return nil, err
	}
	token, err := k.keptToken(ctx, tr, rec, private)
	if err != nil {
		return nil, err
	}
	if token == "" {
		// One key of a record is redeemable at a time: one kept by an earlier pass whose
		// secret was not written goes first.
		if err := k.revoke(ctx, rec); err != nil {
			return nil, err
		}
		tok, err := k.otp.Keys.Put(ctx, private, bindingOf(rec), "")
		if err != nil {
			return nil, err
		}
		token = tok.String()
	}
	return tasksecret.ForOTP(ownerOf(tr), tasksecret.Name(tr.Name), token, k.otp.URL, ca, host, userDir), nil
}

// keptToken is the token of the task's secret if an earlier pass wrote it for this build user
// and its key is still kept ("" if not): the secret written again holds the same token, so a
// pod that started in between and read it still gets its key.
func (k *keyring) keptToken(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation, private []byte) (string, error) {
	s, err := k.secrets.of(ctx, tr.Namespace, tr.Name)
	if err != nil || s == nil || !ownedBy(s, tr.UID) || len(s.Data["otp"]) == 0 {
		return "", err
	}
	token := string(s.Data["otp"])
	if held, err := k.otp.Keys.Holds(ctx, token, *bindingOf(rec), private); err != nil || !held {
		return "", err
	}
	return token, nil
}

func bindingOf(rec *berthv1.Allocation) *keyserver.Binding {
	return &keyserver.Binding{Allocation: rec.Name, AllocationUID: rec.UID, BuildUser: rec.Status.BuildUser,
		Namespace: rec.Spec.TaskRun.Namespace}
}

// revoke deletes the record's unredeemed keys: its task ended, its secret was tampered
// with, or its build user is being replaced. Were this cut short, the redemption still refuses
// them (it checks the record), and the sweeper deletes them.
func (k *keyring) revoke(ctx context.Context, rec *berthv1.Allocation) error {
	if k.otp == nil {
		return nil
	}
	return k.otp.Keys.Revoke(ctx, rec.Name)
}

// CachedAttempts tells the key server which attempt a record's TaskRun is in from the manager's
// cache (keyserver.Attempts), so that a replayed token of a retried task costs the apiserver
// nothing. Tekton writes an attempt into the TaskRun's status before it makes the attempt's pod,
// and the cache has it moments later. A replica that does not lead lists the records and
// TaskRuns at its first redemption of a retried task's key; until it has, the apiserver is
// asked.
type CachedAttempts struct {
	Cache     cache.Cache
	Namespace string
}

// Attempt is the attempt the TaskRun of record is in, if the cache holds both.
func (a CachedAttempts) Attempt(ctx context.Context, record string) (int, bool) {
	for _, obj := range []client.Object{&berthv1.Allocation{}, &pipelinev1.TaskRun{}} {
		informer, err := a.Cache.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
		if err != nil || !informer.HasSynced() {
			return 0, false
		}
	}
	var rec berthv1.Allocation
	if err := a.Cache.Get(ctx, client.ObjectKey{Namespace: a.Namespace, Name: record}, &rec); err != nil {
		return 0, false
	}
	ref := rec.Spec.TaskRun
	var tr pipelinev1.TaskRun
	if err := a.Cache.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &tr); err != nil || tr.UID != ref.UID {
		return 0, false
	}
	return attemptOf(&tr), true
}
