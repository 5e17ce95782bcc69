package security_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/berth-ci/berth/internal/dev/devstack"
	"github.com/berth-ci/berth/internal/dev/testground/sshhosts"
)

// A host owner's view of a host is read from this machine's side of the host's private
// directories (sshhosts binds them over the host's /etc, /root and /home), never through a
// login on the host: what berth may have been tricked into doing cannot hide itself there.

// tree is a fingerprint of a directory tree: for each path, what it is, its mode and owner,
// where a link points and a hash of a file's content.
type tree map[string]string

// fingerprint walks dir; the keys are paths as the host sees them (under as). With times, it
// also records inode, ctime and mtime, so that touching a file without changing it shows.
func fingerprint(t *testing.T, dir, as string, times bool, skip func(rel string) bool) tree {
	t.Helper()
	out := tree{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // removed while we walked (a finishing useradd, say): not a change of ours
			}
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if skip != nil && skip(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		st := info.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%s uid=%d gid=%d", info.Mode(), st.Uid, st.Gid)
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(data)
			desc += " sha256=" + hex.EncodeToString(sum[:])
		}
		if times {
			desc += fmt.Sprintf(" ino=%d ctime=%d.%09d mtime=%d.%09d", st.Ino, st.Ctim.Sec, st.Ctim.Nsec, st.Mtim.Sec, st.Mtim.Nsec)
		}
		out[filepath.Join(as, rel)] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("fingerprinting %s: %v", dir, err)
	}
	return out
}

// diff names what differs between two fingerprints, for a message.
func (before tree) diff(after tree) []string {
	var changes []string
	for p, d := range before {
		switch a, ok := after[p]; {
		case !ok:
			changes = append(changes, "removed "+p+" ("+d+")")
		case a != d:
			changes = append(changes, "changed "+p+": "+d+" => "+a)
		}
	}
	for p, a := range after {
		if _, ok := before[p]; !ok {
			changes = append(changes, "added "+p+" ("+a+")")
		}
	}
	slices.Sort(changes)
	return changes
}

// accountBackups are the copies useradd and userdel keep of the files they rewrite (passwd-,
// shadow-, ...), and the lock they leave: written by root's own tools, and different after
// every user made or removed.
func accountBackups(rel string) bool {
	return rel == ".pwd.lock" || !strings.Contains(rel, "/") && strings.HasSuffix(rel, "-")
}

// hostFiles fingerprints what root on a host could be tricked into changing: all of /etc,
// /root and /home. After every build user is gone they must be as they were before the task.
func hostFiles(t *testing.T, h *sshhosts.Host) tree {
	t.Helper()
	all := fingerprint(t, h.EtcDir, "/etc", false, accountBackups)
	for p, d := range fingerprint(t, h.RootHomeDir, "/root", false, nil) {
		all[p] = d
	}
	for p, d := range fingerprint(t, h.HomeDir, "/home", false, nil) {
		all[p] = d
	}
	return all
}

func allHostFiles(t *testing.T) map[string]tree {
	t.Helper()
	trees := map[string]tree{}
	for _, h := range stack.Fleet.Hosts {
		trees[h.Name] = hostFiles(t, h)
	}
	return trees
}

// sameHostFiles fails the test for every host whose /etc, /root or /home differ from before.
func sameHostFiles(t *testing.T, before map[string]tree) {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		if changes := before[h.Name].diff(hostFiles(t, h)); len(changes) > 0 {
			t.Errorf("host %s: %d files outside build users' homes changed: %s", h.Name, len(changes), limit(changes, 20))
		}
	}
}

// homeOf fingerprints a build user's home with times: berth must not touch it at all once the
// tenant tampered with the secret.
func homeOf(t *testing.T, h *sshhosts.Host, user string) tree {
	t.Helper()
	return fingerprint(t, filepath.Join(h.HomeDir, user), "/home/"+user, true, nil)
}

