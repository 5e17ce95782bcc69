package controlplane

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// The bench counts which client wrote what, request by request: kube-apiserver's audit log
// says so exactly, where its request counters only count. Only the bench, and the security
// suite (to show a request was never made), turn it on.

// WithAuditLog has kube-apiserver write an audit log to path: one JSON line per completed
// mutating request (create, update, patch, delete, deletecollection) at Metadata level (who,
// verb, resource, namespace, name, status code, times; no bodies) of the given users, or of
// every user when none is given. The policy file is written beside the log.
func WithAuditLog(path string, users ...string) Option {
	return WithAuditPolicy(path, auditv1.PolicyRule{Level: auditv1.LevelMetadata, Verbs: MutatingVerbs, Users: users})
}

// WithAuditPolicy has kube-apiserver write an audit log to path, one JSON line per completed
// request that one of rules records (the first that matches decides, as in kube-apiserver);
// nothing else is recorded. For a test that must show a request was never made: a rule at
// Metadata level for reads names the object each read asked for.
func WithAuditPolicy(path string, rules ...auditv1.PolicyRule) Option {
	return func(o *options) { o.auditLog, o.auditRules = path, rules }
}

// MutatingVerbs are the verbs the audit log records.
var MutatingVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

func configureAudit(api *envtest.APIServer, path string, rules []auditv1.PolicyRule) error {
	policy := auditv1.Policy{
		// One line per request, written when it is answered.
		OmitStages: []auditv1.Stage{auditv1.StageRequestReceived},
		Rules:      append(append([]auditv1.PolicyRule{}, rules...), auditv1.PolicyRule{Level: auditv1.LevelNone}),
	}
	policy.APIVersion, policy.Kind = auditv1.SchemeGroupVersion.String(), "Policy"
	data, err := yaml.Marshal(policy)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	policyPath := filepath.Join(filepath.Dir(path), "audit-policy.yaml")
	if err := os.WriteFile(policyPath, data, 0o644); err != nil {
		return err
	}
	args := api.Configure()
	args.Set("audit-policy-file", policyPath)
	args.Set("audit-log-path", path)
	args.Set("audit-log-format", "json")
	// Never rotated (by default it is, at 100 MB): the log is read whole, as one file.
	args.Set("audit-log-maxsize", strconv.Itoa(1<<20))
	// Blocking: a request is answered only once its line is written, so that the log is
	// complete for every request a client saw answered.
	args.Set("audit-log-mode", "blocking")
	return nil
}

// ReadAuditLog calls f with each event of an audit log written WithAuditLog, in order.
func ReadAuditLog(path string, f func(*auditv1.Event)) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	r := bufio.NewReaderSize(file, 1<<20)
	for line := 1; ; line++ {
		data, err := r.ReadBytes('\n')
		if len(data) > 0 && data[len(data)-1] == '\n' {
			var ev auditv1.Event
			if err := json.Unmarshal(data, &ev); err != nil {
				return fmt.Errorf("%s line %d: %w", path, line, err)
			}
			f(&ev)
		}
		// A last line without its newline is one still being written: left out.
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// KubeConfigAs is a kubeconfig for a user of its own, authenticated by a client certificate the
// control plane's CA signed, in the given groups (system:masters makes it a cluster admin).
// Its requests are told apart from other clients' by name, as in the audit log.
func (cp *ControlPlane) KubeConfigAs(name string, groups ...string) ([]byte, error) {
	user, err := cp.env.AddUser(envtest.User{Name: name, Groups: groups}, cp.Config)
	if err != nil {
		return nil, fmt.Errorf("adding user %s: %w", name, err)
	}
	return user.KubeConfig()
}
