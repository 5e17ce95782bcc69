package cloudfake

import (
	"context"
	"fmt"

	"github.com/berth-ci/berth/internal/cloud"
)

// Secrets stands in for berth's namespace in provider tests, as a cloud.SecretReader: a
// Secret not in it does not exist. Tests change it between calls, never during one.
type Secrets map[string]map[string][]byte

// Read is the cloud.SecretReader.
func (s Secrets) Read(_ context.Context, name string) (map[string][]byte, error) {
	data, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("secret %s: %w", name, cloud.ErrNoSecret)
	}
	return data, nil
}
