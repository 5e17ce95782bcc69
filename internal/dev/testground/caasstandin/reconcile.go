package caasstandin

import (
	"context"
	"crypto/rand"
	"fmt"
	"math/big"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

// neverReadyProgress is what a DefinitionNeverReady install reports, as an install that is
// stuck waiting for its bootstrap would.
const neverReadyProgress = "Cluster is installing: waiting up to 40m0s for the Kubernetes API at https://api.stand-in.example:6443 to initialize"

// reconcile moves one instance along its template's path: Pending, then installing, then Ready
// or a failure; or, once deleted, stops its cluster and lets it go.
func (s *StandIn) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	u := newObject(instanceGVK)
	if err := s.client.Get(ctx, req.NamespacedName, u); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, s.forgetByName(req.NamespacedName)
		}
		return reconcile.Result{}, err
	}
	var cti instance
	if err := typed(u, &cti); err != nil {
		return reconcile.Result{}, err
	}
	if cti.DeletionTimestamp != nil {
		return reconcile.Result{}, s.release(ctx, u, &cti)
	}
	if controllerutil.AddFinalizer(u, finalizer) {
		if err := s.client.Update(ctx, u); err != nil {
			return reconcile.Result{}, fmt.Errorf("adding the finalizer to instance %s: %w", req, err)
		}
	}
	if err := s.writeStatus(ctx, u, &cti, cti.Status.withDefaults()); err != nil {
		return reconcile.Result{}, err
	}
	if terminal(cti.Status.Phase) {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, s.install(ctx, u, &cti)
}

// install does what the template's cluster definition says.
func (s *StandIn) install(ctx context.Context, u *unstructured.Unstructured, cti *instance) error {
	tmpl, err := s.template(ctx, cti.Spec.ClusterTemplateRef)
	if apierrors.IsNotFound(err) {
		return s.writeStatus(ctx, u, cti, cti.Status.withPhase(phaseFailed, fmt.Sprintf("failed to fetch ClusterTemplate - %q", err)))
	}
	if err != nil {
		return err
	}
	switch tmpl.Spec.ClusterDefinition {
	case DefinitionInstallFails:
		return s.failInstall(ctx, u, cti, installFailureLog)
	case DefinitionNeverReady:
		if err := s.ensureInstall(ctx, cti, installRunning, ""); err != nil {
			return err
		}
		return s.writeStatus(ctx, u, cti, installing(cti.Status, neverReadyProgress))
	case DefinitionCredentials:
		if cti.Status.Phase != phasePending {
			break // checked before the install began; it does not fail a running cluster
		}
		problem, err := s.credentialsProblem(ctx, cti, tmpl)
		if err != nil {
			return err
		}
		if problem != "" {
			return s.writeStatus(ctx, u, cti, cti.Status.withPhase(phaseCredentialsFailed, problem))
		}
	}
	return s.boot(ctx, u, cti, tmpl)
}

// boot brings the instance's cluster up and hands it out once it serves.
func (s *StandIn) boot(ctx context.Context, u *unstructured.Unstructured, cti *instance, tmpl *template) error {
	c := s.clusterOf(cti.UID, types.NamespacedName{Namespace: cti.Namespace, Name: cti.Name})
	switch {
	case !c.booted:
		if err := s.ensureInstall(ctx, cti, installRunning, ""); err != nil {
			return err
		}
		return s.writeStatus(ctx, u, cti, installing(cti.Status, "Cluster is installing: starting kube-apiserver and etcd"))
	case c.err != nil:
		return s.failInstall(ctx, u, cti, "level=fatal msg=the stand-in could not start the cluster's control plane: "+c.err.Error())
	}
	if err := s.writeSecrets(ctx, cti, c.cp); err != nil {
		return err
	}
	if err := s.ensureInstall(ctx, cti, installSucceeded, ""); err != nil {
		return err
	}
	status := cti.Status.withCondition(conditionInstalled, metav1.ConditionTrue, reasonInstalled, "Available")
	if len(tmpl.Spec.ClusterSetup) == 0 {
		status = status.withCondition(conditionSetUp, metav1.ConditionTrue, reasonSetupNotDefined, "No cluster setup defined")
	} else {
		status = status.withCondition(conditionSetUp, metav1.ConditionTrue, "ClusterSetupSucceeded", "Cluster setup succeeded")
	}
	status.APIServerURL = c.url
	status.Kubeconfig = &corev1.LocalObjectReference{Name: cti.kubeconfigSecret()}
	status.AdminPassword = &corev1.LocalObjectReference{Name: cti.passwordSecret()}
	return s.writeStatus(ctx, u, cti, status.withPhase(phaseReady, "Cluster is ready"))
}

