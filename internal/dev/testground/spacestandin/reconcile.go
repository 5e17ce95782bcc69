package spacestandin

import (
	"context"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// tokenLifetime is the real service's: the token outlives the namespace, whose deletion (with
// its ServiceAccount) is what ends its use.
const tokenLifetime = 10 * 365 * 24 * time.Hour

// aggregationWait is how soon a request waiting for the admin role's rules is looked at again;
// kube-controller-manager fills them within a second or two of starting.
const aggregationWait = 500 * time.Millisecond

// reconcile moves one SpaceRequest towards what it asks for: a ready space, or none once it is
// deleted.
func (s *StandIn) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	u := newUnstructured()
	if found, err := s.fetch(ctx, req, u, finalizer); !found || err != nil {
		return reconcile.Result{}, err
	}
	sr, err := fromUnstructured(u)
	if err != nil {
		return reconcile.Result{}, err
	}
	if sr.DeletionTimestamp != nil {
		return reconcile.Result{}, s.release(ctx, u, sr)
	}
	return s.provision(ctx, u, sr)
}

// fetch reads the SpaceRequest or claim req names into u and, unless it is being deleted, holds
// it with finalizer until its namespace is gone. found is false when it is gone.
func (s *StandIn) fetch(ctx context.Context, req reconcile.Request, u *unstructured.Unstructured, finalizer string) (found bool, err error) {
	if err := s.client.Get(ctx, req.NamespacedName, u); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if u.GetDeletionTimestamp() == nil && controllerutil.AddFinalizer(u, finalizer) {
		if err := s.client.Update(ctx, u); err != nil {
			return false, fmt.Errorf("adding the finalizer to %s %s: %w", u.GetKind(), req, err)
		}
	}
	return true, nil
}

// provision makes the space namespace, its admin account and the access Secret, and reports
// them in the status.
func (s *StandIn) provision(ctx context.Context, u *unstructured.Unstructured, sr *spaceRequest) (reconcile.Result, error) {
	ns, err := s.spaceNamespace(ctx, sr)
	if err != nil {
		return reconcile.Result{}, err
	}
	if ns == nil {
		if msg, failing := s.tierFailure(sr.Spec.TierName); failing {
			return reconcile.Result{}, s.writeStatus(ctx, u, sr, sr.Status.withReady("False", reasonUnableToProvision, msg))
		}
		if err := s.writeStatus(ctx, u, sr, sr.Status.withReady("False", reasonProvisioning, "")); err != nil {
			return reconcile.Result{}, err
		}
		if ns, err = s.createSpaceNamespace(ctx, sr); err != nil {
			return reconcile.Result{}, s.writeStatus(ctx, u, sr, sr.Status.withReady("False", reasonUnableToProvision, err.Error()))
		}
	}
	if ns.DeletionTimestamp != nil {
		// Someone deleted it under the request; once it is gone (the namespace watch says so)
		// a new one is made.
		msg := fmt.Sprintf("namespace %s is being deleted", ns.Name)
		return reconcile.Result{}, s.writeStatus(ctx, u, sr, sr.Status.withReady("False", reasonProvisioning, msg))
	}
	if err := s.grantAdmin(ctx, ns.Name); err != nil {
		return reconcile.Result{}, err
	}
	if waiting, err := s.adminRoleEmpty(ctx); err != nil || waiting != "" {
		if err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: aggregationWait}, s.writeStatus(ctx, u, sr, sr.Status.withReady("False", reasonProvisioning, waiting))
	}
	secret, err := s.accessSecret(ctx, sr, ns.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	status := sr.Status.withReady("True", reasonProvisioned, "")
	status.TargetClusterURL = s.opts.APIServerURL
	status.NamespaceAccess = []namespaceAccess{{Name: ns.Name, SecretRef: secret}}
	return reconcile.Result{}, s.writeStatus(ctx, u, sr, status)
}

// release deletes the space namespace and lets the request go once the namespace is gone (its
// access Secret goes with the request, by its owner reference).
func (s *StandIn) release(ctx context.Context, u *unstructured.Unstructured, sr *spaceRequest) error {
	return s.letGo(ctx, u, finalizer, func() ([]corev1.Namespace, error) { return s.spaceNamespaces(ctx, sr) }, func() error {
		return s.writeStatus(ctx, u, sr, sr.Status.withReady("False", reasonTerminating, ""))
	})
}

