// Package tasksecret builds the secret a user task waits for, multi-platform-ssh-<taskrun>,
// in exactly the shapes of the contract: success with a host (its key, or a one-time token for
// it), local, or an error a person can act on. Every path of berth ends in one of these,
// because the secret is the only thing that lets the task's pod start.
package tasksecret

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/berth-ci/berth/internal/contract"
)

const (
	// Prefix of the secret's name; the rest is the TaskRun's name.
	Prefix = contract.SecretPrefix
	// Label is on every secret berth creates, so caches and cleanups can select them.
	Label = contract.SecretLabel
)

// Name is the secret a TaskRun mounts.
func Name(taskRun string) string { return Prefix + taskRun }

// Owner is the user TaskRun the secret belongs to. berth deletes the secret itself when the
// TaskRun ends or goes; the owner reference is for a garbage collector to catch what berth
// could not (berth uninstalled while the TaskRun went), and tells berth which TaskRun it wrote
// the secret for.
type Owner struct {
	Name, Namespace string
	UID             types.UID
}

// ForHost is the success secret: the per-task user's key, user@address and build directory.
func ForHost(owner Owner, secretName, host, userDir string, privateKey []byte) *corev1.Secret {
	return build(owner, secretName, map[string][]byte{"id_rsa": privateKey, "host": []byte(host), "user-dir": []byte(userDir)})
}

// ForOTP is the success secret with the one-time-password server: in place of the key, a
// token the task redeems for it once (otp) at the server's URL (otp-server, path included),
// and the CA of the server's certificate (otp-ca).
func ForOTP(owner Owner, secretName, token, serverURL string, serverCA []byte, host, userDir string) *corev1.Secret {
	return build(owner, secretName, map[string][]byte{"otp": []byte(token), "otp-server": []byte(serverURL), "otp-ca": serverCA,
		"host": []byte(host), "user-dir": []byte(userDir)})
}

// ForLocal tells the task to build where it runs.
func ForLocal(owner Owner) *corev1.Secret {
	return build(owner, Name(owner.Name), map[string][]byte{"host": []byte(contract.Localhost)})
}

// ForError carries a message the task prints before it exits, instead of waiting forever.
func ForError(owner Owner, message string) *corev1.Secret {
	return build(owner, Name(owner.Name), map[string][]byte{"error": []byte(message)})
}

func build(owner Owner, name string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: owner.Namespace,
			Labels:    map[string]string{Label: "true"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "tekton.dev/v1", Kind: "TaskRun", Name: owner.Name, UID: owner.UID,
			}},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}
