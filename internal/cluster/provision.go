package cluster

import (
	"context"
	"fmt"
	"io"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Parameter is one template parameter of a ClusterTemplateInstance.
type Parameter struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// ParseParameter reads a name=value pair as given on a command line.
func ParseParameter(s string) (Parameter, error) {
	name, value, ok := strings.Cut(s, "=")
	if !ok || strings.TrimSpace(name) == "" {
		return Parameter{}, fmt.Errorf("parameter %q is not name=value", s)
	}
	return Parameter{Name: strings.TrimSpace(name), Value: value}, nil
}

// ClusterRequest asks for a cluster in a space.
type ClusterRequest struct {
	// Name is the ClusterTemplateInstance's name. A re-run with the same name (a TaskRun's name
	// is stable across retries) finds the instance it made before instead of a second one.
	Name string
	// Template is the ClusterTemplate to instantiate.
	Template string
	// Version, InstanceType and Timeout become the parameters version, instanceType and
	// timeout when set; empty ones leave the template's defaults.
	Version, InstanceType, Timeout string
	// Parameters are any further template parameters.
	Parameters []Parameter
	// Credentials, for a bring-your-own-cloud template, are copied into the space and named by
	// the parameter credentialsSecret. Nil for templates on shared credentials.
	Credentials *Credentials
}

// Credentials are a tenant's cloud credentials for a bring-your-own-cloud template.
type Credentials struct {
	// Name is the Secret's name, in the tenant namespace and, once copied, in the space.
	Name string
	Data map[string][]byte
}

// ReadCredentials reads a tenant's credentials Secret.
func ReadCredentials(ctx context.Context, tenant client.Reader, namespace, name string) (*Credentials, error) {
	var s corev1.Secret
	if err := tenant.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
		return nil, fmt.Errorf("reading the credentials Secret %s/%s: %w", namespace, name, err)
	}
	if len(s.Data) == 0 {
		return nil, fmt.Errorf("the credentials Secret %s/%s holds no data", namespace, name)
	}
	return &Credentials{Name: name, Data: s.Data}, nil
}

// Instance is what the steps report of a ClusterTemplateInstance.
type Instance struct {
	Namespace, Name string
	Template        string
	Parameters      []Parameter
	Phase, Message  string
	Conditions      []metav1.Condition
	APIServerURL    string
	// KubeconfigSecret and AdminPasswordSecret name Secrets in the space namespace.
	KubeconfigSecret, AdminPasswordSecret string
}

func instanceFrom(u *unstructured.Unstructured) (Instance, error) {
	v, err := decode[instanceView](u)
	if err != nil {
		return Instance{}, err
	}
	return Instance{
		Namespace: v.Namespace, Name: v.Name, Template: v.Spec.ClusterTemplateRef, Parameters: v.Spec.Parameters,
		Phase: v.Status.Phase, Message: v.Status.Message, Conditions: v.Status.Conditions,
		APIServerURL:     v.Status.APIServerURL,
		KubeconfigSecret: v.Status.Kubeconfig.name(), AdminPasswordSecret: v.Status.AdminPassword.name(),
	}, nil
}

func (i Instance) ref() string {
	return fmt.Sprintf("ClusterTemplateInstance %s/%s", i.Namespace, i.Name)
}

// Lookup reads a ClusterTemplateInstance as it is now.
func Lookup(ctx context.Context, space *Space, name string) (Instance, error) {
	inst, err := getInstance(ctx, space, name)
	if err != nil {
		return Instance{}, fmt.Errorf("reading ClusterTemplateInstance %s/%s: %w", space.Namespace, name, err)
	}
	return inst, nil
}

func getInstance(ctx context.Context, space *Space, name string) (Instance, error) {
	u := newObject(instanceGVK, space.Namespace, name)
	if err := space.Client.Get(ctx, client.ObjectKeyFromObject(u), u); err != nil {
		return Instance{}, err
	}
	return instanceFrom(u)
}

