// Package kueue holds the host-config's capacity up against the quotas a Kueue ClusterQueue
// keeps for the same platforms, as Konflux's tekton-kueue asks for them: one unit of the
// platform's resource per platform a PipelineRun builds for, and one aws-ip for each of those
// an AWS VM serves. It reads only what it compares, and writes nothing of Kueue's anywhere:
// the quotas it derives are printed for the operator's own repository.
package kueue

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// ClusterQueue is the part of a kueue.x-k8s.io ClusterQueue (v1beta1 or v1beta2) the
// comparison reads. The Kueue module is not imported for it: it would bring Kueue's whole API
// and its dependency versions into berth for five fields.
type ClusterQueue struct {
	Name string
	// Cohort is set when the queue may borrow beyond its nominal quotas (v1beta1 spec.cohort,
	// v1beta2 spec.cohortName).
	Cohort string
	// Quotas are the nominal quotas by resource, summed over the flavors that give one: a
	// workload is admitted on whichever flavor has room, so together they bound it.
	Quotas map[string]resource.Quantity
}

type clusterQueueDoc struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Cohort         string `json:"cohort"`
		CohortName     string `json:"cohortName"`
		ResourceGroups []struct {
			Flavors []struct {
				Name      string `json:"name"`
				Resources []struct {
					Name string `json:"name"`
					// Kept raw so that a bad quantity is reported with the resource it belongs
					// to; Kubernetes takes it quoted ('250', 1k) or as a bare number (250).
					NominalQuota json.RawMessage `json:"nominalQuota"`
				} `json:"resources"`
			} `json:"flavors"`
		} `json:"resourceGroups"`
	} `json:"spec"`
}

// ReadClusterQueues reads every ClusterQueue of a YAML or JSON stream of one or more documents
// (other kinds, like the ResourceFlavors beside it, are skipped). source names the stream in
// errors.
func ReadClusterQueues(r io.Reader, source string) ([]ClusterQueue, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bufio.NewReader(r), 4096)
	var out []ClusterQueue
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: not valid YAML: %w", source, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		q, isQueue, err := parseClusterQueue(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if isQueue {
			out = append(out, q)
		}
	}
	return out, nil
}

// ParseClusterQueue reads one ClusterQueue object given as JSON, as the API server serves it.
func ParseClusterQueue(raw []byte) (ClusterQueue, error) {
	q, isQueue, err := parseClusterQueue(raw)
	if err == nil && !isQueue {
		err = errors.New("not a ClusterQueue")
	}
	return q, err
}

func parseClusterQueue(raw []byte) (ClusterQueue, bool, error) {
	var doc clusterQueueDoc
	if err := json.Unmarshal(raw, &doc); err != nil {
		return ClusterQueue{}, false, fmt.Errorf("reading a document: %w", err)
	}
	if doc.Kind != "ClusterQueue" {
		return ClusterQueue{}, false, nil
	}
	q := ClusterQueue{Name: doc.Metadata.Name, Cohort: doc.Spec.CohortName, Quotas: map[string]resource.Quantity{}}
	if q.Cohort == "" {
		q.Cohort = doc.Spec.Cohort
	}
	for _, group := range doc.Spec.ResourceGroups {
		for _, flavor := range group.Flavors {
			for _, r := range flavor.Resources {
				quota, err := parseQuota(r.NominalQuota)
				if err != nil {
					return q, true, fmt.Errorf("ClusterQueue %s: flavor %s: resource %s: nominalQuota: %w", q.Name, flavor.Name, r.Name, err)
				}
				sum := q.Quotas[r.Name]
				sum.Add(quota)
				q.Quotas[r.Name] = sum
			}
		}
	}
	return q, true, nil
}

func parseQuota(raw json.RawMessage) (resource.Quantity, error) {
	text := strings.TrimSpace(string(raw))
	if text == "" || text == "null" {
		return resource.Quantity{}, errors.New("missing")
	}
	if unquoted, err := jsonString(raw); err == nil {
		text = unquoted
	}
	q, err := resource.ParseQuantity(text)
	if err != nil {
		return q, fmt.Errorf("%q is not a Kubernetes quantity (like 250 or 1k): %w", text, err)
	}
	if q.Sign() < 0 {
		return q, fmt.Errorf("%s is negative", text)
	}
	return q, nil
}

func jsonString(raw json.RawMessage) (string, error) {
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// Pick is the ClusterQueue called name among queues, or the only one when name is empty.
func Pick(queues []ClusterQueue, name, source string) (ClusterQueue, error) {
	var names []string
	for _, q := range queues {
		if q.Name == name {
			return q, nil
		}
		names = append(names, q.Name)
	}
	switch {
	case len(queues) == 0:
		return ClusterQueue{}, fmt.Errorf("%s holds no ClusterQueue (kind: ClusterQueue)", source)
	case name == "" && len(queues) == 1:
		return queues[0], nil
	case name == "":
		return ClusterQueue{}, fmt.Errorf("%s holds %d ClusterQueues (%s); name one with --cluster-queue", source, len(queues), strings.Join(names, ", "))
	}
	return ClusterQueue{}, fmt.Errorf("%s holds no ClusterQueue named %s (it holds %s)", source, name, strings.Join(names, ", "))
}
