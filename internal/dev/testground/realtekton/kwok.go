//go:build linux

package realtekton

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kwok plays the kubelet of the nodes labelled kwokNodeLabel, in the stages below, written for
// the test ground (kwok's own complete only Job pods). A pod's life here:
//
//   - Pending until the gate has annotated it SecretsMountedAnnotation (every Secret it mounts
//     exists, see gate.go): a kubelet does not start a pod whose secret volume it cannot mount,
//     and that is how a Task waits for what berth writes.
//   - then Running, its init containers done and its containers started;
//   - its steps end once Tekton has marked it ready (tekton.dev/ready: READY), which is when
//     Tekton's entrypoint lets the first step run, RunForAnnotation later, or, with
//     HoldAnnotation, once a test ends them (EndSteps): all with exit 0, or, when the gate
//     found the attempt is to fail (FailStepAnnotation, FailAttemptsAnnotation), the step
//     named with exit 1, and the pod Failed;
//   - deleted at once when deleted: no kubelet waits out the grace period.
//
// Step results are not written (Tekton reads them from a termination message).
const (
	// NodeName is the kwok node Start adds: amd64, linux, schedulable.
	NodeName = "kwok-0"
	// SecretsMountedAnnotation marks a pod whose secret volumes could all be mounted.
	SecretsMountedAnnotation = "testground.berth-ci.dev/secrets-mounted"
	// FailStepAnnotation on a TaskRun (Tekton copies it to the pod) names a step (as in the
	// Task) that exits 1, failing the pod and so the attempt: every attempt, or with
	// FailAttemptsAnnotation the first ones.
	FailStepAnnotation = "testground.berth-ci.dev/fail-step"
	// FailAttemptsAnnotation on a TaskRun with FailStepAnnotation is how many of its attempts
	// (Tekton's retries) fail, the first ones; those after succeed.
	FailAttemptsAnnotation = "testground.berth-ci.dev/fail-attempts"
	// RunForAnnotation on a TaskRun is how long (a Go duration) its pod's steps run before
	// they end, so that a test can act on a running TaskRun; by default they end at once.
	RunForAnnotation = "testground.berth-ci.dev/run-for"
	// HoldAnnotation ("true") on a TaskRun keeps its pods' steps running until the test ends
	// them with EndSteps: for a test that acts while a step runs (logs in as the build would)
	// with no clock deciding whether it was in time.
	HoldAnnotation = "testground.berth-ci.dev/hold"

	// failingStepAnnotation is the gate's word to kwok on a pod: the step that fails in this
	// attempt.
	failingStepAnnotation = "testground.berth-ci.dev/failing-step"
	// endAnnotation on a held pod ends its steps (EndSteps).
	endAnnotation = "testground.berth-ci.dev/end"

	kwokNodeLabel = "testground.berth-ci.dev/kwok"
	nodeWait      = time.Minute
)

const kwokConfiguration = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageNodesWithLabelSelector: ` + kwokNodeLabel + `=true
  # Four pods at a time by default: a burst of TaskRuns would queue behind them.
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 4
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testground-node-ready
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions[]? | select(.type == "Ready") | .status'
      operator: NotIn
      values: ["True"]
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: kwok plays this node's kubelet
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      capacity: {cpu: "1000", memory: 1Ti, pods: "10000"}
      allocatable: {cpu: "1000", memory: 1Ti, pods: "10000"}
      nodeInfo:
        architecture: {{ index .metadata.labels "kubernetes.io/arch" | Quote }}
        operatingSystem: {{ index .metadata.labels "kubernetes.io/os" | Quote }}
        kubeletVersion: kwok
        containerRuntimeVersion: kwok
        kernelVersion: kwok
        kubeProxyVersion: kwok
        osImage: kwok
        bootID: ""
        machineID: ""
        systemUUID: ""
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testground-pod-start
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchAnnotations:
      ` + SecretsMountedAnnotation + `: "true"
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: [Pending]
  next:
    event: {type: Normal, reason: Started, message: "kwok started the pod's containers"}
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
      startTime: {{ $now | Quote }}
      conditions:
      - {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
      {{ with .spec.initContainers }}
      initContainerStatuses:
      {{ range . }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: ""
        ready: true
        restartCount: 0
        state:
          terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}
      {{ end }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: ""
        ready: true
        started: true
        restartCount: 0
        state:
          running: {startedAt: {{ $now | Quote }}}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testground-pod-finish
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: [Running]
    - key: '.metadata.annotations["tekton.dev/ready"]'
      operator: In
      values: [READY]
    - key: '(.metadata.annotations["` + HoldAnnotation + `"] // "") != "true" or (.metadata.annotations["` + endAnnotation + `"] // "") == "true"'
      operator: In
      values: ["true"]
  delay:
    durationMilliseconds: 0
    durationFrom:
      jq: {expression: '.metadata.annotations["` + RunForAnnotation + `"]'}
  next:
    event: {type: Normal, reason: Finished, message: "kwok ended the pod's containers"}
    statusTemplate: |
      {{ $now := Now }}
      {{ $fail := "" }}
      {{ with .metadata.annotations }}{{ with index . "` + failingStepAnnotation + `" }}{{ $fail = printf "step-%s" . }}{{ end }}{{ end }}
      phase: {{ if $fail }}Failed{{ else }}Succeeded{{ end }}
      conditions:
      - {type: ContainersReady, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
      - {type: Ready, status: "False", reason: PodCompleted, lastTransitionTime: {{ $now | Quote }}}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: ""
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: {{ if eq .name $fail }}1{{ else }}0{{ end }}
            reason: {{ if eq .name $fail }}Error{{ else }}Completed{{ end }}
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: testground-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    finalizers: {empty: true}
    delete: true
`

// AddNode adds a node of an OS and architecture (the values of the kubernetes.io/os and
// kubernetes.io/arch labels) for kwok to play, and waits until it is Ready: pods that must run
// on such a node (berth's local platforms) are scheduled there.
func (t *Tekton) AddNode(ctx context.Context, name, os, arch string) error {
	return addNode(ctx, t.client, name, os, arch)
}

// addNode adds a node for kwok to play and waits until it is Ready. The apiserver taints every
// new node not-ready, a taint only kube-controller-manager's node lifecycle controller (not run
// here) lifts; the node is untainted here instead, as that controller would once it is Ready.
func addNode(ctx context.Context, c client.Client, name, os, arch string) error {
	node := &corev1.Node{}
	node.Name = name
	node.Labels = map[string]string{
		"kubernetes.io/arch":     arch,
		"kubernetes.io/os":       os,
		"kubernetes.io/hostname": name,
		kwokNodeLabel:            "true",
	}
	if err := c.Create(ctx, node); err != nil {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, nodeWait, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return false, err
		}
		ready := slices.ContainsFunc(node.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		})
		return ready, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kwok to make node %s Ready: %w", name, err)
	}
	untainted := node.DeepCopy()
	untainted.Spec.Taints = slices.DeleteFunc(untainted.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == corev1.TaintNodeNotReady
	})
	if err := c.Patch(ctx, untainted, client.MergeFrom(node)); err != nil {
		return fmt.Errorf("untainting node %s: %w", name, err)
	}
	return nil
}
