package devstack

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// MetricsReaderRole is config/rbac's ClusterRole that may get /metrics.
	MetricsReaderRole = "berth-metrics-reader"
	// MetricsScraper is the stack's stand-in for Prometheus: a ServiceAccount of berth's
	// namespace bound to MetricsReaderRole.
	MetricsScraper = "berth-metrics-scraper"
)

// MetricsScraperToken returns a bearer token, valid for ttl, that the controller's metrics
// server accepts: that of the ServiceAccount MetricsScraper, bound to the shipped
// MetricsReaderRole as a Prometheus would be. It returns once the apiserver's authorizer allows
// that account get on /metrics, since the metrics filter remembers a refusal for 30 seconds.
func (s *Stack) MetricsScraperToken(ctx context.Context, ttl time.Duration) (string, error) {
	c := s.ControlPlane.Client
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: MetricsScraper}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: MetricsScraper},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: MetricsReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: Namespace, Name: MetricsScraper}},
	}
	for _, o := range []client.Object{sa, binding} {
		if err := c.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			return "", fmt.Errorf("the metrics scraper's %T: %w", o, err)
		}
	}
	user := "system:serviceaccount:" + Namespace + ":" + MetricsScraper
	allowed := func(ctx context.Context) (bool, error) {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + Namespace, "system:authenticated"},
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}}}
		if err := c.Create(ctx, review); err != nil {
			return false, err
		}
		return review.Status.Allowed, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, allowed); err != nil {
		return "", fmt.Errorf("%s may not get /metrics within a minute of its binding to %s: %w", user, MetricsReaderRole, err)
	}
	seconds := int64(ttl / time.Second)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}
	if err := c.SubResource("token").Create(ctx, sa, req); err != nil {
		return "", fmt.Errorf("a token for %s: %w", user, err)
	}
	return req.Status.Token, nil
}

// WriteMetricsScraperToken writes a MetricsScraperToken valid for a day (the stack lives as
// long as one `berth dev`) beside the stack's kubeconfig, for a person to curl the metrics
// with; Down removes it.
func (s *Stack) WriteMetricsScraperToken(ctx context.Context) (string, error) {
	token, err := s.MetricsScraperToken(ctx, 24*time.Hour)
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(s.KubeConfigPath), "metrics.token")
	return path, s.writeFile(path, []byte(token))
}

// MetricsAddress is a free loopback address for the controller's metrics, on a port outside the
// range outgoing connections take theirs from, so it stays free while the controller restarts.
func MetricsAddress() (string, error) {
	port, err := quietPort("127.0.0.1")
	if err != nil {
		return "", err
	}
	if port == 0 { // no room below that range: any free port, which a restart may then find taken
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		defer ln.Close()
		return ln.Addr().String(), nil
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}
