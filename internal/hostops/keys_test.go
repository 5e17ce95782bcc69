package hostops

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/berth-ci/berth/internal/config"
	"github.com/berth-ci/berth/internal/dev/testground/sshfake"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// keyAlgorithms are, per key type, the SSH key type name and the signature algorithms a client
// may log in with: for RSA only the SHA-2 ones, as FIPS clients (and OpenSSH ≥ 8.8 by
// default) refuse ssh-rsa's SHA-1.
var keyAlgorithms = map[config.KeyType]struct {
	keyType    string
	signatures []string
}{
	config.KeyTypeEd25519:   {ssh.KeyAlgoED25519, []string{ssh.KeyAlgoED25519}},
	config.KeyTypeECDSAP256: {ssh.KeyAlgoECDSA256, []string{ssh.KeyAlgoECDSA256}},
	config.KeyTypeRSA3072:   {ssh.KeyAlgoRSA, []string{ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSASHA512}},
}

func TestNewKeyMakesTheConfiguredType(t *testing.T) {
	if len(keyAlgorithms) != len(config.KeyTypes) {
		t.Fatalf("the test knows %d key types, the config %d", len(keyAlgorithms), len(config.KeyTypes))
	}
	for _, kt := range config.KeyTypes {
		private, authorized, err := NewKey(kt, "builds/build-1")
		if err != nil {
			t.Fatalf("%s: %v", kt, err)
		}
		if block, _ := pem.Decode(private); block == nil || block.Type != "OPENSSH PRIVATE KEY" || block.Headers["Proc-Type"] != "" {
			t.Errorf("%s: the private key is not an unencrypted OpenSSH key file", kt)
		}
		signer, err := ssh.ParsePrivateKey(private)
		if err != nil {
			t.Fatalf("%s: the private key does not parse: %v", kt, err)
		}
		if got := signer.PublicKey().Type(); got != keyAlgorithms[kt].keyType {
			t.Errorf("%s: the key is %s, want %s", kt, got, keyAlgorithms[kt].keyType)
		}
		pub, comment, _, rest, err := ssh.ParseAuthorizedKey(authorized)
		if err != nil || len(strings.TrimSpace(string(rest))) != 0 || comment != "" {
			t.Errorf("%s: %q is not one bare authorized_keys line: %v", kt, authorized, err)
		} else if string(pub.Marshal()) != string(signer.PublicKey().Marshal()) {
			t.Errorf("%s: the authorized_keys line is not the private key's public half", kt)
		}
		raw, err := ssh.ParseRawPrivateKey(private)
		if err != nil {
			t.Fatal(err)
		}
		switch k := raw.(type) {
		case *rsa.PrivateKey:
			if k.N.BitLen() != 3072 {
				t.Errorf("%s: %d bits", kt, k.N.BitLen())
			}
		case *ecdsa.PrivateKey:
			if k.Curve != elliptic.P256() {
				t.Errorf("%s: curve %s", kt, k.Curve.Params().Name)
			}
		}
	}
	_, zeroAuthorized, err := NewKey("", "x")
	if err != nil || !strings.HasPrefix(string(zeroAuthorized), ssh.KeyAlgoED25519+" ") {
		t.Errorf("the zero key type made %q (%v), want the default ed25519", zeroAuthorized, err)
	}
	if _, _, err := NewKey("dsa", "x"); err == nil || !strings.Contains(err.Error(), "rsa-3072") {
		t.Errorf("an unknown key type gave %v, want an error naming the known ones", err)
	}
}

// TestBuildUserLogsInWithEveryKeyType: on a real sshd, a user made with each key type logs in
// with its key signing by each algorithm a FIPS client would use, and by no other.
func TestBuildUserLogsInWithEveryKeyType(t *testing.T) {
	f := sshhosts.Shared(t, hosts)
	h := f.Hosts[0]
	for i, kt := range config.KeyTypes {
		uid := fmt.Sprintf("%08x-0000-4000-8000-00000000c0de", uids.Add(1))
		p := newBuiltWith(t, UserName(uid, 1), kt)
		dir, err := CreateUser(context.Background(), adminTarget(f, h), NewUser{Name: p.User, AuthorizedKey: p.authorized,
			Owner: fmt.Sprintf("builds/keys-%d %s", i, uid)})
		if err != nil {
			t.Fatalf("%s: creating the user: %v", kt, err)
		}
		t.Cleanup(func() { _ = Clean(context.Background(), adminTarget(f, h), p.User) })
		signer, err := ssh.ParsePrivateKey(p.Key)
		if err != nil {
			t.Fatal(err)
		}
		for _, alg := range keyAlgorithms[kt].signatures {
			only, err := ssh.NewSignerWithAlgorithms(signer.(ssh.AlgorithmSigner), []string{alg})
			if err != nil {
				t.Fatal(err)
			}
			out, err := h.RunAs(context.Background(), p.User, only, "cd "+dir+" && id -un")
			if err != nil || strings.TrimSpace(out) != p.User {
				t.Errorf("%s signing with %s: logged in as %q: %v", kt, alg, strings.TrimSpace(out), err)
			}
		}
	}
}

// longestOwner is the longest owner a build user can have: a 63-character namespace, a
// 253-character TaskRun name and a UID.
var longestOwner = strings.Repeat("n", 63) + "/" + strings.Repeat("t", 253) + " 5a0d7f3b-8e2c-4b6d-a0f1-7c9e3d6b2f45"

