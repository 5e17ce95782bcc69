// Package keyserver is berth's one-time-password key server: a task's private key is kept
// sealed in a Secret of berth's namespace, and handed out once per attempt of its task, over
// HTTPS, to whoever sends the token it was sealed under (POST /otp), as the buildah-remote
// Tasks expect. Keys outlive restarts of the server (they are in the apiserver, not in memory),
// a key is handed out at most once per attempt of its task however many ask at the same moment
// (the write that claims it, a delete or an update, is conditional on the version read), and a key stays redeemable
// only while the task it was made for holds its build user, and for at most a TTL after it was
// stored or, in a later attempt of a TaskRun that Tekton retries, after that attempt started.
// A key stored through POST /store-key has no task: it is handed out once.
package keyserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/otp"
)

// What a kept key's Secret carries besides the sealed key. The token is nowhere: the Secret's
// name is derived from it one way (otp.Token.Name).
const (
	// KeyLabel marks every kept key ("true"), so that they can be listed without any other
	// Secret. It is not berth's task-secret label: kept keys never enter the controller's cache.
	KeyLabel = "berth.dev/otp-key"
	// AllocationLabel names the record (Allocation) of the task a key was made for; a key
	// stored through POST /store-key has none.
	AllocationLabel = "berth.dev/otp-allocation"
	// NamespaceLabel names the namespace of the task a key was made for: the line it waits in
	// for a turn at the apiserver (Turns). Keys kept before it was written have none and share
	// one line.
	NamespaceLabel          = "berth.dev/otp-namespace"
	allocationUIDAnnotation = "berth.dev/otp-allocation-uid"
	buildUserAnnotation     = "berth.dev/otp-build-user"
	expiresAnnotation       = "berth.dev/otp-expires"
	// storedByAnnotation names the ServiceAccount that stored a key through POST /store-key.
	storedByAnnotation = "berth.dev/otp-stored-by"
	// redeemedAttemptAnnotation is the attempt of its TaskRun (1, 2, …) that last redeemed a
	// key bound to a task which Tekton may retry; a key never redeemed has none. It is not
	// sealed with the key: the server writes it without a new seal, and only who can write
	// berth's namespace could change it, which tenants cannot.
	redeemedAttemptAnnotation = "berth.dev/otp-redeemed-attempt"
	sealedKey                 = "sealed"
	// SecretType is the type of a kept key's Secret.
	SecretType corev1.SecretType = "berth.dev/one-time-key"
)

// DefaultTTL is how long a stored key can be redeemed: enough for a task's pod to be scheduled,
// pull its image and reach the step that redeems it; far shorter than a build host is kept.
const DefaultTTL = 30 * time.Minute

// Binding ties a key to the task it was made for: the task's record and the build user the
// key logs in as. The key can be redeemed only while the record holds that user.
type Binding struct {
	// Allocation is the record's name (the TaskRun's UID), AllocationUID the record's own UID:
	// a record dropped and made again is another one.
	Allocation    string
	AllocationUID types.UID
	BuildUser     string
	// Namespace is the TaskRun's, as berth's record names it.
	Namespace string
}

// Why a redemption fails. Each is what the person reading the task's log is told, and none
// tells of a token that was never issued more than "unknown or already used".
var (
	ErrUnknown = errors.New("unknown or already used one-time token: a token is good for one redemption per attempt of its task; start a new build to get another")
	ErrExpired = errors.New("the one-time token has expired: a key is kept only a limited time after berth stores it, or after a retried task's next attempt starts; start a new build")
	ErrEnded   = errors.New("the task this one-time token was issued to has ended or no longer holds its build host, so its key was withdrawn; start a new build")
	// ErrBusy: the index could not tell and its budget of apiserver reads is spent; nothing
	// was decided about the token.
	ErrBusy = errors.New("the key server is catching up with the keys it keeps and cannot check this token right now; try again after the time Retry-After says")
)

// endedError is ErrEnded with what ended, for the log.
type endedError struct{ why string }

func (e endedError) Error() string        { return ErrEnded.Error() + " (" + e.why + ")" }
func (e endedError) Is(target error) bool { return target == ErrEnded }

