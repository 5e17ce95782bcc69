package devcli

// The cloud providers berth-dev adds to the production ones (internal/controller/providers.go):
// local-vm, the test ground's VM cloud, which the dev stack's pool platform and bench's dynamic
// scenarios are served from.
import _ "github.com/berth-ci/berth/internal/dev/localvm"
