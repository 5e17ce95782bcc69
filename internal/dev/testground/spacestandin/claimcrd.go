package spacestandin

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/berth-ci/berth/internal/dev/testground/realdata"
)

// namespaceXRDFile is the XRD of Konflux's eaas Namespace claim in ../shared/real/crds.
const namespaceXRDFile = "crossplane_xnamespace_xrd.yaml"

// ClaimCRD is the CustomResourceDefinition of the eaas.konflux-ci.dev Namespace claim, derived
// from the real XRD (../shared/real/crds) as Crossplane derives it when the XRD is
// established. The stand-in serves claims of it; install it with the control plane
// (controlplane.WithCRDObjects) so that the garbage collector follows the claims' owner
// references from its start.
func ClaimCRD() (*apiextensionsv1.CustomResourceDefinition, error) {
	dir, err := realdata.CRDDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, namespaceXRDFile)
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	crd, err := claimCRDFromXRD(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return crd, nil
}

// xrd is the part of a Crossplane CompositeResourceDefinition (apiextensions.crossplane.io/v1)
// a claim's CRD is made of.
type xrd struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Group      string                                         `json:"group"`
		Names      apiextensionsv1.CustomResourceDefinitionNames  `json:"names"`
		ClaimNames *apiextensionsv1.CustomResourceDefinitionNames `json:"claimNames"`
		Versions   []xrdVersion                                   `json:"versions"`
	} `json:"spec"`
}

type xrdVersion struct {
	Name string `json:"name"`
	// Referenceable is the version composite resources are stored in: the CRD's storage version.
	Referenceable      bool    `json:"referenceable"`
	Served             bool    `json:"served"`
	Deprecated         *bool   `json:"deprecated,omitempty"`
	DeprecationWarning *string `json:"deprecationWarning,omitempty"`
	Schema             *struct {
		OpenAPIV3Schema *apiextensionsv1.JSONSchemaProps `json:"openAPIV3Schema"`
	} `json:"schema,omitempty"`
	AdditionalPrinterColumns []apiextensionsv1.CustomResourceColumnDefinition `json:"additionalPrinterColumns,omitempty"`
}

// claimCRDFromXRD derives a claim's CRD the way Crossplane does: the XRD's group, its
// claimNames (category "claim"), namespaced, each version with the XRD's schema and beside it
// the fields Crossplane gives every claim, with a status subresource.
func claimCRDFromXRD(raw []byte) (*apiextensionsv1.CustomResourceDefinition, error) {
	var x xrd
	if err := yaml.Unmarshal(raw, &x); err != nil {
		return nil, fmt.Errorf("reading the XRD: %w", err)
	}
	if x.Kind != "CompositeResourceDefinition" {
		return nil, fmt.Errorf("kind %q, want a CompositeResourceDefinition", x.Kind)
	}
	names := x.Spec.ClaimNames
	switch {
	case x.Spec.Group == "":
		return nil, fmt.Errorf("XRD %s names no group", x.Metadata.Name)
	case names == nil || names.Kind == "" || names.Plural == "":
		return nil, fmt.Errorf("XRD %s offers no claim (spec.claimNames with kind and plural)", x.Metadata.Name)
	case names.Kind == x.Spec.Names.Kind || names.Plural == x.Spec.Names.Plural:
		return nil, fmt.Errorf("XRD %s: the claim's names %s/%s are the composite's", x.Metadata.Name, names.Kind, names.Plural)
	}
	crdNames := *names
	if crdNames.Singular == "" {
		crdNames.Singular = strings.ToLower(crdNames.Kind)
	}
	if crdNames.ListKind == "" {
		crdNames.ListKind = crdNames.Kind + "List"
	}
	crdNames.Categories = append(crdNames.Categories, "claim")
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: crdNames.Plural + "." + x.Spec.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: x.Spec.Group,
			Names: crdNames,
			Scope: apiextensionsv1.NamespaceScoped,
		},
	}
	storage := 0
	for _, v := range x.Spec.Versions {
		if v.Referenceable {
			storage++
		}
		version, err := claimVersion(v)
		if err != nil {
			return nil, fmt.Errorf("XRD %s version %s: %w", x.Metadata.Name, v.Name, err)
		}
		crd.Spec.Versions = append(crd.Spec.Versions, version)
	}
	if storage != 1 {
		return nil, fmt.Errorf("XRD %s has %d referenceable versions, want exactly one", x.Metadata.Name, storage)
	}
	return crd, nil
}

