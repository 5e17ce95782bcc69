// Package ibmiam is what berth's two IBM Cloud providers (ibmz, ibmp) share: the API key in
// the platform's Secret and the IAM authenticator made from it.
package ibmiam

import (
	"context"
	"crypto/sha256"

	"github.com/IBM/go-sdk-core/v5/core"

	"github.com/berth-ci/berth/internal/cloud"
)

const (
	// APIKeyKey is the key of the platform's Secret that holds the IBM Cloud API key.
	APIKeyKey = "api-key"
	// DefaultURL is IBM Cloud's public IAM; the SDK asks it at <url>/identity/token.
	DefaultURL = "https://iam.cloud.ibm.com"
)

// Key is an IAM authenticator for the API key now in a platform's Secret, with the key's digest
// so a client built on it can tell when the Secret changed.
type Key struct {
	Authenticator *core.IamAuthenticator
	Digest        [sha256.Size]byte
}

// Read reads the API key from Secret secret, afresh for every call so that a rotated or removed
// key takes effect at once, and makes an authenticator against the IAM at iamURL. A missing
// Secret or key, or a value that is no API key, is an Auth error naming the Secret and key and
// never the value.
func Read(ctx context.Context, read cloud.SecretReader, op, secret, iamURL string) (Key, error) {
	creds, err := read.Credentials(ctx, op, secret, "the IBM Cloud API key", APIKeyKey)
	if err != nil {
		return Key{}, err
	}
	key := creds[APIKeyKey]
	auth := &core.IamAuthenticator{ApiKey: key, URL: iamURL}
	if auth.Validate() != nil {
		// Validate's message may quote the key; this one does not.
		return Key{}, cloud.Errorf(cloud.Auth, op, "key %s of Secret %s is not an IBM Cloud API key (it is empty or has quotes or braces)", APIKeyKey, secret)
	}
	return Key{Authenticator: auth, Digest: sha256.Sum256([]byte(key))}, nil
}
