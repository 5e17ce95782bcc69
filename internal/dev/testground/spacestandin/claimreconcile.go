package spacestandin

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// reconcileClaim moves one Namespace claim towards what it asks for, as Crossplane and the eaas
// composition do: a namespace with an admin account, its connection details in the Secret the
// claim names, Ready=True; or, once the claim is deleted, none of it.
func (s *StandIn) reconcileClaim(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	u := newClaimUnstructured()
	if found, err := s.fetch(ctx, req, u, claimFinalizer); !found || err != nil {
		return reconcile.Result{}, err
	}
	c, err := claimFromUnstructured(u)
	if err != nil {
		return reconcile.Result{}, err
	}
	if c.DeletionTimestamp != nil {
		return reconcile.Result{}, s.releaseClaim(ctx, u, c)
	}
	return s.composeClaim(ctx, u, c)
}

// composeClaim makes what the eaas composition makes: the namespace, its admin account and the
// connection Secret; and reports it on the claim as Crossplane does.
func (s *StandIn) composeClaim(ctx context.Context, u *unstructured.Unstructured, c *claim) (reconcile.Result, error) {
	// waiting reports a claim whose namespace is not ready: Synced says whether the last
	// attempt worked, as Crossplane reports a composition that fails.
	waiting := func(syncErr error, message string) error {
		synced, reason, syncMessage := "True", reasonReconcileSuccess, ""
		if syncErr != nil {
			synced, reason, syncMessage = "False", reasonReconcileError, syncErr.Error()
		}
		return s.writeClaimStatus(ctx, u, c, c.Status.with(synced, reason, syncMessage, "False", reasonWaiting, message))
	}
	ns, err := s.claimNamespace(ctx, c)
	if err != nil {
		return reconcile.Result{}, err
	}
	if ns == nil {
		if msg, stalled := s.stalled(c.Namespace); stalled {
			var syncErr error
			if msg != "" {
				syncErr = errors.New(msg)
			}
			return reconcile.Result{}, waiting(syncErr, waitingMessage)
		}
		if err := waiting(nil, waitingMessage); err != nil {
			return reconcile.Result{}, err
		}
		if ns, err = s.createClaimNamespace(ctx, c); err != nil {
			// Crossplane retries a failed composition; so does the stand-in.
			return reconcile.Result{}, errors.Join(err, waiting(err, waitingMessage))
		}
	}
	if ns.DeletionTimestamp != nil {
		// Deleted under the claim; once it is gone (the namespace watch says so) a new one is made.
		return reconcile.Result{}, waiting(nil, fmt.Sprintf("namespace %s is being deleted", ns.Name))
	}
	if err := s.grantAdmin(ctx, ns.Name); err != nil {
		return reconcile.Result{}, errors.Join(err, waiting(err, waitingMessage))
	}
	if why, err := s.adminRoleEmpty(ctx); err != nil || why != "" {
		if err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: aggregationWait}, waiting(nil, why)
	}
	status := c.Status.with("True", reasonReconcileSuccess, "", "True", reasonAvailable, "")
	if c.secretName() != "" {
		if err := s.connectionSecret(ctx, c, ns.Name); err != nil {
			return reconcile.Result{}, errors.Join(err, waiting(err, waitingMessage))
		}
		if status.ConnectionDetails == nil || status.ConnectionDetails.LastPublishedTime == nil {
			now := metav1.Now()
			status.ConnectionDetails = &connectionDetails{LastPublishedTime: &now}
		}
	}
	return reconcile.Result{}, s.writeClaimStatus(ctx, u, c, status)
}

// releaseClaim deletes the claim's namespace and lets the claim go once the namespace is gone
// (its connection Secret goes with the claim, by its owner reference).
func (s *StandIn) releaseClaim(ctx context.Context, u *unstructured.Unstructured, c *claim) error {
	return s.letGo(ctx, u, claimFinalizer, func() ([]corev1.Namespace, error) { return s.claimNamespaces(ctx, c) }, func() error {
		return s.writeClaimStatus(ctx, u, c, c.Status.with("True", reasonReconcileSuccess, "", "False", reasonDeleting, ""))
	})
}

