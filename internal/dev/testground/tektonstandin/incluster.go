package tektonstandin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
)

// A real pod reaches the Kubernetes API as its ServiceAccount: the ServiceAccount admission
// plugin adds a projected kube-api-access-<random> volume at serviceAccountMountPath to every
// container, the kubelet fills it with a bound token, the cluster's CA and the namespace, and
// sets the kubernetes Service's variables; rest.InClusterConfig needs exactly those. The test
// apiserver runs without that plugin (envtest disables it, since no controller creates the
// default ServiceAccounts there), and nothing plays the kubelet, so the stand-in does both.
// It issues tokens as the kubelet does: from the TokenRequest API, bound to the Pod, for the
// apiserver's default audience.

const (
	// serviceAccountMountPath is where rest.InClusterConfig looks.
	serviceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// serviceAccountVolumePrefix names the volume the admission plugin adds.
	serviceAccountVolumePrefix = "kube-api-access-"
	// tokenExpirationSeconds is what the admission plugin asks for; the apiserver (by
	// default, --service-account-extend-token-expiration) keeps such a token valid far
	// longer, which is why a stand-in that never refreshes the file can do without.
	tokenExpirationSeconds = 3607
	// rootCAConfigMap is the ConfigMap kube-controller-manager publishes in every namespace
	// and the volume projects; the stand-in takes the CA from its own rest.Config instead,
	// the same certificate.
	rootCAConfigMap = "kube-root-ca.crt"
)

// apiServer is where a step's in-cluster configuration points: the test apiserver itself,
// since nothing here routes the kubernetes Service's cluster IP.
type apiServer struct {
	host, port string
	ca         []byte
}

// apiServerOf reads the apiserver's address and CA from the stand-in's own configuration.
func apiServerOf(cfg *rest.Config) (apiServer, error) {
	u, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return apiServer{}, fmt.Errorf("the apiserver's address: %w", err)
	}
	if u.Scheme != "https" || u.Hostname() == "" {
		return apiServer{}, fmt.Errorf("in-cluster credentials need an https apiserver, the stand-in's configuration has %q", cfg.Host)
	}
	api := apiServer{host: u.Hostname(), port: u.Port(), ca: cfg.CAData}
	if api.port == "" {
		api.port = "443"
	}
	if len(api.ca) == 0 && cfg.CAFile != "" {
		if api.ca, err = os.ReadFile(cfg.CAFile); err != nil {
			return apiServer{}, fmt.Errorf("the apiserver's CA: %w", err)
		}
	}
	if len(api.ca) == 0 {
		return apiServer{}, fmt.Errorf("in-cluster credentials need the apiserver's CA, the stand-in's configuration has none")
	}
	return api, nil
}

// serviceEnv is what the kubelet sets in every container for the kubernetes Service of the
// default namespace (enableServiceLinks or not), with the apiserver's own address and port
// in place of the Service's.
func (a apiServer) serviceEnv() []corev1.EnvVar {
	hostPort := "tcp://" + net.JoinHostPort(a.host, a.port)
	link := "KUBERNETES_PORT_" + a.port + "_TCP"
	return []corev1.EnvVar{
		{Name: "KUBERNETES_SERVICE_HOST", Value: a.host},
		{Name: "KUBERNETES_SERVICE_PORT", Value: a.port},
		{Name: "KUBERNETES_SERVICE_PORT_HTTPS", Value: a.port},
		{Name: "KUBERNETES_PORT", Value: hostPort},
		{Name: link, Value: hostPort},
		{Name: link + "_PROTO", Value: "tcp"},
		{Name: link + "_PORT", Value: a.port},
		{Name: link + "_ADDR", Value: a.host},
	}
}

// automountsToken is the admission plugin's rule: the pod's own setting (Tekton copies the
// TaskRun's podTemplate into it) wins over the ServiceAccount's; mounted unless one says no.
func automountsToken(tr *pipelinev1.TaskRun, sa *corev1.ServiceAccount) bool {
	if pt := tr.Spec.PodTemplate; pt != nil && pt.AutomountServiceAccountToken != nil {
		return *pt.AutomountServiceAccountToken
	}
	if sa.AutomountServiceAccountToken != nil {
		return *sa.AutomountServiceAccountToken
	}
	return true
}

// mountServiceAccountToken adds the token volume to the pod and mounts it read-only in every
// container, as the admission plugin does; a container that already mounts something at
// serviceAccountMountPath keeps its own.
func mountServiceAccountToken(pod *corev1.Pod) {
	name := serviceAccountVolumePrefix + utilrand.String(5)
	needed := false
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if !mountsAt(c.VolumeMounts, serviceAccountMountPath) {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, ReadOnly: true, MountPath: serviceAccountMountPath})
			needed = true
		}
	}
	if !needed {
		return
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		Projected: &corev1.ProjectedVolumeSource{
			DefaultMode: ptr(corev1.ProjectedVolumeSourceDefaultMode),
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(tokenExpirationSeconds))}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: rootCAConfigMap},
					Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace",
					FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
			},
		},
	}})
}

func mountsAt(mounts []corev1.VolumeMount, path string) bool {
	for _, m := range mounts {
		if m.MountPath == path {
			return true
		}
	}
	return false
}

// serviceAccountMounts lays out the pod's token volume under dir, as the kubelet would, and
// returns each container's mounts of it by container name; none if the pod has no such
// volume (automounting was turned off). A task's own volume of a like name is not it.
func (s *StandIn) serviceAccountMounts(ctx context.Context, tr *pipelinev1.TaskRun, rs *runSpec, pod *corev1.Pod, dir string) (map[string][]sandboxMount, error) {
	var volume string
	for _, v := range pod.Spec.Volumes {
		if strings.HasPrefix(v.Name, serviceAccountVolumePrefix) && v.Projected != nil &&
			!slices.ContainsFunc(rs.volumes, func(t corev1.Volume) bool { return t.Name == v.Name }) {
			volume = v.Name
		}
	}
	if volume == "" {
		return nil, nil
	}
	token, err := s.requestToken(ctx, tr, pod, "", ptr(int64(tokenExpirationSeconds)))
	if err != nil {
		return nil, err
	}
	mode := os.FileMode(corev1.ProjectedVolumeSourceDefaultMode)
	for name, data := range map[string][]byte{"token": []byte(token), "ca.crt": s.apiserver.ca, "namespace": []byte(tr.Namespace)} {
		if err := writeFile(filepath.Join(dir, name), data, mode); err != nil {
			return nil, err
		}
	}
	mounts := map[string][]sandboxMount{}
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == volume {
				mounts[c.Name] = append(mounts[c.Name], sandboxMount{source: dir, target: m.MountPath, readOnly: true})
			}
		}
	}
	return mounts, nil
}

// requestToken asks the TokenRequest API for a token of the TaskRun's ServiceAccount bound to
// its pod, as the kubelet does for every projected token: it stops working when the pod is
// deleted. An empty audience is the apiserver's default.
func (s *StandIn) requestToken(ctx context.Context, tr *pipelinev1.TaskRun, pod *corev1.Pod, audience string, expirationSeconds *int64) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tr.Namespace, Name: serviceAccountOf(tr)}}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: expirationSeconds,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}
	if audience != "" {
		req.Spec.Audiences = []string{audience}
	}
	if err := s.client.SubResource("token").Create(ctx, sa, req); err != nil {
		return "", fmt.Errorf("a token for service account %s/%s: %w", sa.Namespace, sa.Name, err)
	}
	return req.Status.Token, nil
}
