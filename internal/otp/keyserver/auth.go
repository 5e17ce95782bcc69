package keyserver

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Why a POST /store-key is refused.
var (
	ErrStoreKeyDisabled = errors.New("POST /store-key is disabled on this server: berth stores its tasks' keys itself; a client that must store keys needs its ServiceAccount allowed to (see berth's docs/otp.md)")
	ErrUnauthenticated  = errors.New("POST /store-key needs a Kubernetes ServiceAccount token: send it as Authorization: Bearer <token>")
	ErrForbidden        = errors.New("this ServiceAccount may not store keys here: only the ServiceAccounts the server is started with may")
)

// Authenticator tells who sent a bearer token to POST /store-key, if they may store keys.
type Authenticator interface {
	Authenticate(ctx context.Context, bearer string) (who string, err error)
}

// ServiceAccounts lets the named ServiceAccounts store keys, recognised by their tokens through
// the apiserver's TokenReview. A tenant can reach the server too (its tasks must), so storing
// is never open: a key stored by anyone could be handed out by berth's own server, under its
// certificate, to whoever the storer gives the token.
type ServiceAccounts struct {
	Client client.Client
	// Allowed are "namespace/name" of the ServiceAccounts that may store keys.
	Allowed []string
}

// ParseServiceAccounts checks a list of "namespace/name".
func ParseServiceAccounts(list []string) ([]string, error) {
	var out []string
	for _, entry := range list {
		ns, name, ok := strings.Cut(strings.TrimSpace(entry), "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			return nil, fmt.Errorf("%q is not namespace/name of a ServiceAccount", entry)
		}
		out = append(out, ns+"/"+name)
	}
	return out, nil
}

// Authenticate asks the apiserver whose token bearer is; only a valid token of an allowed
// ServiceAccount passes.
func (a ServiceAccounts) Authenticate(ctx context.Context, bearer string) (string, error) {
	if len(a.Allowed) == 0 {
		return "", ErrStoreKeyDisabled
	}
	if bearer == "" {
		return "", ErrUnauthenticated
	}
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: bearer}}
	if err := a.Client.Create(ctx, review); err != nil {
		return "", fmt.Errorf("asking the apiserver who sent the token (TokenReview): %w", err)
	}
	if !review.Status.Authenticated {
		return "", ErrUnauthenticated
	}
	user := review.Status.User.Username
	for _, sa := range a.Allowed {
		ns, name, _ := strings.Cut(sa, "/")
		if user == "system:serviceaccount:"+ns+":"+name {
			return sa, nil
		}
	}
	return "", ErrForbidden
}