// Store keeps sealed keys as Secrets of one namespace.
type Store struct {
	// Client reads and writes past any cache: a kept key is never held in a cache, and a
	// redemption must see the apiserver's own version.
	Client    client.Client
	Namespace string
	// TTL is how long a stored key can be redeemed (DefaultTTL when zero).
	TTL time.Duration
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time
	// Index, if set, knows the names of the kept keys: Redeem refuses a token whose name it
	// does not know without asking the apiserver, and Put tells it of a new key at once.
	Index *Index
	// Turns, if set, shares the redemptions that reach the apiserver among the namespaces of
	// their tasks; nil lets every redemption through at once.
	Turns *Turns
	// Attempts, if set (with Index), tells the attempt a task's TaskRun is in without asking
	// the apiserver: a token of a retried task replayed in an attempt that redeemed it already
	// is then refused from memory.
	Attempts Attempts
}

// Attempts tells, from what the process holds and without a request to the apiserver, which
// attempt the TaskRun of a record (named by its TaskRun's UID) is in; ok is false when it cannot
// tell (the record or TaskRun is not held, or not yet listed), and the apiserver is then asked.
type Attempts interface {
	Attempt(ctx context.Context, record string) (attempt int, ok bool)
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Store) ttl() time.Duration {
	if s.TTL > 0 {
		return s.TTL
	}
	return DefaultTTL
}

// Put keeps key sealed under a fresh token and returns the token. bound is the task the key
// belongs to; nil for a key stored through POST /store-key, whose caller (storedBy) answers
// for it and which only its TTL ends.
func (s *Store) Put(ctx context.Context, key []byte, bound *Binding, storedBy string) (otp.Token, error) {
	tok := otp.NewToken()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: tok.Name(), Namespace: s.Namespace,
			Labels: map[string]string{KeyLabel: "true", "app.kubernetes.io/managed-by": "berth"},
			Annotations: map[string]string{
				expiresAnnotation: s.now().Add(s.ttl()).UTC().Format(time.RFC3339),
			},
		},
		Type: SecretType,
	}
	if bound != nil {
		secret.Labels[AllocationLabel] = bound.Allocation
		if bound.Namespace != "" {
			secret.Labels[NamespaceLabel] = bound.Namespace
		}
		secret.Annotations[allocationUIDAnnotation] = string(bound.AllocationUID)
		secret.Annotations[buildUserAnnotation] = bound.BuildUser
	}
	if storedBy != "" {
		secret.Annotations[storedByAnnotation] = storedBy
	}
	secret.Data = map[string][]byte{sealedKey: tok.Seal(key, sealContext(secret))}
	if err := s.Client.Create(ctx, secret); err != nil {
		return otp.Token{}, fmt.Errorf("keeping a one-time key in namespace %s: %w", s.Namespace, err)
	}
	if s.Index != nil {
		s.Index.Add(secret.Name)
	}
	via := "controller"
	if bound == nil {
		via = "store-key"
	}
	stored.WithLabelValues(via).Inc()
	return tok, nil
}

// Holds tells whether the token text still keeps key for the task of bound, redeemable by it
// now or by a later attempt of its TaskRun: unredeemed and unexpired, or redeemed by an attempt
// and kept for the next (that attempt's own window is judged when it redeems; if none comes,
// the task's end deletes the key). A pass that wrote a task's secret and failed after, run
// again, hands out the same token instead of withdrawing one the task may already have read.
// It reads no record and no TaskRun: it answers for the binding it is given.
func (s *Store) Holds(ctx context.Context, text string, bound Binding, key []byte) (bool, error) {
	tok, err := otp.ParseToken(text)
	if err != nil {
		return false, nil
	}
	var secret corev1.Secret
	switch err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: tok.Name()}, &secret); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading the one-time key: %w", err)
	}
	if secret.Labels[KeyLabel] != "true" || secret.Labels[AllocationLabel] != bound.Allocation ||
		secret.Annotations[allocationUIDAnnotation] != string(bound.AllocationUID) || secret.Annotations[buildUserAnnotation] != bound.BuildUser {
		return false, nil
	}
	kept, err := tok.Open(secret.Data[sealedKey], sealContext(&secret))
	if err != nil || !bytes.Equal(kept, key) {
		return false, nil
	}
	switch redeemed, err := redeemedAttempt(&secret); {
	case err != nil:
		return false, nil
	case redeemed > 0:
		return true, nil
	}
	expires, err := time.Parse(time.RFC3339, secret.Annotations[expiresAnnotation])
	return err == nil && s.now().Before(expires), nil
}

