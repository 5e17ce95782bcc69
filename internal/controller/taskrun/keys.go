package taskrun

import (
	"sync"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/hostconfig"
)

// keyring holds the keys of build users: a private key lives only in this process, from the
// reservation until its secret is written, and the digest of each secret handed over is kept
// to tell berth's own write from a tenant's edit.
type keyring struct {
	config  *hostconfig.Store
	newKey  KeyPair
	otp     *OneTimeKeys // nil: tasks get their key itself
	secrets *taskSecrets
	pending sync.Map // keyID → keyPair of a user being provisioned
	handed  sync.Map // keyID → digest of the secret handed over for a ready user
}

type keyPair struct{ private, authorized []byte }

// pair makes the key pair of a new build user of the TaskRun namespace/name.
func (k *keyring) pair(taskRun string) (keyPair, error) {
	private, authorized, err := k.newKey(k.keyType(), taskRun)
	return keyPair{private: private, authorized: authorized}, err
}

// keyType is the type of the keys build users get now: the config in force decides.
func (k *keyring) keyType() config.KeyType {
	if cfg := k.config.Config(); cfg != nil && cfg.UserKeyType != "" {
		return cfg.UserKeyType
	}
	return config.DefaultKeyType
}
