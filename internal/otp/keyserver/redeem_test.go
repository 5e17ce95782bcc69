package keyserver_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pipelinev1 "github.com/tektoncd/pipeline/pkg/apis/pipeline/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"knative.dev/pkg/apis"
	duckv1 "knative.dev/pkg/apis/duck/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	berthv1 "github.com/berth-ci/berth/api/v1alpha1"
	"github.com/berth-ci/berth/internal/otp"
	"github.com/berth-ci/berth/internal/otp/keyserver"
)

// A hundred redemptions of one token at the same moment: exactly one gets the key, the others
// are told the token is unknown or used, and nothing of the key is left kept.
func TestHundredConcurrentRedeemersGetTheKeyOnce(t *testing.T) {
	store := newStore(t)
	dir, ca := certDir(t)
	s := serve(t, store, dir, ca, nil)
	k := newTask(t)
	key := privateKey(t)
	tok, err := store.Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	redeemedBefore, unknownBefore := counter(t, "berth_otp_redemptions_total", "redeemed"), counter(t, "berth_otp_redemptions_total", "unknown")

	const redeemers = 100
	if got, refused := race(t, s, tok.String(), key, redeemers, ""); got != 1 || refused != redeemers-1 {
		t.Fatalf("%d redeemers got the key and %d were told %q; want 1 and %d", got, refused, keyserver.ErrUnknown, redeemers-1)
	}
	if isKept(t, tok.Name()) {
		t.Error("the key is still kept after its redemption")
	}
	if d := counter(t, "berth_otp_redemptions_total", "redeemed") - redeemedBefore; d != 1 {
		t.Errorf("berth_otp_redemptions_total{outcome=redeemed} rose by %v, want 1", d)
	}
	if d := counter(t, "berth_otp_redemptions_total", "unknown") - unknownBefore; d != redeemers-1 {
		t.Errorf("berth_otp_redemptions_total{outcome=unknown} rose by %v, want %d", d, redeemers-1)
	}
}