// redeemedAttempt is the attempt of its TaskRun that last redeemed a kept key, 0 if none did.
func redeemedAttempt(secret *corev1.Secret) (int, error) {
	v, ok := secret.Annotations[redeemedAttemptAnnotation]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("annotation %s of a kept key is %q, not an attempt", redeemedAttemptAnnotation, v)
	}
	return n, nil
}

// attemptStart is when the TaskRun's current attempt started. Tekton sets status.startTime in
// the reconcile that makes the attempt's pod and writes it with the pod's name, before that pod
// can have reached the step that redeems; should the write have failed and be retried, the end
// of the attempt before stands in, which is never later than the start of the next (Tekton
// starts it at once). Neither known (no Tekton writes such a status): the window cannot be
// counted, and the redemption is refused as expired rather than left unbounded.
func attemptStart(tr *pipelinev1.TaskRun) (time.Time, bool) {
	if tr.Status.StartTime != nil {
		return tr.Status.StartTime.Time, true
	}
	if n := len(tr.Status.RetriesStatus); n > 0 && tr.Status.RetriesStatus[n-1].CompletionTime != nil {
		return tr.Status.RetriesStatus[n-1].CompletionTime.Time, true
	}
	return time.Time{}, false
}

// sealContext is what is sealed with the key besides it: where it is kept, the task it is
// bound to and its expiry. None of it can be changed without the token, so someone who can
// write berth's Secrets can neither extend a key's life nor move it to another task.
func sealContext(s *corev1.Secret) []byte {
	return []byte(strings.Join([]string{s.Namespace, s.Name, s.Labels[AllocationLabel],
		s.Annotations[allocationUIDAnnotation], s.Annotations[buildUserAnnotation], s.Annotations[expiresAnnotation]}, "\x00"))
}

// Redemption is a redeemed key, and the record it was made for ("" for a stored one).
type Redemption struct {
	Key        []byte
	Allocation string
}

// Redeem hands out the key kept under the token text, once per attempt of its task: of any
// number of redemptions of one token in one attempt, only the one whose conditional write of
// the key's Secret (on the version read) succeeds gets the key. If the TaskRun may still be
// retried, that write marks the key with the attempt that redeemed it and keeps it, for the
// next attempt to redeem within a TTL of its start; otherwise (the last attempt, or a task
// without retries) it deletes the key. A token that expired, or whose task ended, fails and
// its key is deleted (unless only this attempt's window passed and a later attempt may still
// come). Errors other than ErrUnknown, ErrExpired, ErrEnded, ErrBusy and otp.ErrMalformed are
// the apiserver's; the key is then still kept. With an Index, a token whose name it does not
// know costs no apiserver request.
func (s *Store) Redeem(ctx context.Context, text string) (Redemption, error) {
	tok, err := otp.ParseToken(text)
	if err != nil {
		return Redemption{}, err
	}
	if s.Index != nil {
		switch s.Index.Knows(tok.Name()) {
		case Unknown:
			return Redemption{}, ErrUnknown
		case Unsure:
			switch {
			case s.Index.awaitCurrent(ctx):
				if s.Index.Knows(tok.Name()) != Known {
					return Redemption{}, ErrUnknown
				}
			case !s.Index.mayRead():
				return Redemption{}, ErrBusy
			}
		}
	}
	if done, refusal := s.closed(ctx, tok.Name()); refusal != nil {
		return done, refusal
	}
	if s.Turns != nil {
		release, err := s.Turns.Take(ctx, s.namespaceOf(tok.Name()))
		if err != nil {
			return Redemption{}, err
		}
		defer release()
	}
	var secret corev1.Secret
	switch err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: tok.Name()}, &secret); {
	case apierrors.IsNotFound(err):
		s.forget(tok.Name())
		return Redemption{}, ErrUnknown
	case err != nil:
		return Redemption{}, fmt.Errorf("reading the one-time key: %w", err)
	}
	if secret.Labels[KeyLabel] != "true" || secret.DeletionTimestamp != nil {
		return Redemption{}, ErrUnknown
	}
	done := Redemption{Allocation: secret.Labels[AllocationLabel]}
	key, err := tok.Open(secret.Data[sealedKey], sealContext(&secret))
	if err != nil {
		// Changed by someone without the token: it can never be redeemed.
		return done, errors.Join(ErrUnknown, s.withdraw(ctx, &secret))
	}
	tr, refusal, err := s.judge(ctx, &secret)
	switch {
	case err != nil:
		return done, err
	case refusal != nil:
		return done, errors.Join(refusal, s.withdraw(ctx, &secret))
	}
	// Tekton makes another attempt if this one fails while fewer than spec.retries failed.
	retriable := tr != nil && tr.IsRetriable()
	if tr != nil {
		switch refusal := s.judgeAttempt(tr, &secret); {
		case refusal != nil && retriable:
			s.closeFor(&secret, contract.Attempt(tr), refusal)
			return done, refusal // the key stays kept for the next attempt
		case refusal != nil:
			return done, errors.Join(refusal, s.withdraw(ctx, &secret))
		}
	}
	// The claim, on the version read: every other redemption of this token in this attempt
	// finds the key gone, changed (a conflict) or marked with this attempt, and gets ErrUnknown.
	if retriable {
		claimed := secret.DeepCopy()
		if claimed.Annotations == nil {
			claimed.Annotations = map[string]string{}
		}
		claimed.Annotations[redeemedAttemptAnnotation] = strconv.Itoa(contract.Attempt(tr))
		switch err := s.Client.Update(ctx, claimed); {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			return done, ErrUnknown
		case err != nil:
			return done, fmt.Errorf("claiming the one-time key: %w", err)
		}
		s.closeFor(&secret, contract.Attempt(tr), ErrUnknown)
		done.Key = key
		return done, nil
	}
	switch err := s.Client.Delete(ctx, &secret, client.Preconditions{UID: &secret.UID, ResourceVersion: &secret.ResourceVersion}); {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return done, ErrUnknown
	case err != nil:
		return done, fmt.Errorf("claiming the one-time key: %w", err)
	}
	s.forget(secret.Name)
	done.Key = key
	return done, nil
}

