// Package dashboards reads the PromQL out of Grafana dashboards shipped as ConfigMaps (berth's
// own in config/grafana, Konflux's in ../shared/real/o11y), so that tests can hold every query
// a dashboard runs to Prometheus' parser and to the metrics berth serves. A panel whose query no
// longer parses, or names a metric nobody exports, draws nothing and says nothing; only a test
// notices.
package dashboards

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// Query is one PromQL expression of a dashboard, its Grafana variables replaced by text
// Prometheus accepts.
type Query struct {
	// Panel is the panel's title; a template variable's query is "variable $<name>".
	Panel string
	Expr  string
}

// Stand-ins for Grafana's variables, chosen so that the expression parses the way Grafana's
// interpolated one would. Interval variables become a range Prometheus accepts; a dashboard's
// own variables, which berth's and Konflux's dashboards use only as regex matchers
// (label=~"$platform"), become the regex of "All" — a variable used elsewhere then fails to
// parse, which is the point: it could not be checked.
const (
	intervalStandIn = "5m"
	variableStandIn = ".+"
)

// builtins are Grafana's global variables (grafana.com/docs/grafana/latest/dashboards/variables/
// add-template-variables/#global-variables) that may appear in a PromQL query.
var builtins = map[string]string{
	"__rate_interval": intervalStandIn, "__interval": intervalStandIn, "__range": intervalStandIn,
	"__interval_ms": "300000", "__range_s": "300", "__range_ms": "300000",
}

// variableRef is Grafana's syntax for a variable: $name, ${name}, ${name:format}, [[name]] or
// [[name:format]] (the pattern of Grafana's own template service).
var variableRef = regexp.MustCompile(`\$(\w+)|\[\[(\w+?)(?::\w+)?\]\]|\$\{(\w+)(?:\.[^:^}]+)?(?::[^}]+)?\}`)

// dashboard is what this package reads of a dashboard's JSON.
type dashboard struct {
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	Targets    []struct {
		Expr       string      `json:"expr"`
		Datasource *datasource `json:"datasource"`
	} `json:"targets"`
	// A collapsed row keeps its panels inside it.
	Panels []panel `json:"panels"`
}

type variable struct {
	Name string `json:"name"`
	Type string `json:"type"`
	// Query is a string in older dashboards and {"query": "..."} in newer ones.
	Query json.RawMessage `json:"query"`
}

// datasource is a string (a name) in older dashboards and {"type", "uid"} in newer ones.
type datasource struct{ Type string }

func (d *datasource) UnmarshalJSON(data []byte) error {
	var ref struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &ref); err == nil {
		d.Type = ref.Type
	}
	return nil // a name tells no type: the query is taken to be Prometheus'
}

// Queries reads a ConfigMap's YAML, each of its data values as a dashboard's JSON, and returns
// the PromQL of every panel target (those of collapsed rows included) and of every query
// variable that selects series (label_values(<selector>, <label>) gives its selector;
// label_values(<label>) selects no series and is left out). Targets of a datasource that is not
// Prometheus are left out. A reference to a variable the dashboard does not define is an error:
// Grafana would send it to Prometheus as it stands, and the panel would stay empty.
func Queries(configMapYAML []byte) ([]Query, error) {
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(configMapYAML, &cm); err != nil {
		return nil, fmt.Errorf("reading the dashboard ConfigMap: %w", err)
	}
	if cm.Kind != "ConfigMap" || len(cm.Data) == 0 {
		return nil, fmt.Errorf("want a ConfigMap with a dashboard in its data, got kind %q with %d data keys", cm.Kind, len(cm.Data))
	}
	var out []Query
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range cm.Data {
			if !yield(k) {
				return
			}
		}
	})
	for _, key := range keys {
		var d dashboard
		if err := json.Unmarshal([]byte(cm.Data[key]), &d); err != nil {
			return nil, fmt.Errorf("dashboard %s: %w", key, err)
		}
		qs, err := d.queries()
		if err != nil {
			return nil, fmt.Errorf("dashboard %s (%q): %w", key, d.Title, err)
		}
		out = append(out, qs...)
	}
	return out, nil
}

func (d dashboard) queries() ([]Query, error) {
	defined := map[string]bool{}
	for _, v := range d.Templating.List {
		defined[v.Name] = true
	}
	var raw []Query
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := variableQuery(v.Query)
		if err != nil {
			return nil, fmt.Errorf("variable %s: %w", v.Name, err)
		}
		if selector, ok := labelValuesSelector(q); ok {
			raw = append(raw, Query{Panel: "variable $" + v.Name, Expr: selector})
		} else if !strings.HasPrefix(q, "label_values(") {
			// query_result(...), metrics(...) and label_names() are Grafana's too; none of
			// berth's or Konflux's dashboards uses them, so they are not guessed at here.
			return nil, fmt.Errorf("variable %s: query %q is not label_values(...), which is all this reader knows", v.Name, q)
		}
	}
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				ds := p.Datasource
				if t.Datasource != nil && t.Datasource.Type != "" {
					ds = t.Datasource
				}
				if t.Expr == "" || ds != nil && ds.Type != "" && ds.Type != "prometheus" {
					continue
				}
				raw = append(raw, Query{Panel: p.Title, Expr: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)

	out := make([]Query, 0, len(raw))
	for _, q := range raw {
		expr, err := substitute(q.Expr, defined)
		if err != nil {
			return nil, fmt.Errorf("panel %q: %w", q.Panel, err)
		}
		out = append(out, Query{Panel: q.Panel, Expr: expr})
	}
	return out, nil
}

// variableQuery is a query variable's query, in either of Grafana's shapes.
func variableQuery(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("query is neither a string nor an object with a query: %w", err)
	}
	return obj.Query, nil
}

// labelValuesSelector is the series selector of label_values(<selector>, <label>).
func labelValuesSelector(q string) (string, bool) {
	inner, ok := strings.CutPrefix(strings.TrimSpace(q), "label_values(")
	if !ok {
		return "", false
	}
	inner, ok = strings.CutSuffix(inner, ")")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(inner, ",")
	if i < 0 {
		return "", false // label_values(<label>): no series named
	}
	return strings.TrimSpace(inner[:i]), true
}

// substitute replaces Grafana's variables with their stand-ins.
func substitute(expr string, defined map[string]bool) (string, error) {
	var unknown []string
	out := variableRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		switch {
		case builtins[name] != "":
			return builtins[name]
		case defined[name]:
			return variableStandIn
		case name[0] >= '0' && name[0] <= '9':
			return ref // $1 of label_replace's replacement: PromQL's own, not Grafana's
		}
		unknown = append(unknown, ref)
		return ref
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("%s: the dashboard defines no such variable", strings.Join(unknown, ", "))
	}
	return out, nil
}
