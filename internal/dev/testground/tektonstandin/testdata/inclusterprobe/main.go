// Command inclusterprobe stands in for `berth cluster ...` in the stand-in's tests: it reaches
// the apiserver through rest.InClusterConfig, as a step of berth's image does, and prints as
// key=value lines who it acts as and how the apiserver answered a get it should be allowed
// and lists it should not. Its one argument is a namespace other than its own.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: inclusterprobe OTHER-NAMESPACE")
		os.Exit(2)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "in-cluster config:", err)
		os.Exit(1)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	own, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx := context.Background()
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "who am I:", err)
		os.Exit(1)
	}
	user := review.Status.UserInfo
	fmt.Printf("user=%s\n", user.Username)
	fmt.Printf("pod=%s\n", strings.Join(user.Extra["authentication.kubernetes.io/pod-name"], ","))
	_, err = cs.CoreV1().ConfigMaps(string(own)).Get(ctx, "visible", metav1.GetOptions{})
	fmt.Printf("get-configmap=%s\n", outcome(err))
	_, err = cs.CoreV1().ConfigMaps(os.Args[1]).List(ctx, metav1.ListOptions{})
	fmt.Printf("list-configmaps-elsewhere=%s\n", outcome(err))
	_, err = cs.CoreV1().Secrets(string(own)).List(ctx, metav1.ListOptions{})
	fmt.Printf("list-secrets=%s\n", outcome(err))
}

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	if reason := apierrors.ReasonForError(err); reason != metav1.StatusReasonUnknown {
		return string(reason)
	}
	return err.Error()
}