// closed refuses, without a request to the apiserver, a token whose key the current attempt of
// its TaskRun may not redeem: it did already, or its window passed (closeFor). Only the
// attempt the TaskRun is in is read, from memory (Attempts); a later attempt is judged anew.
// Tekton writes a new attempt into the TaskRun's status before it makes the attempt's pod, so
// the attempt is known here before any step of it can redeem (docs/otp.md).
func (s *Store) closed(ctx context.Context, name string) (Redemption, error) {
	if s.Index == nil || s.Attempts == nil {
		return Redemption{}, nil
	}
	k := s.Index.state(name)
	if k.closed == 0 || k.record == "" {
		return Redemption{}, nil
	}
	if attempt, ok := s.Attempts.Attempt(ctx, k.record); ok && attempt <= k.closed {
		refusedFromMemory.Inc()
		return Redemption{Allocation: k.record}, k.why
	}
	return Redemption{}, nil
}

// namespaceOf is the namespace of the task a key was made for, as the index knows it from the
// key's label ("" when it does not: a key stored through /store-key, one kept before the label,
// or one the index has not seen).
func (s *Store) namespaceOf(name string) string {
	if s.Index == nil {
		return ""
	}
	return s.Index.state(name).namespace
}

// closeFor tells the index that the key may not be redeemed again by attempt or an earlier
// one of its TaskRun, and why.
func (s *Store) closeFor(secret *corev1.Secret, attempt int, why error) {
	if s.Index != nil {
		s.Index.close(secret.Name, secret.Labels[AllocationLabel], attempt, why)
	}
}

// judgeAttempt tells why the current attempt of the key's TaskRun may not redeem it (nil: it
// may): it did already, or it is a later attempt than the one that last redeemed it and
// started more than a TTL ago (a key never redeemed keeps its stored TTL, which judge
// checked).
func (s *Store) judgeAttempt(tr *pipelinev1.TaskRun, secret *corev1.Secret) error {
	redeemed, _ := redeemedAttempt(secret) // judge refused the key if unreadable
	switch attempt := contract.Attempt(tr); {
	case redeemed >= attempt:
		return ErrUnknown
	case redeemed == 0:
		return nil
	}
	start, ok := attemptStart(tr)
	if !ok || !s.now().Before(start.Add(s.ttl())) {
		return ErrExpired
	}
	return nil
}

