package controller

// The cloud providers this controller can launch VMs with: each registers its type by being
// imported here, one line per provider.
import (
	_ "github.com/berth-ci/berth/internal/cloud/awsec2"
	_ "github.com/berth-ci/berth/internal/cloud/ibmp"
	_ "github.com/berth-ci/berth/internal/cloud/ibmz"
	_ "github.com/berth-ci/berth/internal/cloud/localvm"
)