// The real task's redemption, with the real curl: `curl --fail --cacert /ssh/otp-ca -XPOST -d
// @/ssh/otp "$(cat /ssh/otp-server)" >~/.ssh/id_rsa`, then `echo "" >> ~/.ssh/id_rsa`. The
// key it writes logs in; the same command again fails.
func TestTheRealTasksCurlRedeemsOnce(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatal("curl, which the real task redeems its token with, is not installed:", err)
	}
	store := newStore(t)
	dir, ca := certDir(t)
	s := serve(t, store, dir, ca, nil)
	k := newTask(t)
	key := privateKey(t)
	tok, err := store.Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	mount := t.TempDir() // the secret's volume, as the kubelet writes it
	for name, data := range map[string][]byte{"otp": []byte(tok.String()), "otp-server": []byte(s.url + "/otp"), "otp-ca": ca.PEM} {
		if err := os.WriteFile(filepath.Join(mount, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "id_rsa")
	redeem := func() (string, error) {
		cmd := exec.Command("sh", "-c", `"$1" --fail --cacert "$2/otp-ca" -XPOST -d @"$2/otp" "$(cat "$2/otp-server")" >"$3" && echo "" >> "$3"`,
			"redeem", curl, mount, out)
		msg, err := cmd.CombinedOutput()
		return string(msg), err
	}
	if msg, err := redeem(); err != nil {
		t.Fatalf("the task's curl: %v: %s", err, msg)
	}
	written, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(written, append(bytes.Clone(key), '\n')) {
		t.Fatalf("the task wrote %q, want the key and the newline it appends", written)
	}
	if _, err := sshSigner(written); err != nil {
		t.Fatalf("the key the task wrote does not parse as ssh reads it: %v", err)
	}
	msg, err := redeem()
	if err == nil || !strings.Contains(msg, "404") {
		t.Fatalf("the second redemption: %v: %s; want curl to fail on a 404", err, msg)
	}
}

// Every way a token can be no good gets a refusal saying which, and leaves no key kept.
func TestRefusalsSayWhy(t *testing.T) {
	store := newStore(t)
	dir, ca := certDir(t)
	s := serve(t, store, dir, ca, nil)
	ctx := context.Background()
	admin := cp.Client

	// Another installation of berth, in another namespace, keeps its own keys: its tokens are
	// foreign here.
	if err := cp.EnsureNamespace(ctx, "other-berth"); err != nil {
		t.Fatal(err)
	}
	foreign := &keyserver.Store{Client: admin, Namespace: "other-berth"}

	for _, tc := range []struct {
		name string
		// token makes the token to redeem, doing to the task whatever the case is about.
		token      func(t *testing.T, k task) string
		status     int
		want       string
		keyDeleted bool
	}{
		{name: "never issued", status: http.StatusNotFound, want: keyserver.ErrUnknown.Error(),
			token: func(*testing.T, task) string { return otp.NewToken().String() }},
		{name: "issued by another installation", status: http.StatusNotFound, want: keyserver.ErrUnknown.Error(),
			token: func(t *testing.T, k task) string { return put(t, foreign, k) }},
		{name: "not a token", status: http.StatusBadRequest, want: "must be the one-time token",
			token: func(*testing.T, task) string { return "id_rsa=please" }},
		{name: "expired", status: http.StatusGone, want: keyserver.ErrExpired.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				past := &keyserver.Store{Client: admin, Namespace: namespace, TTL: time.Minute,
					Now: func() time.Time { return time.Now().Add(-2 * time.Minute) }}
				return put(t, past, k)
			}},
		{name: "task ended", status: http.StatusGone, want: keyserver.ErrEnded.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				k.rec.Status.Phase, k.rec.Status.EndedAt = berthv1.PhaseCleaning, ptr(berthv1.NewMicroTime(time.Now()))
				update(t, k.rec)
				return tok
			}},
		{name: "TaskRun done before berth noticed", status: http.StatusGone, want: keyserver.ErrEnded.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				k.tr.Status.Conditions = duckv1.Conditions{{Type: apis.ConditionSucceeded, Status: corev1.ConditionFalse, Reason: "Failed"}}
				if err := admin.Status().Update(ctx, k.tr); err != nil {
					t.Fatal(err)
				}
				return tok
			}},
		{name: "TaskRun deleted and made again under its name", status: http.StatusGone, want: keyserver.ErrEnded.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				if err := admin.Delete(ctx, k.tr); err != nil {
					t.Fatal(err)
				}
				again := &pipelinev1.TaskRun{ObjectMeta: metav1.ObjectMeta{Name: k.tr.Name, Namespace: k.tr.Namespace}, Spec: k.tr.Spec}
				if err := admin.Create(ctx, again); err != nil {
					t.Fatal(err)
				}
				return tok
			}},
		{name: "record gone", status: http.StatusGone, want: keyserver.ErrEnded.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				if err := admin.Delete(ctx, k.rec); err != nil {
					t.Fatal(err)
				}
				return tok
			}},
		{name: "record made again", status: http.StatusGone, want: keyserver.ErrEnded.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				if err := admin.Delete(ctx, k.rec); err != nil {
					t.Fatal(err)
				}
				k.rec.ResourceVersion, k.rec.UID = "", ""
				if err := admin.Create(ctx, k.rec); err != nil {
					t.Fatal(err)
				}
				return tok
			}},
		{name: "build user replaced", status: http.StatusGone, want: keyserver.ErrEnded.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				k.rec.Status.BuildUser, k.rec.Status.Attempt = k.rec.Status.BuildUser[:len(k.rec.Status.BuildUser)-1]+"2", 2
				update(t, k.rec)
				return tok
			}},
		{name: "task secret tampered with", status: http.StatusGone, want: keyserver.ErrEnded.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				k.rec.Status.SecretTampered = true
				update(t, k.rec)
				return tok
			}},
		{name: "kept key's binding edited", status: http.StatusNotFound, want: keyserver.ErrUnknown.Error(), keyDeleted: true,
			token: func(t *testing.T, k task) string {
				tok := put(t, store, k)
				var kept corev1.Secret
				if err := admin.Get(ctx, client.ObjectKey{Namespace: namespace, Name: mustParse(t, tok).Name()}, &kept); err != nil {
					t.Fatal(err)
				}
				kept.Annotations["berth.dev/otp-expires"] = time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
				if err := admin.Update(ctx, &kept); err != nil {
					t.Fatal(err)
				}
				return tok
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newTask(t)
			tok := tc.token(t, k)
			status, body := s.post(t, "/otp", tok)
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("%d %q; want %d %q", status, body, tc.status, tc.want)
			}
			if parsed, err := otp.ParseToken(tok); err == nil {
				if tc.keyDeleted && isKept(t, parsed.Name()) {
					t.Error("the key is still kept after it was refused")
				}
				if status, body := s.post(t, "/otp", tok); status != http.StatusNotFound || body != keyserver.ErrUnknown.Error() {
					t.Errorf("asked again: %d %q; want %d %q", status, body, http.StatusNotFound, keyserver.ErrUnknown)
				}
			}
		})
	}
}