// judge tells why a kept key may no longer be redeemed (nil: it may), and for a key bound to
// a task, the TaskRun it read. The clock and berth's own records decide whether a key is still
// good; of the TaskRun, a tenant's object, its spec and metadata can only refuse (the moment it
// ends, before the controller has moved its record on), and only its status, which Tekton
// writes and tenants are not granted (Tekton's edit role has taskruns, not taskruns/status),
// lets a key be redeemed again, once per attempt, at most spec.retries times more (see
// Redeem). A key redeemed by an earlier attempt is not refused for its stored TTL: it waits
// for the next attempt, whose window Redeem judges, or for its task's end.
func (s *Store) judge(ctx context.Context, secret *corev1.Secret) (tr *pipelinev1.TaskRun, refusal, err error) {
	name := secret.Labels[AllocationLabel]
	redeemed, perr := redeemedAttempt(secret)
	if perr != nil {
		return nil, ErrUnknown, nil // changed by someone other than berth
	}
	if name == "" || redeemed == 0 {
		expires, perr := time.Parse(time.RFC3339, secret.Annotations[expiresAnnotation])
		if perr != nil || !s.now().Before(expires) {
			return nil, ErrExpired, nil
		}
	}
	if name == "" {
		return nil, nil, nil // stored through /store-key: its TTL is its only bound
	}
	var rec berthv1.Allocation
	switch err := s.Client.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: name}, &rec); {
	case apierrors.IsNotFound(err):
		return nil, endedError{"its record is gone"}, nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading the record the one-time key was made for: %w", err)
	}
	st := rec.Status
	switch {
	case string(rec.UID) != secret.Annotations[allocationUIDAnnotation]:
		return nil, endedError{"its record was replaced"}, nil
	case st.EndedAt != nil || st.Phase == berthv1.PhaseCleaning:
		return nil, endedError{"the task ended"}, nil
	case st.SecretTampered:
		return nil, endedError{"the task's secret was changed or deleted"}, nil
	case st.BuildUser != secret.Annotations[buildUserAnnotation]:
		return nil, endedError{"build user " + secret.Annotations[buildUserAnnotation] + " was replaced"}, nil
	// A record that holds a slot says Provisioning while its task runs (Ready only when
	// adopted); either way it names the user the key logs in as.
	case st.Phase != berthv1.PhaseReady && st.Phase != berthv1.PhaseProvisioning:
		return nil, endedError{"the task holds no build host"}, nil
	}
	ref := rec.Spec.TaskRun
	tr = &pipelinev1.TaskRun{}
	switch err := s.Client.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, tr); {
	case apierrors.IsNotFound(err):
		return nil, endedError{"the TaskRun is gone"}, nil
	case err != nil:
		return nil, nil, fmt.Errorf("reading TaskRun %s: %w", ref.Key(), err)
	case tr.UID != ref.UID:
		return nil, endedError{"the TaskRun is gone"}, nil
	case tr.DeletionTimestamp != nil || tr.IsDone():
		return nil, endedError{"the TaskRun ended"}, nil
	}
	return tr, nil, nil
}

// withdraw deletes a key that may no longer be redeemed.
func (s *Store) withdraw(ctx context.Context, secret *corev1.Secret) error {
	err := s.Client.Delete(ctx, secret, client.Preconditions{UID: &secret.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting a one-time key that can no longer be redeemed: %w", err)
	}
	if !apierrors.IsConflict(err) {
		s.forget(secret.Name)
	}
	return nil
}

// forget drops a key that is gone from the index at once; its watch says so too, a moment
// later.
func (s *Store) forget(name string) {
	if s.Index != nil {
		s.Index.Forget(name)
	}
}

// Revoke deletes every key kept for the record: its task ended, its secret was tampered with,
// or its build user is being replaced.
func (s *Store) Revoke(ctx context.Context, allocation string) error {
	var list corev1.SecretList
	if err := s.Client.List(ctx, &list, client.InNamespace(s.Namespace),
		client.MatchingLabels{KeyLabel: "true", AllocationLabel: allocation}); err != nil {
		return fmt.Errorf("listing the one-time keys of record %s: %w", allocation, err)
	}
	var errs []error
	for i := range list.Items {
		if err := s.withdraw(ctx, &list.Items[i]); err != nil {
			errs = append(errs, err)
			continue
		}
		withdrawn.WithLabelValues("revoked").Inc()
	}
	return errors.Join(errs...)
}