// letGo deletes the namespaces made for u, a SpaceRequest or claim being deleted, reporting it
// with terminating, and once none is left removes the finalizer that held u, so that it goes.
func (s *StandIn) letGo(ctx context.Context, u *unstructured.Unstructured, finalizer string, made func() ([]corev1.Namespace, error), terminating func() error) error {
	if !controllerutil.ContainsFinalizer(u, finalizer) {
		return nil
	}
	namespaces, err := made()
	if err != nil {
		return err
	}
	if len(namespaces) > 0 {
		if err := s.deleteNamespaces(ctx, namespaces); err != nil {
			return err
		}
		// The namespace watch brings u back when the namespace controller is done.
		return terminating()
	}
	controllerutil.RemoveFinalizer(u, finalizer)
	if err := s.client.Update(ctx, u); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing the finalizer of %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// writeStatus writes status unless it is what sr already has.
func (s *StandIn) writeStatus(ctx context.Context, u *unstructured.Unstructured, sr *spaceRequest, status spaceRequestStatus) error {
	if err := s.updateStatus(ctx, u, &sr.Status, &status); err != nil {
		return err
	}
	sr.Status = status
	return nil
}

// updateStatus writes status to u's status subresource unless it equals current (both
// pointers to a status struct).
func (s *StandIn) updateStatus(ctx context.Context, u *unstructured.Unstructured, current, status any) error {
	if equality.Semantic.DeepEqual(current, status) {
		return nil
	}
	if err := setStatus(u, status); err != nil {
		return err
	}
	if err := s.client.Status().Update(ctx, u); err != nil {
		return fmt.Errorf("updating the status of %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return nil
}

// spaceNamespaces are the namespaces labelled as the request's.
func (s *StandIn) spaceNamespaces(ctx context.Context, sr *spaceRequest) ([]corev1.Namespace, error) {
	return s.labelledNamespaces(ctx, "SpaceRequest", sr.Namespace, sr.Name, client.MatchingLabels{labelSpaceRequest: sr.Name, labelSpaceRequestNamespace: sr.Namespace})
}

// labelledNamespaces are the namespaces labels mark as made for the kind's object
// namespace/name.
func (s *StandIn) labelledNamespaces(ctx context.Context, kind, namespace, name string, labels client.MatchingLabels) ([]corev1.Namespace, error) {
	var list corev1.NamespaceList
	if err := s.client.List(ctx, &list, labels); err != nil {
		return nil, fmt.Errorf("listing the namespaces of %s %s/%s: %w", kind, namespace, name, err)
	}
	return list.Items, nil
}

// deleteNamespaces deletes those of namespaces that are not being deleted yet.
func (s *StandIn) deleteNamespaces(ctx context.Context, namespaces []corev1.Namespace) error {
	for i := range namespaces {
		ns := &namespaces[i]
		if ns.DeletionTimestamp == nil {
			if err := s.client.Delete(ctx, ns); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("deleting space namespace %s: %w", ns.Name, err)
			}
		}
	}
	return nil
}

// spaceNamespace is the request's namespace, or nil if it has none yet.
func (s *StandIn) spaceNamespace(ctx context.Context, sr *spaceRequest) (*corev1.Namespace, error) {
	return first(s.spaceNamespaces(ctx, sr))
}

// first is the first of namespaces, or nil.
func first(namespaces []corev1.Namespace, err error) (*corev1.Namespace, error) {
	if err != nil || len(namespaces) == 0 {
		return nil, err
	}
	return &namespaces[0], nil
}

func (s *StandIn) createSpaceNamespace(ctx context.Context, sr *spaceRequest) (*corev1.Namespace, error) {
	space, name := spaceNames(sr)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		labelSpaceRequest:          sr.Name,
		labelSpaceRequestNamespace: sr.Namespace,
		labelSpace:                 space,
		labelTier:                  sr.Spec.TierName,
	}}}
	if err := s.client.Create(ctx, ns); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return ns, nil
}