// Provision creates the ClusterTemplateInstance a request describes, or finds the one a
// previous run of the step created. Before creating it reads the space's
// ClusterTemplateQuotas (when it may) and refuses at once a template the quota does not allow
// or has no room for; the service's own admission check may still refuse, which is reported
// as a refusal.
func Provision(ctx context.Context, space *Space, req ClusterRequest, progress io.Writer) (Instance, error) {
	params, err := req.parameters()
	if err != nil {
		return Instance{}, err
	}
	ref := fmt.Sprintf("ClusterTemplateInstance %s/%s", space.Namespace, req.Name)
	existing, err := getInstance(ctx, space, req.Name)
	switch {
	case err == nil:
		return reuse(existing, req, progress)
	case !apierrors.IsNotFound(err):
		return Instance{}, fmt.Errorf("looking for an existing %s: %w", ref, err)
	}
	if err := checkAllowed(ctx, space, req.Template, progress); err != nil {
		return Instance{}, err
	}
	if req.Credentials != nil {
		if err := copyCredentials(ctx, space, req.Credentials); err != nil {
			return Instance{}, err
		}
		fmt.Fprintf(progress, "copied the credentials Secret %s into space %s\n", req.Credentials.Name, space.Namespace)
	}
	u := newObject(instanceGVK, space.Namespace, req.Name)
	u.Object["spec"] = map[string]any{"clusterTemplateRef": req.Template, "parameters": params}
	err = space.Client.Create(ctx, u)
	if apierrors.IsAlreadyExists(err) {
		// Another run of the step got there first.
		if existing, err = getInstance(ctx, space, req.Name); err != nil {
			return Instance{}, fmt.Errorf("reading %s: %w", ref, err)
		}
		return reuse(existing, req, progress)
	}
	if err != nil {
		if rbacDenied(err) {
			return Instance{}, fmt.Errorf("the space's credentials may not create %s: %w", ref, err)
		}
		if refused(err) {
			return Instance{}, fmt.Errorf("the cluster service refused %s of template %s at admission: %w", ref, req.Template, err)
		}
		return Instance{}, fmt.Errorf("creating %s: %w", ref, err)
	}
	inst, err := instanceFrom(u)
	if err != nil {
		return Instance{}, err
	}
	fmt.Fprintf(progress, "created %s of template %s with parameters %s\n", ref, req.Template, describeParameters(inst.Parameters))
	return inst, nil
}

// parameters are the request's template parameters in the CTI's wire form, each name once.
func (r ClusterRequest) parameters() ([]any, error) {
	if strings.TrimSpace(r.Name) == "" || strings.TrimSpace(r.Template) == "" {
		return nil, fmt.Errorf("a cluster needs a name and a template")
	}
	all := []Parameter{}
	for _, p := range []Parameter{{"version", r.Version}, {"instanceType", r.InstanceType}, {"timeout", r.Timeout}} {
		if p.Value != "" {
			all = append(all, p)
		}
	}
	all = append(all, r.Parameters...)
	if r.Credentials != nil {
		all = append(all, Parameter{credentialsParameter, r.Credentials.Name})
	}
	seen := map[string]bool{}
	out := make([]any, 0, len(all))
	for _, p := range all {
		if p.Name == "" {
			return nil, fmt.Errorf("a template parameter without a name (value %q)", p.Value)
		}
		if seen[p.Name] {
			return nil, fmt.Errorf("template parameter %s is given twice", p.Name)
		}
		seen[p.Name] = true
		out = append(out, map[string]any{"name": p.Name, "value": p.Value})
	}
	return out, nil
}

// reuse accepts the instance an earlier run made, if it is what this run asks for.
func reuse(existing Instance, req ClusterRequest, progress io.Writer) (Instance, error) {
	if existing.Template != req.Template {
		return Instance{}, fmt.Errorf("%s exists already with template %s, not %s; deprovision it or choose another name", existing.ref(), existing.Template, req.Template)
	}
	fmt.Fprintf(progress, "reusing %s of template %s (phase %s)\n", existing.ref(), existing.Template, orNone(existing.Phase))
	return existing, nil
}

// copyCredentials puts the tenant's credentials into the space, replacing what an earlier run
// copied: the tenant may have rotated them since.
func copyCredentials(ctx context.Context, space *Space, creds *Credentials) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: space.Namespace, Name: creds.Name}}
	err := space.Client.Get(ctx, client.ObjectKeyFromObject(s), s)
	switch {
	case apierrors.IsNotFound(err):
		s.Type = corev1.SecretTypeOpaque
		s.Data = maps.Clone(creds.Data)
		err = space.Client.Create(ctx, s)
	case err == nil:
		s.Data = maps.Clone(creds.Data)
		err = space.Client.Update(ctx, s)
	}
	if err != nil {
		return fmt.Errorf("copying the credentials Secret %s into space %s: %w", creds.Name, space.Namespace, err)
	}
	return nil
}

// refused tells an admission refusal (a webhook's or a policy's answer) from other failures.
func refused(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
}

// rbacDenied tells the authorizer's Forbidden, which admission's shares, by its wording.
func rbacDenied(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "cannot create resource")
}

func describeParameters(ps []Parameter) string {
	if len(ps) == 0 {
		return "(none)"
	}
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.Name + "=" + p.Value
	}
	return strings.Join(parts, " ")
}

func orNone(s string) string {
	if s == "" {
		return "(none yet)"
	}
	return s
}
