package hostkeys

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/berth-ci/berth/internal/dev/testground/controlplane"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { os.Exit(controlplane.RunTests(m, &cp)) }

// Several provisions meet a new host at once and each presents what it saw: exactly one key is
// recorded, and every caller is told that one.
func TestConcurrentFirstContactRecordsOneKey(t *testing.T) {
	ctx := context.Background()
	if err := cp.EnsureNamespace(ctx, "known"); err != nil {
		t.Fatal(err)
	}
	store := Store{Client: cp.Client, Namespace: "known"}
	const callers = 8
	results := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = store.Record(ctx, "[2001:db8::7]:2222", fmt.Sprintf("ssh-ed25519 KEY%d", i))
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if results[i] != results[0] {
			t.Fatalf("callers were told different keys: %q", results)
		}
	}
	got, found, err := store.Lookup(ctx, "[2001:db8::7]:2222")
	if err != nil || !found || got != results[0] {
		t.Fatalf("Lookup = %q %v %v, want %q", got, found, err, results[0])
	}
	if _, found, _ := store.Lookup(ctx, "198.18.9.9"); found {
		t.Fatal("a host never met has a key on record")
	}
}