// A key the controller kept while its build user was being made (the secret is written before
// the record says Ready) can be redeemed then already.
func TestRedeemableBetweenSecretAndReadyRecord(t *testing.T) {
	store := newStore(t)
	dir, ca := certDir(t)
	s := serve(t, store, dir, ca, nil)
	k := newTask(t)
	k.rec.Status.Phase = berthv1.PhaseProvisioning
	update(t, k.rec)
	key := privateKey(t)
	tok, err := store.Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	if status, body := s.post(t, "/otp", tok.String()); status != http.StatusOK || body != string(key) {
		t.Fatalf("%d %q; want the key", status, body)
	}
}

// What is kept tells neither the token nor the key, and the key opens only with the token.
func TestKeptKeyIsSealed(t *testing.T) {
	store := newStore(t)
	k := newTask(t)
	key := privateKey(t)
	tok, err := store.Put(context.Background(), key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	var kept corev1.Secret
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: tok.Name()}, &kept); err != nil {
		t.Fatal(err)
	}
	if kept.Type != keyserver.SecretType || kept.Labels[keyserver.AllocationLabel] != k.rec.Name {
		t.Errorf("kept key: type %q, labels %v", kept.Type, kept.Labels)
	}
	everything := fmt.Sprint(kept.Name, kept.Labels, kept.Annotations)
	for _, v := range kept.Data {
		everything += string(v)
	}
	for _, secret := range []string{tok.String(), string(key), strings.Split(string(key), "\n")[1]} {
		if strings.Contains(everything, secret) {
			t.Errorf("the kept key's Secret shows %q", secret)
		}
	}
	if len(kept.Data) != 1 || len(kept.Data["sealed"]) < len(key) {
		t.Errorf("kept data %v, want the sealed key alone", kept.Data)
	}
}

// Revoke and the sweep delete exactly the keys that can no longer be redeemed.
func TestRevokeAndSweep(t *testing.T) {
	store := newStore(t)
	ctx := context.Background()
	live, ended, revoked, moved, gone := newTask(t), newTask(t), newTask(t), newTask(t), newTask(t)
	liveTok := put(t, store, live)
	// What a crash between keeping a key and writing its secret leaves: a key of a record
	// that has moved on to another build user since (see redo), or is gone.
	movedTok, goneTok := put(t, store, moved), put(t, store, gone)
	moved.rec.Status.BuildUser = moved.rec.Status.BuildUser[:len(moved.rec.Status.BuildUser)-1] + "2"
	update(t, moved.rec)
	if err := cp.Client.Delete(ctx, gone.rec); err != nil {
		t.Fatal(err)
	}
	storedTok, err := store.Put(ctx, privateKey(t), nil, "ci/uploader")
	if err != nil {
		t.Fatal(err)
	}
	endedTok := put(t, store, ended)
	ended.rec.Status.Phase = berthv1.PhaseCleaning
	update(t, ended.rec)
	expired := &keyserver.Store{Client: store.Client, Namespace: namespace, TTL: time.Minute,
		Now: func() time.Time { return time.Now().Add(-time.Hour) }}
	expiredTok := put(t, expired, newTask(t))
	revokedToks := []string{put(t, store, revoked), put(t, store, revoked)}

	if err := store.Revoke(ctx, revoked.rec.Name); err != nil {
		t.Fatal(err)
	}
	for _, tok := range revokedToks {
		if isKept(t, mustParse(t, tok).Name()) {
			t.Error("Revoke left a key of the record")
		}
	}
	if _, err := store.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		token string
		kept  bool
	}{
		"live": {liveTok, true}, "stored through /store-key": {storedTok.String(), true}, "of an ended task": {endedTok, false},
		"expired": {expiredTok, false}, "of a replaced build user": {movedTok, false}, "of a record that is gone": {goneTok, false},
	} {
		if got := isKept(t, mustParse(t, c.token).Name()); got != c.kept {
			t.Errorf("after the sweep, the key %s is kept: %v, want %v", name, got, c.kept)
		}
	}
}

