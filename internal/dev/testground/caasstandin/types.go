package caasstandin

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The stand-in talks to the apiserver in unstructured objects, so that it needs no generated
// code for CRDs it does not own; the structs here are their typed views, holding only the fields
// it reads or writes. Names and values are the real operator's
// (stolostron/cluster-templates-operator, api/v1alpha1).

const group = "clustertemplate.openshift.io"

var (
	instanceGVK = schema.GroupVersionKind{Group: group, Version: "v1alpha1", Kind: "ClusterTemplateInstance"}
	templateGVK = schema.GroupVersionKind{Group: group, Version: "v1alpha1", Kind: "ClusterTemplate"}
	quotaGVK    = schema.GroupVersionKind{Group: group, Version: "v1alpha1", Kind: "ClusterTemplateQuota"}
)

const finalizer = "clustertemplateinstance.openshift.io/finalizer"

// Phases of status.phase.
const (
	phasePending              = "Pending"
	phaseClusterInstalling    = "ClusterInstalling"
	phaseClusterInstallFailed = "ClusterInstallFailed"
	phaseReady                = "Ready"
	phaseCredentialsFailed    = "CredentialsFailed"
	phaseFailed               = "Failed"
)

// terminal tells the phases after which the operator does nothing more for an instance but
// delete it.
func terminal(phase string) bool {
	switch phase {
	case phaseFailed, phaseCredentialsFailed, phaseClusterInstallFailed,
		"HelmChartInstallFailed", "ClusterDefinitionFailed", "ClusterSetupCreateFailed", "ClusterSetupFailed":
		return true
	}
	return false
}

// Condition types and reasons. The operator writes ClusterInstallSucceeded and
// ClusterSetupSucceeded; Ready follows the phase (reason: the phase, message: the status
// message).
const (
	conditionInstalled = "ClusterInstallSucceeded"
	conditionSetUp     = "ClusterSetupSucceeded"
	conditionReady     = "Ready"

	reasonDefinitionNotCreated = "ClusterDefinitionNotCreated"
	reasonInstalling           = "ClusterInstalling"
	reasonInstalled            = "ClusterInstalled"
	reasonApplicationDegraded  = "ApplicationDegraded"
	reasonSetupNotCreated      = "ClusterSetupNotCreated"
	reasonSetupNotDefined      = "ClusterSetupNotDefined"
)

type instance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		ClusterTemplateRef string      `json:"clusterTemplateRef"`
		Parameters         []parameter `json:"parameters,omitempty"`
	} `json:"spec"`
	Status instanceStatus `json:"status,omitempty"`
}

type parameter struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// parameter returns the value of the named parameter.
func (i *instance) parameter(name string) (string, bool) {
	for _, p := range i.Spec.Parameters {
		if p.Name == name {
			return p.Value, true
		}
	}
	return "", false
}

type instanceStatus struct {
	Phase         string                       `json:"phase"`
	Message       string                       `json:"message"`
	Conditions    []metav1.Condition           `json:"conditions"`
	APIServerURL  string                       `json:"apiServerURL,omitempty"`
	Kubeconfig    *corev1.LocalObjectReference `json:"kubeconfig,omitempty"`
	AdminPassword *corev1.LocalObjectReference `json:"adminPassword,omitempty"`
}

// kubeconfigSecret and passwordSecret are the names the operator gives the instance's Secrets.
func (i *instance) kubeconfigSecret() string { return i.Name + "-admin-kubeconfig" }
func (i *instance) passwordSecret() string   { return i.Name + "-admin-password" }

// installJob is the name of the Job (and the prefix of its Pod) that installs the cluster.
func (i *instance) installJob() string { return i.Name + "-install" }

func (i *instance) ownerReference() metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: instanceGVK.GroupVersion().String(), Kind: instanceGVK.Kind, Name: i.Name, UID: i.UID}
}

// withPhase returns a copy of s in phase with message, its Ready condition following.
func (s instanceStatus) withPhase(phase, message string) instanceStatus {
	s.Phase, s.Message = phase, message
	ready := metav1.ConditionFalse
	if phase == phaseReady {
		ready = metav1.ConditionTrue
	}
	return s.withCondition(conditionReady, ready, phase, message)
}

// withCondition returns a copy of s with the condition set; meta.SetStatusCondition keeps the
// transition time of a condition whose status stays.
func (s instanceStatus) withCondition(typ string, status metav1.ConditionStatus, reason, message string) instanceStatus {
	s.Conditions = append([]metav1.Condition(nil), s.Conditions...)
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message})
	return s
}

// withDefaults returns s as the operator first writes it: Pending, every condition False.
func (s instanceStatus) withDefaults() instanceStatus {
	if s.Phase != "" {
		return s
	}
	s = s.withCondition(conditionInstalled, metav1.ConditionFalse, reasonDefinitionNotCreated, "Waiting for cluster definition to be created")
	s = s.withCondition(conditionSetUp, metav1.ConditionFalse, reasonSetupNotCreated, "Waiting for cluster setup to be created")
	return s.withPhase(phasePending, "Pending")
}

type template struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		ClusterDefinition string   `json:"clusterDefinition"`
		ClusterSetup      []string `json:"clusterSetup,omitempty"`
		Cost              *int64   `json:"cost,omitempty"`
	} `json:"spec"`
}

func (t *template) cost() int64 {
	if t.Spec.Cost == nil {
		return 0
	}
	return *t.Spec.Cost
}

type quota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		AllowedTemplates []allowedTemplate `json:"allowedTemplates"`
		Budget           int64             `json:"budget,omitempty"`
	} `json:"spec"`
}

type allowedTemplate struct {
	Name  string `json:"name"`
	Count int64  `json:"count,omitempty"` // 0: any number
}

func newObject(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

func newList(gvk schema.GroupVersionKind) *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	return l
}

// typed reads u into out.
func typed(u *unstructured.Unstructured, out any) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return fmt.Errorf("reading %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// setStatus puts status into u, for an update of the status subresource.
func setStatus(u *unstructured.Unstructured, status instanceStatus) error {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	if err != nil {
		return err
	}
	u.Object["status"] = obj
	return nil
}