func (s *StandIn) writeClaimStatus(ctx context.Context, u *unstructured.Unstructured, c *claim, status claimStatus) error {
	if err := s.updateStatus(ctx, u, &c.Status, &status); err != nil {
		return err
	}
	c.Status = status
	return nil
}

func (s *StandIn) claimNamespaces(ctx context.Context, c *claim) ([]corev1.Namespace, error) {
	return s.labelledNamespaces(ctx, "Namespace claim", c.Namespace, c.Name, client.MatchingLabels{labelClaimName: c.Name, labelClaimNamespace: c.Namespace})
}

// claimNamespace is the claim's namespace, or nil if it has none yet.
func (s *StandIn) claimNamespace(ctx context.Context, c *claim) (*corev1.Namespace, error) {
	return first(s.claimNamespaces(ctx, c))
}

func (s *StandIn) createClaimNamespace(ctx context.Context, c *claim) (*corev1.Namespace, error) {
	name := claimNamespaceName(c)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		labelClaimName:      c.Name,
		labelClaimNamespace: c.Namespace,
	}}}
	if err := s.client.Create(ctx, ns); err != nil {
		return nil, fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return ns, nil
}

// claimNamespaceName is the name of the composite Crossplane would bind the claim to, the
// claim's name and five characters of its own: here the first five of the claim's UID, so
// that a restarted stand-in names it alike. A claim's name may hold dots, which a namespace's
// may not.
func claimNamespaceName(c *claim) string {
	suffix := "-" + string(c.UID)[:5]
	base := strings.ReplaceAll(c.Name, ".", "-")
	if room := 63 - len(suffix); len(base) > room {
		base = base[:room]
	}
	return strings.TrimRight(base, "-") + suffix
}

// connectionSecret writes the claim's connection details, the keys the eaas composition
// writes, to the Secret the claim names, unless it holds them for namespace already.
func (s *StandIn) connectionSecret(ctx context.Context, c *claim, namespace string) error {
	key := client.ObjectKey{Namespace: c.Namespace, Name: c.secretName()}
	secret := &corev1.Secret{}
	err := s.client.Get(ctx, key, secret)
	switch {
	case apierrors.IsNotFound(err):
		secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{
			Name: key.Name, Namespace: key.Namespace,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: claimGVK.GroupVersion().String(), Kind: claimGVK.Kind,
				Name: c.Name, UID: c.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		}, Type: connectionSecretType}
	case err != nil:
		return fmt.Errorf("reading connection Secret %s: %w", key, err)
	case !metav1.IsControlledBy(secret, c):
		return fmt.Errorf("cannot write connection details to Secret %s: it exists and is not controlled by the claim", key)
	case secret.DeletionTimestamp != nil:
		return fmt.Errorf("connection Secret %s is being deleted", key)
	case string(secret.Data[keyNamespace]) == namespace && len(secret.Data[keyKubeconfig]) > 0:
		return nil
	}
	token, err := s.token(ctx, namespace)
	if err != nil {
		return err
	}
	kubeconfig, err := s.kubeconfigWith(namespace, token)
	if err != nil {
		return err
	}
	secret.Data = map[string][]byte{
		keyKubeconfig:     kubeconfig,
		keyNamespace:      []byte(namespace),
		keyServiceAccount: []byte(serviceAccountName),
		keyToken:          []byte(token),
		keyAPIServer:      []byte(s.opts.APIServerURL),
	}
	if secret.ResourceVersion == "" {
		err = s.client.Create(ctx, secret)
	} else {
		err = s.client.Update(ctx, secret)
	}
	if err != nil {
		return fmt.Errorf("writing connection Secret %s: %w", key, err)
	}
	return nil
}