func put(t *testing.T, store *keyserver.Store, k task) string {
	t.Helper()
	tok, err := store.Put(context.Background(), privateKey(t), k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	return tok.String()
}

func update(t *testing.T, rec *berthv1.Allocation) {
	t.Helper()
	if err := cp.Client.Update(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
}

func mustParse(t *testing.T, text string) otp.Token {
	t.Helper()
	tok, err := otp.ParseToken(text)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func ptr[T any](v T) *T { return &v }

// Holds recognises a token that still keeps exactly this key for exactly this task, and
// nothing else: what lets a pass that wrote a task's secret and failed after hand out the same
// token when run again.
func TestHoldsOnlyTheTasksOwnUnredeemedKey(t *testing.T) {
	store := newStore(t)
	ctx := context.Background()
	k, other := newTask(t), newTask(t)
	key := privateKey(t)
	tok, err := store.Put(ctx, key, k.binding(), "")
	if err != nil {
		t.Fatal(err)
	}
	replaced := *k.binding()
	replaced.BuildUser += "-2"
	for _, c := range []struct {
		name  string
		token string
		bound keyserver.Binding
		key   []byte
		want  bool
	}{
		{"its own", tok.String(), *k.binding(), key, true},
		{"another task's", tok.String(), *other.binding(), key, false},
		{"another build user's", tok.String(), replaced, key, false},
		{"another key", tok.String(), *k.binding(), privateKey(t), false},
		{"never issued", otp.NewToken().String(), *k.binding(), key, false},
		{"not a token", "x", *k.binding(), key, false},
	} {
		if got, err := store.Holds(ctx, c.token, c.bound, c.key); err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	later := &keyserver.Store{Client: store.Client, Namespace: namespace, Now: func() time.Time { return time.Now().Add(time.Hour) }}
	if held, err := later.Holds(ctx, tok.String(), *k.binding(), key); err != nil || held {
		t.Errorf("past its TTL: %v, %v; want false", held, err)
	}
	if _, err := store.Redeem(ctx, tok.String()); err != nil {
		t.Fatal(err)
	}
	if held, err := store.Holds(ctx, tok.String(), *k.binding(), key); err != nil || held {
		t.Errorf("once redeemed: %v, %v; want false", held, err)
	}
}

// race has n redeemers send the token at the same moment, and counts those that got key and
// those told the token is unknown or used; any other answer fails the test (what names the
// round in its failures).
func race(t *testing.T, s *server, token string, key []byte, n int, what string) (got, refused int) {
	t.Helper()
	type answer struct {
		status int
		body   string
		err    error
	}
	answers := make([]answer, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			answers[i].status, answers[i].body, answers[i].err = s.try(http.MethodPost, "/otp", token)
		})
	}
	close(start)
	wg.Wait()
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Errorf("%sredeemer %d: %v", what, i, a.err)
		case a.status == http.StatusOK && a.body == string(key):
			got++
		case a.status == http.StatusNotFound && a.body == keyserver.ErrUnknown.Error():
			refused++
		default:
			t.Errorf("%sredeemer %d: %d %q", what, i, a.status, a.body)
		}
	}
	return got, refused
}
