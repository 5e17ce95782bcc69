package taskrun

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tektoncd/pipeline/pkg/apis/pipeline/pod"
	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"
	"knative.dev/pkg/apis"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/contract"
	"github.com/berth-ci/berth/internal/hostconfig"
	"github.com/berth-ci/berth/internal/localaffinity"
	"github.com/berth-ci/berth/internal/otp"
)

// CacheOptions keep the controller's memory independent of what else the cluster holds, and of
// how large a tenant makes its objects: only the secrets berth made, each cut down to what
// berth reads of it (stripSecret; no other secret's data is in this cache; the admin keys are
// held parsed by adminkeys, apart), only the config ConfigMap, records only of its own
// namespace, and TaskRuns cut down to what berth reads (stripTaskRun; unrelated ones to their
// name). Writes never send a cached TaskRun whole, and read back only its metadata: see
// taskMirror.write.
func CacheOptions(namespace string) cache.Options {
	byObject := hostconfig.CacheByObject(namespace)
	// Task secrets live in tenants' namespaces. Admin key secrets in the controller's own may
	// carry the same label (the controller berth replaces requires it on them); they are
	// adminkeys' to hold, as parsed keys: the field selector leaves them out of this cache.
	byObject[&corev1.Secret{}] = cache.ByObject{Label: labels.NewSelector().Add(mustExist(contract.SecretLabel)),
		Field: fields.OneTermNotEqualSelector("metadata.namespace", namespace), Transform: stripSecret}
	byObject[&pipelinev1.TaskRun{}] = cache.ByObject{Transform: func(obj any) (any, error) {
		if tr, ok := obj.(*pipelinev1.TaskRun); ok && tr.Namespace == namespace && tr.Labels[contract.TaskTypeLabel] != "" {
			return stripInternalTaskRun(tr), nil
		}
		return stripTaskRun(obj)
	}}
	own := map[string]cache.Config{namespace: {}}
	byObject[&berthv1.Allocation{}] = cache.ByObject{Namespaces: own}
	byObject[&berthv1.BuildHost{}] = cache.ByObject{Namespaces: own}
	return cache.Options{ByObject: byObject, DefaultTransform: cache.TransformStripManagedFields()}
}

// cachedDigestKey holds, in a cached secret's Data, the digest of the data the secret had
// (see digest). No Secret the apiserver accepts has such a key ('/' is not allowed in one), so
// the value there is always stripSecret's, never a tenant's.
const cachedDigestKey = "berth.dev/data-digest"

// keptOwners bounds the owner references a cached task secret keeps (see stripSecret).
const keptOwners = 4

// sealLength is the length of a well-formed seal: a SHA-256 HMAC in standard base64.
var sealLength = base64.StdEncoding.EncodedLen(sha256.Size)

// stripSecret keeps of a secret carrying berth's label only what berth reads, whatever its
// size: its name and UID, berth's label, its owner reference to the TaskRun it answers, a
// well-formed seal, a well-formed OTP token, and the digest of its data (a tenant may fill any
// labelled secret with 1 MiB of data and 256 KiB of annotations). The seal is checked on the
// digest (sealOf), and a tampering is told by it (guardSecret): neither needs the data.
func stripSecret(obj any) (any, error) {
	s, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	kept := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
		Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion,
		CreationTimestamp: s.CreationTimestamp, DeletionTimestamp: s.DeletionTimestamp,
	}}
	if v, ok := s.Labels[contract.SecretLabel]; ok {
		kept.Labels = map[string]string{contract.SecretLabel: v} // a label value: 63 characters at most
	}
	// berth writes one owner reference, to the TaskRun the secret is named for; any other is
	// not berth's, and a tenant could add thousands. A tenant may put decoys of that name before
	// berth's, so a few distinct ones are kept (keptOwners): more decoys than that only hide
	// berth's ownership of the tenant's own task secret, as removing the reference would.
	name := strings.TrimPrefix(s.Name, contract.SecretPrefix)
	for _, o := range s.OwnerReferences {
		if len(kept.OwnerReferences) == keptOwners {
			break
		}
		if o.Kind == "TaskRun" && o.Name == name && !slices.ContainsFunc(kept.OwnerReferences, func(k metav1.OwnerReference) bool { return k.UID == o.UID }) {
			kept.OwnerReferences = append(kept.OwnerReferences, metav1.OwnerReference{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID})
		}
	}
	kept.Data = map[string][]byte{cachedDigestKey: []byte(digest(s.Data))}
	if seal := s.Annotations[SealAnnotation]; len(seal) == sealLength {
		kept.Annotations = map[string]string{SealAnnotation: seal} // a longer one never verifies
	}
	if token := s.Data["otp"]; len(token) == otp.TokenLength {
		kept.Data["otp"] = token // a longer one is never a kept key's (keptToken)
	}
	return kept, nil
}

