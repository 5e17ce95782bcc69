package hostconfig

import (
	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/config"
)

// Login is how berth reaches a static host as its admin, as the config describes it.
func Login(h *config.StaticHost) berthv1.HostLogin {
	return berthv1.HostLogin{Host: h.Name, Address: h.Address, AdminUser: h.User, AdminSecret: h.Secret,
		HostKey: h.HostKey, Platform: string(h.Platform)}
}
