package caasstandin

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/berth-ci/berth/internal/dev/testground/tlscerts"
)

// The quota webhook: the apiserver calls it over HTTPS for every instance created, trusting the
// CA the stand-in makes at start; failurePolicy Fail, as the real operator registers it, so no
// instance is created unchecked.

const (
	webhookConfigName = "caas-standin"
	webhookName       = "vclustertemplateinstance.kb.io" // the real operator's
	webhookPath       = "/validate-clustertemplate-openshift-io-v1alpha1-clustertemplateinstance"
	// probeAnnotation marks the dry-run instance by which Start learns that the apiserver calls
	// the webhook: the webhook refuses it, naming the token.
	probeAnnotation = "caas-standin.berth.dev/probe"
	probeWait       = 30 * time.Second
)

type webhook struct {
	server *http.Server
}

// startWebhook serves the quota check and registers it with the apiserver; it returns once the
// apiserver calls it.
func startWebhook(ctx context.Context, c client.Client, reader client.Reader) (*webhook, error) {
	caPEM, cert, err := servingCertificate()
	if err != nil {
		return nil, fmt.Errorf("CaaS stand-in webhook certificate: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(webhookPath, &admission.Webhook{Handler: &quotaCheck{reader: reader}})
	w := &webhook{server: &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}}
	go func() { _ = w.server.ServeTLS(ln, "", "") }() // ends with ErrServerClosed on stop

	url := "https://" + ln.Addr().String() + webhookPath
	if err := register(ctx, c, url, caPEM); err != nil {
		return nil, errors.Join(err, w.stop(c))
	}
	if err := waitInForce(ctx, c); err != nil {
		return nil, errors.Join(err, w.stop(c))
	}
	return w, nil
}

// stop unregisters the webhook (else the apiserver would refuse every instance for want of it)
// and stops serving.
func (w *webhook) stop(c client.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: webhookConfigName}}
	err := client.IgnoreNotFound(c.Delete(ctx, cfg))
	if err != nil {
		err = fmt.Errorf("unregistering the CaaS stand-in's webhook: %w", err)
	}
	return errors.Join(err, w.server.Close())
}

func register(ctx context.Context, c client.Client, url string, caPEM []byte) error {
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: webhookConfigName}}
	webhooks := []admissionregistrationv1.ValidatingWebhook{{
		Name:         webhookName,
		ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{group}, APIVersions: []string{instanceGVK.Version},
				Resources: []string{"clustertemplateinstances"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		AdmissionReviewVersions: []string{"v1"},
		TimeoutSeconds:          ptr.To[int32](10),
	}}
	err := c.Get(ctx, client.ObjectKeyFromObject(cfg), cfg)
	switch {
	case apierrors.IsNotFound(err):
		cfg.Webhooks = webhooks
		err = c.Create(ctx, cfg)
	case err == nil: // left by a stand-in that was killed: take it over
		cfg.Webhooks = webhooks
		err = c.Update(ctx, cfg)
	}
	if err != nil {
		return fmt.Errorf("registering the CaaS stand-in's webhook: %w", err)
	}
	return nil
}

// waitInForce creates a marked instance in dry-run until the webhook's refusal of it comes back:
// the apiserver takes a moment to see a new webhook configuration.
func waitInForce(ctx context.Context, c client.Client) error {
	token := rand.String(10)
	probe := newObject(instanceGVK)
	probe.SetNamespace(metav1.NamespaceDefault)
	probe.SetGenerateName("caas-standin-probe-")
	probe.SetAnnotations(map[string]string{probeAnnotation: token})
	probe.Object["spec"] = map[string]any{"clusterTemplateRef": "caas-standin-probe"}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, probeWait, true, func(ctx context.Context) (bool, error) {
		last = c.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return last != nil && strings.Contains(last.Error(), token), nil
	})
	if err != nil {
		return fmt.Errorf("the apiserver does not call the CaaS stand-in's webhook (last answer to a probe: %v): %w", last, err)
	}
	return nil
}

// quotaCheck is the webhook's handler.
type quotaCheck struct{ reader client.Reader }

func (q *quotaCheck) Handle(ctx context.Context, req admission.Request) admission.Response {
	var cti instance
	if err := json.Unmarshal(req.Object.Raw, &cti); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if token := cti.Annotations[probeAnnotation]; token != "" {
		return admission.Denied("CaaS stand-in probe " + token)
	}
	refusal, err := q.refusal(ctx, req.Namespace, cti.Spec.ClusterTemplateRef)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if refusal != "" {
		return admission.Denied(refusal)
	}
	return admission.Allowed("")
}

// refusal reads what quotaRefusal decides on.
func (q *quotaCheck) refusal(ctx context.Context, namespace, templateName string) (string, error) {
	quotaList := newList(quotaGVK)
	if err := q.reader.List(ctx, quotaList, client.InNamespace(namespace)); err != nil {
		return "", fmt.Errorf("listing the ClusterTemplateQuotas of namespace %s: %w", namespace, err)
	}
	if len(quotaList.Items) == 0 {
		return "", nil
	}
	quotas := make([]quota, len(quotaList.Items))
	for i := range quotaList.Items {
		if err := typed(&quotaList.Items[i], &quotas[i]); err != nil {
			return "", err
		}
	}
	templates := newList(templateGVK)
	if err := q.reader.List(ctx, templates); err != nil {
		return "", fmt.Errorf("listing ClusterTemplates: %w", err)
	}
	costs := map[string]int64{}
	for i := range templates.Items {
		var t template
		if err := typed(&templates.Items[i], &t); err != nil {
			return "", err
		}
		costs[t.Name] = t.cost()
	}
	instances := newList(instanceGVK)
	if err := q.reader.List(ctx, instances, client.InNamespace(namespace)); err != nil {
		return "", fmt.Errorf("listing the ClusterTemplateInstances of namespace %s: %w", namespace, err)
	}
	var existing []string
	for i := range instances.Items {
		var cti instance
		if err := typed(&instances.Items[i], &cti); err != nil {
			return "", err
		}
		existing = append(existing, cti.Spec.ClusterTemplateRef)
	}
	return quotaRefusal(namespace, templateName, costs, quotas, existing), nil
}

// servingCertificate makes a CA and a certificate it signs for 127.0.0.1, where the webhook
// listens. It returns the CA in PEM, for the webhook configuration's caBundle.
func servingCertificate() ([]byte, tls.Certificate, error) {
	ca, err := tlscerts.NewCA("caas-standin-webhook-ca")
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	serving, err := ca.Issue("127.0.0.1", "localhost")
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	cert, err := serving.TLS()
	return ca.PEM, cert, err
}
