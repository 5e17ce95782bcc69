package caasstandin

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// adminRole is what installing the operator adds to every namespace admin's rights, through
// the built-in admin role's aggregation: its instances and the quotas that bound them. A
// space's account, bound to admin in its namespace, can then ask for clusters there.
var adminRole = &rbacv1.ClusterRole{
	ObjectMeta: metav1.ObjectMeta{
		Name:   "clustertemplates-aggregate-to-admin",
		Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-admin": "true"},
	},
	Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{group}, Resources: []string{"clustertemplateinstances"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{group}, Resources: []string{"clustertemplatequotas"}, Verbs: []string{"get", "list", "watch"}},
	},
}

// grantAdmins installs adminRole, as the operator's installation does.
func (s *StandIn) grantAdmins(ctx context.Context) error {
	if err := s.client.Create(ctx, adminRole.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("CaaS stand-in: ClusterRole %s: %w", adminRole.Name, err)
	}
	return nil
}
