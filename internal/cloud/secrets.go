package cloud

import (
	"context"
	"errors"
	"strings"
)

// SecretReader reads a Secret of berth's namespace. A Secret that does not exist, or that
// berth may not read, is an error wrapping ErrNoSecret or ErrSecretForbidden.
type SecretReader func(ctx context.Context, name string) (map[string][]byte, error)

// Errors a SecretReader reports, so that providers can tell an operator what to fix.
var (
	ErrNoSecret        = errors.New("the Secret does not exist")
	ErrSecretForbidden = errors.New("berth may not read the Secret")
)

// Credentials reads a credentials Secret for one call, so a rotated key takes effect at once
// and none is kept longer than a call needs it. It returns every key of the Secret, trimmed;
// the required ones must be there and not empty. A missing Secret or key, or one berth may
// not read, is an Auth error naming the Secret and the key (what describes the credential,
// like "the AWS key"); other read failures are Transient. No error carries a value.
func (read SecretReader) Credentials(ctx context.Context, op, secret, what string, required ...string) (map[string]string, error) {
	if read == nil {
		return nil, Errorf(BadConfig, op, "no way to read Secret %s was given", secret)
	}
	data, err := read(ctx, secret)
	if err != nil {
		var ce *Error
		switch {
		case errors.As(err, &ce):
			return nil, err
		case errors.Is(err, ErrNoSecret):
			return nil, Errorf(Auth, op, "Secret %s, which should hold %s under %s, does not exist", secret, what, strings.Join(required, " and "))
		case errors.Is(err, ErrSecretForbidden):
			return nil, Errorf(Auth, op, "berth may not read Secret %s (%s): %v", secret, what, err)
		}
		return nil, Errorf(Transient, op, "reading Secret %s: %v", secret, err)
	}
	values := make(map[string]string, len(data))
	for k, v := range data {
		values[k] = strings.TrimSpace(string(v))
	}
	for _, k := range required {
		if values[k] == "" {
			return nil, Errorf(Auth, op, "Secret %s has no key %s holding %s", secret, k, what)
		}
	}
	return values, nil
}