// sudoRules fingerprints /etc/sudoers.d of a host.
func sudoRules(t *testing.T, h *sshhosts.Host) tree {
	t.Helper()
	return fingerprint(t, filepath.Join(h.EtcDir, "sudoers.d"), "/etc/sudoers.d", false, nil)
}

func limit(items []string, n int) string {
	if len(items) > n {
		return strings.Join(items[:n], "; ") + fmt.Sprintf("; and %d more", len(items)-n)
	}
	return strings.Join(items, "; ")
}

// buildUsers lists the berth build users a host's account database holds.
func buildUsers(t *testing.T, h *sshhosts.Host) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(h.EtcDir, "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, line := range strings.Split(string(data), "\n") {
		if name, _, _ := strings.Cut(line, ":"); strings.HasPrefix(name, "u-") {
			users = append(users, name)
		}
	}
	return users
}

func userExists(t *testing.T, h *sshhosts.Host, user string) bool {
	t.Helper()
	return slices.Contains(buildUsers(t, h), user)
}

// noBuildUsersLeft: every build user, and its home, is gone from every host.
func noBuildUsersLeft(t *testing.T) {
	t.Helper()
	for _, h := range stack.Fleet.Hosts {
		if users := buildUsers(t, h); len(users) > 0 {
			t.Errorf("host %s still has build users %v", h.Name, users)
		}
		homes, err := filepath.Glob(filepath.Join(h.HomeDir, "u-*"))
		if err != nil {
			t.Fatal(err)
		}
		if len(homes) > 0 {
			t.Errorf("host %s still has build users' homes %v", h.Name, homes)
		}
	}
}

// loginWith logs in to h as user with the private key a tenant secret holds, runs command and
// returns its output.
func loginWith(t *testing.T, h *sshhosts.Host, user string, s *corev1.Secret, command string) (string, error) {
	t.Helper()
	signer, err := ssh.ParsePrivateKey(s.Data["id_rsa"])
	if err != nil {
		t.Fatalf("the key in secret %s: %v", s.Name, err)
	}
	return h.RunAs(context.Background(), user, signer, command)
}

// adminKey is one private key kept in berth's namespace: its public half, the PEM as stored,
// and a line of its body (to find it quoted inside a message).
type adminKey struct {
	secret, field string
	public        []byte
	pem           []byte
	bodyLine      []byte
}

// adminKeys are all private keys kept in any secret of berth's namespace.
func adminKeys(t *testing.T) []adminKey {
	t.Helper()
	var list corev1.SecretList
	if err := admin().List(context.Background(), &list, client.InNamespace(devstack.Namespace)); err != nil {
		t.Fatal(err)
	}
	var keys []adminKey
	for _, s := range list.Items {
		for field, v := range s.Data {
			k, err := ssh.ParsePrivateKey(v)
			if err != nil {
				continue
			}
			lines := bytes.Split(bytes.TrimSpace(v), []byte("\n"))
			body := lines[len(lines)/2]
			keys = append(keys, adminKey{secret: s.Name, field: field, public: k.PublicKey().Marshal(), pem: v, bodyLine: body})
		}
	}
	if len(keys) == 0 {
		t.Fatal("found no admin key in berth's namespace to look for")
	}
	return keys
}

// noAdminKeyIn fails if any secret of the namespace holds an admin key, under any field, as a
// key or quoted inside any text.
func noAdminKeyIn(t *testing.T, ns string) {
	t.Helper()
	admins := adminKeys(t)
	var list corev1.SecretList
	if err := admin().List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		for field, v := range s.Data {
			k, parseErr := ssh.ParsePrivateKey(v)
			for _, a := range admins {
				if parseErr == nil && bytes.Equal(k.PublicKey().Marshal(), a.public) ||
					bytes.Contains(v, bytes.TrimSpace(a.pem)) || len(a.bodyLine) > 16 && bytes.Contains(v, a.bodyLine) {
					t.Errorf("secret %s/%s field %s holds the admin key of %s/%s (field %s)", ns, s.Name, field, devstack.Namespace, a.secret, a.field)
				}
			}
		}
	}
}
