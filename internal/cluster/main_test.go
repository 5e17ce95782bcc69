package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
	"github.com/berth-ci/berth/internal/dev/testground/realdata"
	"github.com/berth-ci/berth/internal/dev/testground/spacestandin"
)

var (
	cp *controlplane.ControlPlane
	// kube acts as the tenant and as the services, as an admin. Unlike cp.Client it has no
	// client-side rate limit, so that the tests' quick polls never queue behind each other.
	kube client.Client
)

// The control plane serves the real services' CRDs (../shared/real/crds) and the eaas
// Namespace claim's (derived from the real XRD there) from its start, so its garbage collector
// knows SpaceRequests and claims at once and follows their owner references.
func TestMain(m *testing.M) {
	crds, err := realdata.CRDDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	claims, err := spacestandin.ClaimCRD()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
	opts := []controlplane.Option{controlplane.WithCRDs(crds), controlplane.WithCRDObjects(claims)}
	os.Exit(controlplane.RunTestsWith(m, &cp, opts, adminClient))
}

func adminClient(context.Context) error {
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS = -1
	var err error
	kube, err = client.New(cfg, client.Options{Scheme: controlplane.Scheme()})
	return err
}

// The tests play the services: they write the status the wire contract describes.

// fast polls often, so that a test waits no longer than the state it waits for.
var fast = Polling{Timeout: time.Minute, Interval: 50 * time.Millisecond}

// log is a progress writer the test can read while a step writes to it.
type log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// eventually polls cond until it holds or a deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func newNamespace(t *testing.T, prefix string) string {
	t.Helper()
	name := prefix + "-" + rand.String(5)
	if err := cp.EnsureNamespace(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

// grantSpace does what the space service does for a ready space: a namespace, a ServiceAccount
// with admin rights there (and the right to read ClusterTemplates), and a Secret in the tenant namespace whose kubeconfig acts
// as it with a real token.
func grantSpace(tenantNS, spaceNS, secretName string) error {
	ctx := context.Background()
	c := kube
	if err := cp.EnsureNamespace(ctx, spaceNS); err != nil {
		return err
	}
	reader, err := templateReader()
	if err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: spaceNS, Name: "namespace-manager"}}
	// All rights in the namespace. (The built-in ClusterRole admin would do on a real cluster,
	// but its rules are aggregated by a controller the test ground does not run.)
	admin := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: spaceNS, Name: "space-admin"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}},
	}}
	objs := []client.Object{sa, admin,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: spaceNS, Name: "space-admin"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: admin.Name},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: spaceNS, Name: sa.Name}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "templates-" + spaceNS},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: spaceNS, Name: sa.Name}}},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return err
		}
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	tr, err := cs.CoreV1().ServiceAccounts(spaceNS).CreateToken(ctx, sa.Name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["space"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	kc.AuthInfos["space"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["space"] = &clientcmdapi.Context{Cluster: "space", AuthInfo: "space", Namespace: spaceNS}
	kc.CurrentContext = "space"
	raw, err := clientcmd.Write(*kc)
	if err != nil {
		return err
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: tenantNS, Name: secretName}, Data: map[string][]byte{"kubeconfig": raw}}
	return c.Create(ctx, secret)
}

// templateReader is a ClusterRole to read ClusterTemplates, shared by every space.
func templateReader() (string, error) {
	const name = "clustertemplate-reader"
	err := kube.Create(context.Background(), &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"clustertemplate.openshift.io"}, Resources: []string{"clustertemplates"}, Verbs: []string{"get", "list", "watch"}},
	}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	return name, nil
}

// newSpace is a ready space without a SpaceRequest: the steps after provision-space see only
// the Secret.
func newSpace(t *testing.T) (*Space, SpaceAccess) {
	t.Helper()
	tenantNS := newNamespace(t, "tenant")
	access := SpaceAccess{Namespace: tenantNS + "-space", TenantNamespace: tenantNS, SecretName: "space-kubeconfig"}
	if err := grantSpace(tenantNS, access.Namespace, access.SecretName); err != nil {
		t.Fatal(err)
	}
	space, err := SpaceFromSecret(context.Background(), kube, access)
	if err != nil {
		t.Fatal(err)
	}
	return space, access
}

// setStatus writes an object's status as its service would.
func setStatus(obj *unstructured.Unstructured, status map[string]any) error {
	ctx := context.Background()
	if err := kube.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return err
	}
	obj.Object["status"] = status
	if err := kube.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("writing the status of %s %s: %w", obj.GetKind(), obj.GetName(), err)
	}
	return nil
}

func condition(typ, status, reason, message string) map[string]any {
	return map[string]any{"type": typ, "status": status, "reason": reason, "message": message,
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
}

// setInstance writes a ClusterTemplateInstance's status.
func setInstance(t *testing.T, space *Space, name, phase, message string, extra map[string]any, conditions ...map[string]any) {
	t.Helper()
	conds := make([]any, len(conditions))
	for i, c := range conditions {
		conds[i] = c
	}
	status := map[string]any{"phase": phase, "message": message, "conditions": conds}
	for k, v := range extra {
		status[k] = v
	}
	if err := setStatus(newObject(instanceGVK, space.Namespace, name), status); err != nil {
		t.Fatal(err)
	}
}

func makeTemplate(t *testing.T, name string, cost int64) {
	t.Helper()
	u := newObject(templateGVK, "", name)
	u.Object["spec"] = map[string]any{"clusterDefinition": "hypershift-" + name, "cost": cost}
	if err := kube.Create(context.Background(), u); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// makeQuota makes a ClusterTemplateQuota; allowed maps a template to its count (0: no count).
func makeQuota(t *testing.T, namespace string, budget int64, allowed map[string]int64) {
	t.Helper()
	var list []any
	for name, count := range allowed {
		a := map[string]any{"name": name}
		if count > 0 {
			a["count"] = count
		}
		list = append(list, a)
	}
	spec := map[string]any{"allowedTemplates": list}
	if budget > 0 {
		spec["budget"] = budget
	}
	u := newObject(quotaGVK, namespace, "quota")
	u.Object["spec"] = spec
	if err := kube.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
}

// makeInstance creates a ClusterTemplateInstance directly, as another run would have.
func makeInstance(t *testing.T, namespace, name, template string) {
	t.Helper()
	u := newObject(instanceGVK, namespace, name)
	u.Object["spec"] = map[string]any{"clusterTemplateRef": template}
	if err := kube.Create(context.Background(), u); err != nil {
		t.Fatal(err)
	}
}

func mustContain(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, text)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
