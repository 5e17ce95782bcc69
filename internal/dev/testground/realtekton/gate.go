//go:build linux

package realtekton

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The gate is the kubelet's part kwok cannot play: a pod whose non-optional Secret volume does
// not exist yet is not started (Tekton's only way to make a Task wait for what berth writes,
// its ssh secret). kwok's stages see only the pod, so the gate marks a pod once every Secret it
// mounts exists, and kwok starts only marked pods. It keeps what it saw of those Secrets, as a
// kubelet mounts them once, for a test to log in with what the step would have read.
type gate struct {
	client  kubernetes.Interface
	pods    corelisters.PodLister
	secrets corelisters.SecretLister
	queue   workqueue.TypedRateLimitingInterface[types.NamespacedName]

	mu      sync.Mutex
	mounted map[types.NamespacedName]map[string]map[string][]byte
}

// startGate watches pods and Secrets until ctx ends, and returns once it has seen them all.
func startGate(ctx context.Context, cfg *rest.Config) (*gate, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	factory := informers.NewSharedInformerFactory(cs, 0)
	pods, secrets := factory.Core().V1().Pods(), factory.Core().V1().Secrets()
	g := &gate{
		client:  cs,
		pods:    pods.Lister(),
		secrets: secrets.Lister(),
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName]()),
		mounted: map[types.NamespacedName]map[string]map[string][]byte{},
	}
	enqueuePod := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && waiting(pod) {
			g.queue.Add(types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name})
		}
	}
	// A new or changed Secret may be the last one a waiting pod of its namespace needs.
	enqueueNamespace := func(obj any) {
		secret, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		list, _ := g.pods.Pods(secret.Namespace).List(labels.Everything())
		for _, pod := range list {
			enqueuePod(pod)
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueuePod,
		UpdateFunc: func(_, obj any) { enqueuePod(obj) },
	}); err != nil {
		return nil, err
	}
	if _, err := secrets.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueueNamespace,
		UpdateFunc: func(_, obj any) { enqueueNamespace(obj) },
	}); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	for typ, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			g.queue.ShutDown()
			return nil, fmt.Errorf("the secret gate could not list %v", typ)
		}
	}
	go func() {
		<-ctx.Done()
		g.queue.ShutDown()
		factory.Shutdown()
	}()
	go func() {
		for g.next(ctx) {
		}
	}()
	return g, nil
}

// waiting tells a pod the gate has yet to mark.
func waiting(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Annotations[SecretsMountedAnnotation] != "true"
}

// next handles one pod from the queue; false once the queue is shut down.
func (g *gate) next(ctx context.Context) bool {
	key, shutdown := g.queue.Get()
	if shutdown {
		return false
	}
	defer g.queue.Done(key)
	if err := g.admit(ctx, key); err != nil {
		g.queue.AddRateLimited(key)
		return true
	}
	g.queue.Forget(key)
	return true
}

// admit marks the pod if every Secret it needs exists, after keeping their data. A missing one
// leaves the pod waiting: that Secret's creation brings it back.
func (g *gate) admit(ctx context.Context, key types.NamespacedName) error {
	pod, err := g.pods.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) || (err == nil && !waiting(pod)) {
		return nil
	}
	if err != nil {
		return err
	}
	mounted := map[string]map[string][]byte{}
	for _, name := range requiredSecrets(pod) {
		secret, err := g.secrets.Secrets(pod.Namespace).Get(name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		mounted[name] = maps.Clone(secret.Data)
	}
	g.mu.Lock()
	g.mounted[key] = mounted
	g.mu.Unlock()
	marks := map[string]string{SecretsMountedAnnotation: "true"}
	if step := failingStep(pod); step != "" {
		marks[failingStepAnnotation] = step
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": marks}})
	if err != nil {
		return err
	}
	_, err = g.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// failingStep is the step that fails in the pod's attempt ("" if none): FailStepAnnotation's,
// in every attempt or in the first FailAttemptsAnnotation ones. Tekton names the pod of a
// TaskRun's first attempt <taskrun>-pod and the pod of attempt k+1 <taskrun>-pod-retry<k>.
func failingStep(pod *corev1.Pod) string {
	step := pod.Annotations[FailStepAnnotation]
	limit, limited := pod.Annotations[FailAttemptsAnnotation]
	if step == "" || !limited {
		return step
	}
	failing, err := strconv.Atoi(limit)
	if err != nil {
		return step // a test's typo fails loudly rather than passing by chance
	}
	attempt := 1
	if i := strings.LastIndex(pod.Name, "-retry"); i >= 0 {
		if k, err := strconv.Atoi(pod.Name[i+len("-retry"):]); err == nil {
			attempt = k + 1
		}
	}
	if attempt > failing {
		return ""
	}
	return step
}

// requiredSecrets are the Secrets a kubelet must find to mount the pod's volumes: those of
// secret volumes and of projected volumes' secret sources, unless optional.
func requiredSecrets(pod *corev1.Pod) []string {
	var names []string
	for _, v := range pod.Spec.Volumes {
		if s := v.Secret; s != nil && (s.Optional == nil || !*s.Optional) {
			names = append(names, s.SecretName)
		}
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if s := src.Secret; s != nil && (s.Optional == nil || !*s.Optional) {
				names = append(names, s.Name)
			}
		}
	}
	return names
}

// MountedSecrets is what the pod's Secret volumes held when the gate let it start, by Secret
// name and key (nil if it has not started): what its steps would have read, say the ssh key
// berth wrote for the build. It is taken once, when the pod starts: a later change to a Secret
// is not in it, as a step that has read its key does not see it either.
func (t *Tekton) MountedSecrets(namespace, pod string) map[string]map[string][]byte {
	t.gate.mu.Lock()
	defer t.gate.mu.Unlock()
	return t.gate.mounted[types.NamespacedName{Namespace: namespace, Name: pod}]
}

// EndSteps ends the steps of a pod of a TaskRun with HoldAnnotation: kwok ends them as it would
// have at once without it.
func (t *Tekton) EndSteps(ctx context.Context, namespace, pod string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{endAnnotation: "true"}}})
	if err != nil {
		return err
	}
	_, err = t.gate.client.CoreV1().Pods(namespace).Patch(ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// Barrier starts a pod that mounts a Secret that exists and waits until it runs: every pod the
// gate and kwok were given before it, they have handled. No wait proves a pod never starts;
// a pod behind it that started shows this one had its turn. The two are deleted after.
func (t *Tekton) Barrier(ctx context.Context, namespace string) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{GenerateName: "barrier-", Namespace: namespace}}
	if err := t.client.Create(ctx, secret); err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "barrier-", Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: imagePrefix + "barrier"}},
			Volumes: []corev1.Volume{{Name: "secret", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: secret.Name},
			}}},
		},
	}
	if err := t.client.Create(ctx, pod); err != nil {
		return err
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, nodeWait, true, func(ctx context.Context) (bool, error) {
		err := t.client.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		return pod.Status.Phase == corev1.PodRunning, err
	})
	if err != nil {
		return fmt.Errorf("waiting for the barrier pod %s to run: %w", pod.Name, err)
	}
	return errors.Join(client.IgnoreNotFound(t.client.Delete(ctx, pod)), client.IgnoreNotFound(t.client.Delete(ctx, secret)))
}
