package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	uberzap "go.uber.org/zap"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// TestALoggersValuesAreLoggedAsTheyWereGiven: values deferred to the line logged come out as
// zap's own With would have written them: each logger's values, its name, in order, and none
// of a sibling's.
func TestALoggersValuesAreLoggedAsTheyWereGiven(t *testing.T) {
	var out bytes.Buffer
	root := NewLogger(false, zap.WriteTo(&out))
	parent := root.WithValues("controller", "taskrun").WithName("berth")
	one := parent.WithValues("name", "one")
	two := parent.WithValues("name", "two")
	one.Info("first", "step", 1)
	two.Error(errors.New("refused"), "second")
	parent.V(5).Info("not at this level")
	// A caller that reuses its slice after WithValues changes nothing of what was given.
	kv := []any{"name", "three"}
	three := root.WithValues(kv...)
	kv[1] = "changed"
	three.Info("third")

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want three lines (the V(5) one is below the level), got %d:\n%s", len(lines), out.String())
	}
	want := []map[string]any{
		{"msg": "first", "logger": "berth", "controller": "taskrun", "name": "one", "step": float64(1)},
		{"msg": "second", "logger": "berth", "controller": "taskrun", "name": "two", "error": "refused"},
		{"msg": "third", "name": "three"},
	}
	for i, line := range lines {
		var got map[string]any
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("line %d is no JSON: %v\n%s", i, err, line)
		}
		for k, v := range want[i] {
			if got[k] != v {
				t.Errorf("line %d: %s = %v, want %v\n%s", i, k, got[k], v, line)
			}
		}
	}
	// The order of the fields is the order they were given in.
	if first := lines[0]; strings.Index(first, `"controller"`) > strings.Index(first, `"name"`) ||
		strings.Index(first, `"name"`) > strings.Index(first, `"step"`) {
		t.Errorf("fields out of the order given: %s", first)
	}
}

// TestTheCallerIsWhereTheLineWasLogged: a zap logger told to name the caller names the line
// that logged, not the sink between logr and zap.
func TestTheCallerIsWhereTheLineWasLogged(t *testing.T) {
	var out bytes.Buffer
	log := NewLogger(false, zap.WriteTo(&out), zap.RawZapOpts(uberzap.AddCaller())).WithValues("k", "v")
	log.Info("here")
	if !strings.Contains(out.String(), "logsink_test.go") {
		t.Errorf("the line does not name this file as its caller:\n%s", out.String())
	}
}
