package caasstandin

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Every OpenShift cluster has a console, and the real eaas-get-ephemeral-cluster-credentials
// step asks the cluster for it: under `set -e`, `oc get route console -n openshift-console -o
// go-template --template={{.spec.host}}` makes its consoleURL result, so a cluster without the
// Route fails the step. On OpenShift the openshift-apiserver serves route.openshift.io/v1 Route
// and the console operator creates Route console; a stand-in cluster is a bare kube-apiserver,
// so it serves Route as a CRD and gets the console's Route as it boots. Nothing answers at its
// host: there is no console behind it.

const (
	consoleNamespace = "openshift-console"
	consoleRoute     = "console"
	// baseDomain is the stand-in's clusters' base domain, under .test so it resolves nowhere.
	baseDomain = "stand-in.test"
)

var routeGVK = schema.GroupVersionKind{Group: "route.openshift.io", Version: "v1", Kind: "Route"}

// ConsoleHost is the host of the console Route in the cluster of the instance named
// instanceName: the real console's, console-openshift-console.apps.<cluster domain>, with the
// cluster's domain <instance name>.<base domain> as a Hypershift cluster's is.
func ConsoleHost(instanceName string) string {
	return "console-openshift-console.apps." + instanceName + "." + baseDomain
}

// routeCRD serves Route with the top-level fields of the real RouteSpec (openshift/api
// route/v1), typed where a client reads them (host, to) and kept whole otherwise, so that no
// field a client writes is pruned. A new object each call: installing a CRD writes into it.
func routeCRD() *apiextensionsv1.CustomResourceDefinition {
	str := apiextensionsv1.JSONSchemaProps{Type: "string"}
	kept := apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}
	target := apiextensionsv1.JSONSchemaProps{
		Type:     "object",
		Required: []string{"name"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"kind":   str,
			"name":   str,
			"weight": {Type: "integer", Format: "int32"},
		},
	}
	spec := apiextensionsv1.JSONSchemaProps{
		Type:     "object",
		Required: []string{"to"},
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"host":              str,
			"subdomain":         str,
			"path":              str,
			"to":                target,
			"alternateBackends": {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &target}},
			"port":              kept,
			"tls":               kept,
			"wildcardPolicy":    str,
			"httpHeaders":       kept,
		},
	}
	plural := "routes"
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + routeGVK.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: routeGVK.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: routeGVK.Kind, ListKind: routeGVK.Kind + "List", Plural: plural, Singular: "route",
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name:    routeGVK.Version,
				Served:  true,
				Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec":   spec,
						"status": kept,
					},
				}},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
			}},
		},
	}
}

// installConsole creates what the console operator does that clients read: namespace
// openshift-console and in it Route console, as OpenShift's own (reencrypted TLS to Service
// console's https port).
func installConsole(c client.Client, instanceName string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: consoleNamespace}}
	if err := c.Create(ctx, ns); err != nil {
		return fmt.Errorf("creating namespace %s on the cluster of instance %s: %w", consoleNamespace, instanceName, err)
	}
	route := &unstructured.Unstructured{}
	route.SetGroupVersionKind(routeGVK)
	route.SetNamespace(consoleNamespace)
	route.SetName(consoleRoute)
	route.Object["spec"] = map[string]any{
		"host":           ConsoleHost(instanceName),
		"to":             map[string]any{"kind": "Service", "name": "console", "weight": int64(100)},
		"port":           map[string]any{"targetPort": "https"},
		"tls":            map[string]any{"termination": "reencrypt", "insecureEdgeTerminationPolicy": "Redirect"},
		"wildcardPolicy": "None",
	}
	if err := c.Create(ctx, route); err != nil {
		return fmt.Errorf("creating Route %s/%s on the cluster of instance %s: %w", consoleNamespace, consoleRoute, instanceName, err)
	}
	return nil
}
