package caasstandin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// credentialsProblem says what is wrong with the cloud credentials a bring-your-own-cloud
// instance names ("" if nothing), in words that tell the tenant what to fix. It never quotes a
// value.
func (s *StandIn) credentialsProblem(ctx context.Context, cti *instance, tmpl *template) (string, error) {
	name, _ := cti.parameter(CredentialsParameter)
	if name == "" {
		return fmt.Sprintf("cluster template %q installs into your own cloud account: set parameter %s to the name of a Secret in namespace %s with keys %s and %s",
			tmpl.Name, CredentialsParameter, cti.Namespace, AccessKeyIDKey, SecretAccessKeyKey), nil
	}
	var secret corev1.Secret
	if err := s.client.Get(ctx, client.ObjectKey{Namespace: cti.Namespace, Name: name}, &secret); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Sprintf("credentials Secret %q (parameter %s) not found in namespace %s", name, CredentialsParameter, cti.Namespace), nil
		}
		return "", fmt.Errorf("reading credentials Secret %s/%s: %w", cti.Namespace, name, err)
	}
	for _, key := range []string{AccessKeyIDKey, SecretAccessKeyKey} {
		if len(secret.Data[key]) == 0 {
			return fmt.Sprintf("credentials Secret %q in namespace %s has no key %s (or it is empty)", name, cti.Namespace, key), nil
		}
	}
	return "", nil
}