// spaceNames are the names the real service would give: the sub-space is the parent space's name
// (the tenant namespace without its -tenant suffix) and the first five characters of the
// request's UID, and the appstudio-env tier names its one namespace <space>-env. The parent's
// part is shortened to keep the namespace within 63 characters.
func spaceNames(sr *spaceRequest) (space, namespace string) {
	const nsSuffix = "-env"
	parent := strings.TrimSuffix(sr.Namespace, "-tenant")
	uid := "-" + string(sr.UID)[:5]
	if room := 63 - len(uid) - len(nsSuffix); len(parent) > room {
		parent = strings.TrimRight(parent[:room], "-")
	}
	space = parent + uid
	return space, space + nsSuffix
}

// grantAdmin makes the account and binds it to the built-in admin role in the namespace only.
func (s *StandIn) grantAdmin(ctx context.Context, namespace string) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccountName, Namespace: namespace}}
	if err := s.client.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ServiceAccount %s/%s: %w", namespace, serviceAccountName, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccountName, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccountName, Namespace: namespace}},
	}
	if err := s.client.Create(ctx, rb); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding %s/%s to ClusterRole admin: %w", namespace, serviceAccountName, err)
	}
	return nil
}

// adminRoleEmpty says why the built-in admin role grants nothing yet ("" once it does). It is an
// aggregated role: the apiserver creates it empty and kube-controller-manager fills it.
func (s *StandIn) adminRoleEmpty(ctx context.Context) (string, error) {
	var role rbacv1.ClusterRole
	if err := s.client.Get(ctx, client.ObjectKey{Name: "admin"}, &role); err != nil {
		if apierrors.IsNotFound(err) {
			return "the apiserver has no ClusterRole admin to bind the namespace's account to", nil
		}
		return "", err
	}
	if len(role.Rules) == 0 {
		return "waiting for kube-controller-manager to aggregate the rules of ClusterRole admin", nil
	}
	return "", nil
}

// accessSecret returns the name of the request's kubeconfig Secret for namespace, made now if
// there is none.
func (s *StandIn) accessSecret(ctx context.Context, sr *spaceRequest, namespace string) (string, error) {
	labels := client.MatchingLabels{labelSpaceRequest: sr.Name, labelProvisionedNamespace: namespace}
	var list corev1.SecretList
	if err := s.client.List(ctx, &list, client.InNamespace(sr.Namespace), labels); err != nil {
		return "", fmt.Errorf("listing the access Secrets of SpaceRequest %s/%s: %w", sr.Namespace, sr.Name, err)
	}
	for _, secret := range list.Items {
		if metav1.IsControlledBy(&secret, sr) && secret.DeletionTimestamp == nil && len(secret.Data["kubeconfig"]) > 0 {
			return secret.Name, nil
		}
	}
	kubeconfig, err := s.kubeconfig(ctx, namespace)
	if err != nil {
		return "", err
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: sr.Name + "-",
			Namespace:    sr.Namespace,
			Labels:       labels,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: spaceRequestGVK.GroupVersion().String(), Kind: spaceRequestGVK.Kind,
				Name: sr.Name, UID: sr.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{"kubeconfig": kubeconfig},
	}
	if err := s.client.Create(ctx, secret); err != nil {
		return "", fmt.Errorf("creating the access Secret of SpaceRequest %s/%s: %w", sr.Namespace, sr.Name, err)
	}
	return secret.Name, nil
}

// kubeconfig acts as the namespace's admin account with a token from the TokenRequest API.
func (s *StandIn) kubeconfig(ctx context.Context, namespace string) ([]byte, error) {
	token, err := s.token(ctx, namespace)
	if err != nil {
		return nil, err
	}
	return s.kubeconfigWith(namespace, token)
}

// token is a new token of the namespace's admin account.
func (s *StandIn) token(ctx context.Context, namespace string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccountName, Namespace: namespace}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(tokenLifetime / time.Second)),
	}}
	if err := s.client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("requesting a token for ServiceAccount %s/%s: %w", namespace, serviceAccountName, err)
	}
	return tr.Status.Token, nil
}

// kubeconfigWith acts with token in namespace, which is its context's.
func (s *StandIn) kubeconfigWith(namespace, token string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["default-cluster"] = &clientcmdapi.Cluster{Server: s.opts.APIServerURL, CertificateAuthorityData: s.opts.CAData}
	cfg.AuthInfos[serviceAccountName] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["default-context"] = &clientcmdapi.Context{Cluster: "default-cluster", AuthInfo: serviceAccountName, Namespace: namespace}
	cfg.CurrentContext = "default-context"
	return clientcmd.Write(*cfg)
}