// TestForeignHostsTakeEveryKeyType: each key type's line reaches Windows and macOS whole on
// stdin, never on the command line, and the Windows command line stays within cmd.exe's 8191
// characters with the longest owner.
func TestForeignHostsTakeEveryKeyType(t *testing.T) {
	for _, kt := range config.KeyTypes {
		winUser := UserNameFor("windows/amd64", "5a0d7f3b-8e2c-4b6d-a0f1-7c9e3d6b2f45", 1)
		win, winTarget := fakeHost(t, "Administrator", func(sshfake.Command) sshfake.Reply {
			return sshfake.Reply{Stdout: `C:\berth\` + winUser + "\r\n"}
		})
		k := newBuiltWith(t, winUser, kt)
		if _, err := CreateUserOn(context.Background(), winTarget, "windows/amd64", NewUser{Name: winUser, AuthorizedKey: k.authorized,
			Owner: longestOwner}); err != nil {
			t.Fatalf("%s on Windows: %v", kt, err)
		}
		line := win.Commands()[0].Line
		t.Logf("%s: the Windows command line is %d characters", kt, len(line))
		if len(line) > 8191 {
			t.Errorf("%s on Windows: the command line is %d characters; cmd.exe takes at most 8191", kt, len(line))
		}
		key := strings.TrimSpace(string(k.authorized))
		if _, got := windowsScript(t, win.Commands()[0]); strings.TrimSpace(string(got)) != key {
			t.Errorf("%s on Windows: stdin after the script %q, want the key line", kt, got)
		}
		if strings.Contains(decodePowerShell(t, line), key) {
			t.Errorf("%s on Windows: the key line is on the command line", kt)
		}

		macUser := UserName("6b1e8a4c-9f3d-4c7e-b1a2-8d0f4e7c3a56", 1)
		mac, macTarget := fakeHost(t, "root", func(sshfake.Command) sshfake.Reply {
			return sshfake.Reply{Stdout: "/Users/" + macUser + "\n"}
		})
		k = newBuiltWith(t, macUser, kt)
		if _, err := CreateUserOn(context.Background(), macTarget, "darwin/arm64", NewUser{Name: macUser, AuthorizedKey: k.authorized}); err != nil {
			t.Fatalf("%s on macOS: %v", kt, err)
		}
		if got := mac.Commands()[0].Stdin; string(got) != string(k.authorized) {
			t.Errorf("%s on macOS: stdin %q, want the key line", kt, got)
		}
	}
}

// TestKeyStockHandsOutStockedRSAKeysOnce: once prepared, an RSA key comes from the stock, in
// the order made, and only once; other types never touch it.
func TestKeyStockHandsOutStockedRSAKeysOnce(t *testing.T) {
	const size = 2
	s := NewKeyStock(size)
	if _, authorized, err := s.NewKey(config.KeyTypeECDSAP256, "builds/a"); err != nil || !strings.HasPrefix(string(authorized), ssh.KeyAlgoECDSA256) {
		t.Fatalf("an ECDSA key through the stock: %q %v", authorized, err)
	}
	s.Prepare(config.KeyTypeEd25519)
	if s.Stocked() != 0 || s.filling.Load() {
		t.Fatal("the stock fills for a key type that is fast to make")
	}
	s.Prepare(config.KeyTypeRSA3072)
	deadline := time.Now().Add(time.Minute)
	for s.Stocked() < size || s.filling.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("the stock holds %d keys a minute after Prepare, want %d", s.Stocked(), size)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Look at the stock without disturbing it: nothing refills a full stock.
	var stocked []string
	for range size {
		key := <-s.rsa
		pub, err := ssh.NewPublicKey(key.Public())
		if err != nil {
			t.Fatal(err)
		}
		stocked = append(stocked, string(pub.Marshal()))
		s.rsa <- key
	}
	seen := map[string]bool{}
	for i := range size {
		private, authorized, err := s.NewKey(config.KeyTypeRSA3072, fmt.Sprintf("builds/b-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		signer, err := ssh.ParsePrivateKey(private)
		if err != nil {
			t.Fatal(err)
		}
		pub := string(signer.PublicKey().Marshal())
		if pub != stocked[i] {
			t.Errorf("key %d did not come from the stock", i)
		}
		if seen[pub] {
			t.Errorf("key %d was handed out before", i)
		}
		seen[pub] = true
		if got, _, _, _, _ := ssh.ParseAuthorizedKey(authorized); got == nil || string(got.Marshal()) != pub {
			t.Errorf("key %d: the authorized_keys line is not its public half", i)
		}
	}
}

// BenchmarkNewKey is what making one build user's key costs, per type, inside the reconcile
// that reserves the task's slot. "rsa-3072-stocked" is that cost when KeyStock has a key ready:
// only its encoding.
func BenchmarkNewKey(b *testing.B) {
	for _, kt := range config.KeyTypes {
		b.Run(string(kt), func(b *testing.B) {
			for b.Loop() {
				if _, _, err := NewKey(kt, "builds/build-1"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("rsa-3072-stocked", func(b *testing.B) {
		key, err := generateKey(config.KeyTypeRSA3072)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, _, err := marshalKey(key, "builds/build-1"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
