package hostops

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/remote"
)

// The scripts are fixed text: a syntax error would surface only on a host, so the shell checks
// each one here.
func TestScriptsParse(t *testing.T) {
	for name, script := range map[string]string{"provision": provisionScript, "clean": cleanScript, "inspect": inspectScript,
		"macOS create": darwinCreateScript, "macOS remove": darwinRemoveScript} {
		out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput()
		if err != nil {
			t.Errorf("%s script: %v: %s", name, err, out)
		}
	}
}

func TestScriptsSliceSizeIsTheConfigs(t *testing.T) {
	if idsPerUserText != fmt.Sprint(config.IDsPerBuildUser) {
		t.Fatalf("the scripts' slice size %s is not config.IDsPerBuildUser %d", idsPerUserText, config.IDsPerBuildUser)
	}
}

func TestLeftoverErrorIsTheUsersNotTheHosts(t *testing.T) {
	target := remote.Target{Address: "10.0.0.7"}
	stderr := "could not lock u-x\nleftover: 1 process(es) of its IDs still run, e.g. pid 4242 (sleep, state D)\n" +
		"leftover: 3 paths of its IDs remain, e.g. /tmp/x\n"
	err := leftover(target, "u-x", fmt.Errorf("wrapped: %w", &remote.RemoteError{Host: "10.0.0.7", ExitCode: exitLeftover, Stderr: stderr}))
	var left *LeftoverError
	if !errors.As(err, &left) {
		t.Fatalf("exit 18 gave %v, want a *LeftoverError", err)
	}
	want := "1 process(es) of its IDs still run, e.g. pid 4242 (sleep, state D); 3 paths of its IDs remain, e.g. /tmp/x"
	if left.Host != "10.0.0.7" || left.User != "u-x" || left.What != want {
		t.Fatalf("got %+v, want What %q", left, want)
	}
	if !strings.Contains(left.Error(), "10.0.0.7") || !strings.Contains(left.Error(), "pid 4242") {
		t.Fatalf("the message must name the host and what is left: %s", left)
	}

	// Any other failure is the host's, and passes unchanged.
	for _, other := range []error{
		&remote.RemoteError{Host: "10.0.0.7", ExitCode: 1, Stderr: "leftover: looks like one but is not"},
		&remote.UnreachableError{Host: "10.0.0.7"},
		nil,
	} {
		if got := leftover(target, "u-x", other); errors.As(got, &left) || got != other {
			t.Errorf("leftover(%v) = %v, want it unchanged", other, got)
		}
	}

	// Exit 18 without a named leftover still says what the clean printed.
	err = leftover(target, "u-x", &remote.RemoteError{ExitCode: exitLeftover, Stderr: "something odd"})
	if !errors.As(err, &left) || !strings.Contains(left.What, "something odd") {
		t.Fatalf("got %v", err)
	}
}

func TestCreateUserRefusesARangeWithoutASlice(t *testing.T) {
	good := newBuilt(t, UserName("0b1e2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", 1))
	// A range without a whole slice is refused before any host is dialled.
	_, err := CreateUser(t.Context(), remote.Target{}, NewUser{Name: good.User, AuthorizedKey: good.authorized,
		UIDs: config.UIDRange{First: 5000000, Last: 5000009}})
	if err == nil || !strings.Contains(err.Error(), "holds no build user") {
		t.Fatalf("got %v", err)
	}
}

func TestInventoryReadsUserlessClaims(t *testing.T) {
	out := "disk 100 50\nuser u-0123456789abcdef01234567-1 1700000000 builds/x 1-2\n" +
		"claim 1879048192 u-0123456789abcdef01234567-2 1700000100\nclaim garbage\nnow 1700000200\n"
	inv, err := parseInventory([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.users) != 1 || len(inv.claims) != 1 || inv.claims[0].name != "u-0123456789abcdef01234567-2" ||
		inv.claims[0].since.Unix() != 1700000100 || inv.now.Unix() != 1700000200 {
		t.Fatalf("parsed %+v", inv)
	}
}