func installing(s instanceStatus, message string) instanceStatus {
	return s.withCondition(conditionInstalled, metav1.ConditionFalse, reasonInstalling, message).withPhase(phaseClusterInstalling, message)
}

// failInstall fails the install Job with log, warns on the instance and fails the instance.
func (s *StandIn) failInstall(ctx context.Context, u *unstructured.Unstructured, cti *instance, log string) error {
	if err := s.ensureInstall(ctx, cti, installFailed, log); err != nil {
		return err
	}
	msg := fmt.Sprintf("install Job %s failed: %s", cti.installJob(), failureSummary(log))
	if err := s.warn(ctx, cti, phaseClusterInstallFailed, msg); err != nil {
		return err
	}
	status := cti.Status.withCondition(conditionInstalled, metav1.ConditionFalse, reasonApplicationDegraded, msg)
	return s.writeStatus(ctx, u, cti, status.withPhase(phaseClusterInstallFailed, msg))
}

// release stops the instance's cluster, deletes what was made for it and lets it go.
func (s *StandIn) release(ctx context.Context, u *unstructured.Unstructured, cti *instance) error {
	if !controllerutil.ContainsFinalizer(u, finalizer) {
		return nil
	}
	stopped, err := s.forget(cti.UID)
	if err != nil || !stopped {
		return err // once booted, the boot brings the instance back
	}
	for _, name := range []string{cti.kubeconfigSecret(), cti.passwordSecret()} {
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cti.Namespace}}
		if err := s.client.Delete(ctx, secret); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting Secret %s/%s: %w", cti.Namespace, name, err)
		}
	}
	if err := s.deleteInstall(ctx, cti); err != nil {
		return err
	}
	controllerutil.RemoveFinalizer(u, finalizer)
	if err := s.client.Update(ctx, u); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing the finalizer of instance %s/%s: %w", cti.Namespace, cti.Name, err)
	}
	return nil
}

// writeStatus writes status unless it is what cti already has.
func (s *StandIn) writeStatus(ctx context.Context, u *unstructured.Unstructured, cti *instance, status instanceStatus) error {
	if equality.Semantic.DeepEqual(cti.Status, status) {
		return nil
	}
	if err := setStatus(u, status); err != nil {
		return err
	}
	if err := s.client.Status().Update(ctx, u); err != nil {
		return fmt.Errorf("updating the status of instance %s/%s: %w", cti.Namespace, cti.Name, err)
	}
	cti.Status = status
	return nil
}

func (s *StandIn) template(ctx context.Context, name string) (*template, error) {
	u := newObject(templateGVK)
	if err := s.client.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
		return nil, err
	}
	var t template
	return &t, typed(u, &t)
}

// writeSecrets hands out the cluster: a kubeconfig acting as its admin, and the kubeadmin
// password Secret every OpenShift install leaves (no console answers at the cluster's console
// Route to log in to here).
func (s *StandIn) writeSecrets(ctx context.Context, cti *instance, cp *controlplane.ControlPlane) error {
	owner := []metav1.OwnerReference{cti.ownerReference()}
	kubeconfig := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cti.kubeconfigSecret(), Namespace: cti.Namespace, OwnerReferences: owner},
		Data:       map[string][]byte{"kubeconfig": cp.KubeConfig},
	}
	if err := s.client.Create(ctx, kubeconfig); apierrors.IsAlreadyExists(err) {
		// Left by a cluster a restarted stand-in booted before this one.
		var old corev1.Secret
		if err := s.client.Get(ctx, client.ObjectKeyFromObject(kubeconfig), &old); err != nil {
			return err
		}
		if !equality.Semantic.DeepEqual(old.Data, kubeconfig.Data) {
			old.Data = kubeconfig.Data
			err = s.client.Update(ctx, &old)
		}
		if err != nil {
			return fmt.Errorf("updating Secret %s/%s: %w", cti.Namespace, old.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("creating Secret %s/%s: %w", cti.Namespace, kubeconfig.Name, err)
	}
	password, err := kubeadminPassword()
	if err != nil {
		return err
	}
	admin := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cti.passwordSecret(), Namespace: cti.Namespace, OwnerReferences: owner},
		Data:       map[string][]byte{"username": []byte("kubeadmin"), "password": []byte(password)},
	}
	if err := s.client.Create(ctx, admin); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Secret %s/%s: %w", cti.Namespace, admin.Name, err)
	}
	return nil
}

// kubeadminPassword is shaped like the installer's: four groups of five letters and digits.
func kubeadminPassword() (string, error) {
	const alphabet = "23456789abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ"
	var groups []string
	for range 4 {
		var b strings.Builder
		for range 5 {
			n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
			if err != nil {
				return "", err
			}
			b.WriteByte(alphabet[n.Int64()])
		}
		groups = append(groups, b.String())
	}
	return strings.Join(groups, "-"), nil
}