// cachedDigest is the digest of a cached secret's data (stripSecret); "" for a secret read
// past the cache, which is then never taken for the one berth wrote.
func cachedDigest(s *corev1.Secret) string { return string(s.Data[cachedDigestKey]) }

func mustExist(key string) labels.Requirement {
	r, err := labels.NewRequirement(key, selection.Exists, nil)
	if err != nil {
		panic(err)
	}
	return *r
}

// stripInternalTaskRun keeps what berth reads of its own internal TaskRuns
// (--provisioner=taskrun): whether it was cancelled, how it ended, its results.
func stripInternalTaskRun(tr *pipelinev1.TaskRun) *pipelinev1.TaskRun {
	tr.ManagedFields = nil
	tr.Spec = pipelinev1.TaskRunSpec{Status: tr.Spec.Status}
	tr.Status = pipelinev1.TaskRunStatus{
		Status: tr.Status.Status,
		TaskRunStatusFields: pipelinev1.TaskRunStatusFields{
			CompletionTime: tr.Status.CompletionTime, Results: tr.Status.Results,
		},
	}
	return tr
}

// Of a user TaskRun's labels and annotations, berth reads only the contract's and its own, and
// patches them with tests of their exact values (metadataPatch): those are kept whole, all
// others dropped. A label value is 63 characters at most; an annotation berth reads that a
// tenant made large is reverted by the mirrors within MirrorRevertInterval.
var (
	taskRunLabelsRead = []string{contract.AssignedHostLabel, contract.TargetPlatformLabel,
		contract.WaitingForPlatformLabel, contract.TaskTypeLabel}
	taskRunAnnotationsRead = []string{contract.QueuePositionAnnotation, contract.FailedHostsAnnotation}
)

// keepKeys is m with only keys; an empty but non-nil map when m had others only, so that a
// patch adds to the map the object has rather than putting a whole new one in its place
// (mapPatch).
func keepKeys(m map[string]string, keys []string) map[string]string {
	if m == nil {
		return nil
	}
	kept := map[string]string{}
	for _, k := range keys {
		if v, ok := m[k]; ok {
			kept[k] = v
		}
	}
	return kept
}

// platformTooLong stands in the cache for a PLATFORM longer than a label value may be: berth
// writes the platform into the target-platform label (contract.PlatformLabelValue), so no
// such platform can be served, and no platform name has angle brackets. The task is answered
// with an error naming it.
var platformTooLong = fmt.Sprintf("<PLATFORM longer than %d characters>", validation.LabelValueMaxLength)

