package taskrun

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strconv"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/tasksecret"
)

// A record that holds a slot is written once, when the slot is reserved; handing the task its
// secret writes the secret and nothing else. The secret then says the build user is ready: it
// carries berth's seal, an HMAC of its data, the build user and the attempt under a key kept
// in the record (SealKey), which a tenant can neither read nor forge. This process remembers
// what it handed over (ready); after a restart, or on a new leader, the seal tells.

// SealAnnotation carries the seal on the task's secret.
const SealAnnotation = "berth.dev/seal"

func newSealKey() ([]byte, error) {
	key := make([]byte, 32)
	_, err := rand.Read(key)
	return key, err
}

// sealOf is the seal of secret data, by its digest, for the record's current build user.
func sealOf(rec *berthv1.Allocation, dataDigest string) []byte {
	m := hmac.New(sha256.New, rec.Status.SealKey)
	m.Write([]byte(rec.Status.BuildUser + "\x00" + strconv.Itoa(rec.Status.Attempt) + "\x00" + dataDigest))
	return m.Sum(nil)
}

// seal puts the record's seal on the secret about to be handed over, and returns the digest of
// its data.
func seal(s *corev1.Secret, rec *berthv1.Allocation) string {
	d := digest(s.Data)
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[SealAnnotation] = base64.StdEncoding.EncodeToString(sealOf(rec, d))
	return d
}

// sealed tells a secret that berth handed over for the record's current build user, given the
// digest of its data: the seal is checked on the digest, so a cached secret (stripSecret)
// needs no data.
func sealed(s *corev1.Secret, rec *berthv1.Allocation, dataDigest string) bool {
	got, err := base64.StdEncoding.DecodeString(s.Annotations[SealAnnotation])
	return err == nil && len(rec.Status.SealKey) > 0 && dataDigest != "" && hmac.Equal(got, sealOf(rec, dataDigest))
}

// HandedOver tells whether s is the secret berth handed over to the task of rec: the record
// holds a slot, and the secret is berth's for that TaskRun and carries the record's seal for
// its current build user. (A record adopted from the controller berth replaces has no seal.)
func HandedOver(s *corev1.Secret, rec *berthv1.Allocation) bool {
	return s != nil && handedOverWith(s, rec, digest(s.Data))
}

// handedOverWith is HandedOver for a secret whose data has the digest dataDigest.
func handedOverWith(s *corev1.Secret, rec *berthv1.Allocation, dataDigest string) bool {
	held := rec.Status.Login != nil && !rec.Status.SecretTampered &&
		(rec.Status.Phase == berthv1.PhaseProvisioning || rec.Status.Phase == berthv1.PhaseReady)
	return held && ownedBy(s, rec.Spec.TaskRun.UID) && sealed(s, rec, dataDigest)
}

// hold serves a task whose record holds a slot: its build user is being made (this process
// has its key), or was handed over (this process wrote the secret, or the secret carries the
// seal), and then the secret is guarded. Neither means a restart cut the making short: the
// user is of no use and is made again (see provision).
func (p *provisionPhase) hold(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (reconcile.Result, error) {
	if rec.Status.SecretTampered {
		return p.guarding.guardSecret(ctx, tr, rec, rec.Status.SecretDigest)
	}
	if _, making := p.keyring.pending.Load(keyID(rec)); making {
		return p.provision(ctx, tr, rec)
	}
	if d, ok := p.keyring.handed.Load(keyID(rec)); ok {
		return p.guarding.guardSecret(ctx, tr, rec, d.(string))
	}
	d, err := p.handedOver(ctx, tr, rec)
	if err != nil {
		return reconcile.Result{}, err
	}
	if d == "" {
		return p.provision(ctx, tr, rec)
	}
	p.keyring.handed.Store(keyID(rec), d)
	return reconcile.Result{}, nil
}

// handedOver is the digest of the task's secret's data if it carries the record's seal (""
// if not). The cache is asked first (it keeps the digest, not the data: stripSecret), then
// the apiserver, which may hold a secret the cache has not seen yet. The direct read happens
// only when the cache does not show the seal: once per task after a restart or a new leader
// at most, while it lags behind berth's own write, or when there is no hand-over to find.
func (p *provisionPhase) handedOver(ctx context.Context, tr *pipelinev1.TaskRun, rec *berthv1.Allocation) (string, error) {
	s, err := p.secrets.of(ctx, tr.Namespace, tr.Name)
	if err != nil {
		return "", err
	}
	if s != nil && handedOverWith(s, rec, cachedDigest(s)) {
		return cachedDigest(s), nil
	}
	var live corev1.Secret
	switch err := p.apiReader.Get(ctx, client.ObjectKey{Namespace: tr.Namespace, Name: tasksecret.Name(tr.Name)}, &live); {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", err
	case HandedOver(&live, rec):
		return digest(live.Data), nil
	}
	return "", nil
}
