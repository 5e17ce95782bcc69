package controller

// The cloud providers this controller can launch VMs with: each registers its type by being
// imported here, one line per provider. local-vm, the test ground's VM cloud, is not one of
// them: berth-dev (internal/dev/devcli) and the dev stack register it, so that the production
// berth links no test ground.
import (
	"github.com/berth-ci/berth/internal/cloud"
	_ "github.com/berth-ci/berth/internal/cloud/awsec2"
	_ "github.com/berth-ci/berth/internal/cloud/ibmp"
	_ "github.com/berth-ci/berth/internal/cloud/ibmz"
	"github.com/berth-ci/berth/internal/config"
)

// Every config this binary parses (the controller's watcher, berth config validate, berth
// status) has its dynamic platforms' provider keys checked by the providers registered, so
// that a platform its provider would refuse is unusable at load, not at its first task.
func init() { config.ProviderCheck = cloud.Check }