// stripTaskRun keeps what berth reads of a user TaskRun, bounded whatever the TaskRun's size:
// its name, UID and times, the labels and annotations berth reads, its finalizers while they are
// few (keptFinalizers), PLATFORM among its params, spec.status, the verdict of the local-affinity
// check on its pod template (keptAffinity), the first secret volume of its resolved spec that
// names a task secret, and its Succeeded condition without its message. A TaskRun berth does not
// serve keeps its name, times, the labels and annotations berth reads and the same finalizers.
func stripTaskRun(obj any) (any, error) {
	tr, ok := obj.(*pipelinev1.TaskRun)
	if !ok {
		return obj, nil
	}
	kept := &pipelinev1.TaskRun{TypeMeta: tr.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: tr.Name, Namespace: tr.Namespace, UID: tr.UID, ResourceVersion: tr.ResourceVersion,
		Generation: tr.Generation, CreationTimestamp: tr.CreationTimestamp, DeletionTimestamp: tr.DeletionTimestamp,
		Finalizers: keptFinalizers(tr.Finalizers),
		Labels:     keepKeys(tr.Labels, taskRunLabelsRead), Annotations: keepKeys(tr.Annotations, taskRunAnnotationsRead),
	}}
	if p := contract.Platform(tr); p != "" {
		if len(p) > validation.LabelValueMaxLength {
			p = platformTooLong
		}
		kept.Spec.Params = pipelinev1.Params{{Name: contract.PlatformParam, Value: *pipelinev1.NewStructuredValues(p)}}
	}
	if classifyUser(tr) == unrelated && contract.Platform(tr) == "" {
		return kept, nil
	}
	kept.Spec.Status = tr.Spec.Status
	kept.Spec.PodTemplate = keptAffinity(tr, contract.Platform(kept))
	s := &kept.Status
	s.StartTime, s.CompletionTime, s.PodName = tr.Status.StartTime, tr.Status.CompletionTime, tr.Status.PodName
	if attempt := contract.Attempt(tr); attempt > 1 {
		// Of Tekton's retries, how many there were, and when the task first started: the
		// attempts themselves (as many as a tenant's spec.retries allows) are not kept.
		s.Annotations = map[string]string{cachedAttemptKey: strconv.Itoa(attempt)}
		if first := tr.Status.RetriesStatus[0].StartTime; first != nil {
			s.StartTime = first
		}
	}
	if c := tr.Status.GetCondition(apis.ConditionSucceeded); c != nil {
		s.SetCondition(&apis.Condition{Type: c.Type, Status: c.Status, Reason: c.Reason, LastTransitionTime: c.LastTransitionTime})
	}
	if ts := tr.Status.TaskSpec; ts != nil {
		s.TaskSpec = &pipelinev1.TaskSpec{}
		for _, v := range ts.Volumes {
			if v.Secret != nil && strings.HasPrefix(v.Secret.SecretName, contract.SecretPrefix) {
				s.TaskSpec.Volumes = []corev1.Volume{{Name: v.Name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: v.Secret.SecretName}}}}
				break
			}
		}
	}
	return kept, nil
}

// cachedAttemptKey holds, in a cached TaskRun's status annotations, the attempt it is in when
// Tekton has retried it (see attemptOf). Nothing else of its status annotations is kept, so the
// value there is always stripTaskRun's.
const cachedAttemptKey = "berth.dev/attempt"

// attemptOf is the attempt a cached TaskRun is in (contract.Attempt of the TaskRun as the
// apiserver has it: stripTaskRun keeps the count, not the attempts).
func attemptOf(tr *pipelinev1.TaskRun) int {
	if n, err := strconv.Atoi(tr.Status.Annotations[cachedAttemptKey]); err == nil && n > 1 {
		return n
	}
	return 1
}

// keptAffinity stands for the TaskRun's pod template in the cache: the one thing berth reads of it
// is whether its required node affinity pins the pod to the nodes of platform (serveLocally),
// and a tenant may make that affinity as large as the TaskRun. When it does pin them, the
// smallest affinity that does (the webhook's own requirements) is kept; otherwise none.
func keptAffinity(tr *pipelinev1.TaskRun, platform string) *pod.Template {
	node, ok := localaffinity.NodeOf(platform)
	if !ok || !localaffinity.Enforced(localaffinity.Of(tr), node) {
		return nil
	}
	return &pod.Template{Affinity: &corev1.Affinity{NodeAffinity: localaffinity.Require(nil, node)}}
}

// finalizersCut stands in the cache for finalizers of others too long to keep (keptFinalizers).
// A finalizer is a qualified name, which has no angle brackets, so no TaskRun has this one.
const finalizersCut = "<finalizers of others>"

// keptFinalizerBytes bounds the finalizers a cached TaskRun keeps as they are. The apiserver
// bounds neither how many a TaskRun has nor their sum, only each name (317 characters), so a
// tenant can give each of its TaskRuns a megabyte of them. This is a choice of what to keep, not
// a limit on the TaskRun: room for what real TaskRuns carry (berth's own, Tekton Chains' and
// Results', under 100 bytes in all) several times over. Past it the cache keeps berth's own
// finalizer, if there, and finalizersCut, and a write that adds or removes berth's reads the
// list anew (taskMirror.write): twice in a task's life at most.
const keptFinalizerBytes = 512

// keptFinalizers is what the cache keeps of a TaskRun's finalizers: all of them while they are
// short, else whether berth's is among them and that others were cut.
func keptFinalizers(finalizers []string) []string {
	size := 0
	for _, f := range finalizers {
		size += len(f)
	}
	if size <= keptFinalizerBytes {
		return finalizers
	}
	if slices.Contains(finalizers, contract.Finalizer) {
		return []string{contract.Finalizer, finalizersCut}
	}
	return []string{finalizersCut}
}