func claimVersion(v xrdVersion) (apiextensionsv1.CustomResourceDefinitionVersion, error) {
	if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return apiextensionsv1.CustomResourceDefinitionVersion{}, fmt.Errorf("no openAPIV3Schema")
	}
	own := v.Schema.OpenAPIV3Schema
	spec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: claimSpecFields()}
	status := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{}}
	// The XRD's own fields join Crossplane's; the status fields Crossplane writes win.
	if s, ok := own.Properties["spec"]; ok {
		maps.Copy(spec.Properties, s.Properties)
		spec.Required = append(spec.Required, s.Required...)
		spec.XValidations = append(spec.XValidations, s.XValidations...)
		spec.Description = s.Description
	}
	if s, ok := own.Properties["status"]; ok {
		maps.Copy(status.Properties, s.Properties)
		status.Required, status.XValidations, status.Description = s.Required, s.XValidations, s.Description
	}
	maps.Copy(status.Properties, claimStatusFields())
	return apiextensionsv1.CustomResourceDefinitionVersion{
		Name:               v.Name,
		Served:             v.Served,
		Storage:            v.Referenceable,
		Deprecated:         v.Deprecated != nil && *v.Deprecated,
		DeprecationWarning: v.DeprecationWarning,
		Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type:        "object",
			Description: own.Description,
			Required:    []string{"spec"},
			Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"apiVersion": {Type: "string"},
				"kind":       {Type: "string"},
				"metadata":   {Type: "object"},
				"spec":       spec,
				"status":     status,
			},
		}},
		Subresources:             &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
		AdditionalPrinterColumns: append(v.AdditionalPrinterColumns, claimColumns...),
	}, nil
}

// Schema shorthands for the fields below.
var (
	str    = apiextensionsv1.JSONSchemaProps{Type: "string"}
	labels = apiextensionsv1.JSONSchemaProps{Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: &str}}
)

func object(required []string, fields map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
	return apiextensionsv1.JSONSchemaProps{Type: "object", Required: required, Properties: fields}
}

// enum is a string of one of values, the first by default.
func enum(values ...string) apiextensionsv1.JSONSchemaProps {
	p := apiextensionsv1.JSONSchemaProps{Type: "string", Default: &apiextensionsv1.JSON{Raw: []byte(`"` + values[0] + `"`)}}
	for _, v := range values {
		p.Enum = append(p.Enum, apiextensionsv1.JSON{Raw: []byte(`"` + v + `"`)})
	}
	return p
}

// claimSpecFields are the spec fields Crossplane gives every claim (its documented claim
// schema): how the composite is chosen and kept, the composite it is bound to, and where the
// connection details go.
func claimSpecFields() map[string]apiextensionsv1.JSONSchemaProps {
	byName := object([]string{"name"}, map[string]apiextensionsv1.JSONSchemaProps{"name": str})
	return map[string]apiextensionsv1.JSONSchemaProps{
		"compositionRef":          byName,
		"compositionRevisionRef":  byName,
		"compositionSelector":     object([]string{"matchLabels"}, map[string]apiextensionsv1.JSONSchemaProps{"matchLabels": labels}),
		"compositionUpdatePolicy": enum("Automatic", "Manual"),
		"compositeDeletePolicy":   enum("Background", "Foreground"),
		"resourceRef": object([]string{"apiVersion", "kind", "name"}, map[string]apiextensionsv1.JSONSchemaProps{
			"apiVersion": str, "kind": str, "name": str,
		}),
		"writeConnectionSecretToRef": byName,
		"publishConnectionDetailsTo": object([]string{"name"}, map[string]apiextensionsv1.JSONSchemaProps{
			"name": str,
			"configRef": {Type: "object", Default: &apiextensionsv1.JSON{Raw: []byte(`{"name":"default"}`)},
				Properties: map[string]apiextensionsv1.JSONSchemaProps{"name": str}},
			"metadata": object(nil, map[string]apiextensionsv1.JSONSchemaProps{"labels": labels, "annotations": labels, "type": str}),
		}),
	}
}

// claimStatusFields are the status fields Crossplane writes on every claim.
func claimStatusFields() map[string]apiextensionsv1.JSONSchemaProps {
	return map[string]apiextensionsv1.JSONSchemaProps{
		"conditions": {
			Description: "Conditions of the resource.",
			Type:        "array",
			Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{
				Type:     "object",
				Required: []string{"lastTransitionTime", "reason", "status", "type"},
				Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"type": str, "status": str, "reason": str, "message": str,
					"lastTransitionTime": {Type: "string", Format: "date-time"},
				},
			}},
		},
		"connectionDetails": object(nil, map[string]apiextensionsv1.JSONSchemaProps{
			"lastPublishedTime": {Type: "string", Format: "date-time"},
		}),
	}
}

// claimColumns are what `kubectl get` shows of a claim.
var claimColumns = []apiextensionsv1.CustomResourceColumnDefinition{
	{Name: "SYNCED", Type: "string", JSONPath: ".status.conditions[?(@.type=='Synced')].status"},
	{Name: "READY", Type: "string", JSONPath: ".status.conditions[?(@.type=='Ready')].status"},
	{Name: "CONNECTION-SECRET", Type: "string", JSONPath: ".spec.writeConnectionSecretToRef.name"},
	{Name: "AGE", Type: "date", JSONPath: ".metadata.creationTimestamp"},
}
