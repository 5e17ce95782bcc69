package iamfake

import (
	"testing"

	"github.com/IBM/go-sdk-core/v5/core"
)

// The IBM SDK's own authenticator gets a token for a known key and is refused for another.
func TestSDKAuthenticator(t *testing.T) {
	s := NewForTest(t, "good-key")
	auth, err := core.NewIamAuthenticatorBuilder().SetApiKey("good-key").SetURL(s.URL()).Build()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := auth.GetToken()
	if err != nil {
		t.Fatalf("token for a known key: %v", err)
	}
	if !s.Valid("Bearer " + tok) {
		t.Fatalf("the endpoint does not know the token it issued")
	}
	if s.Valid("Bearer made-up") || s.Valid(tok) {
		t.Fatalf("a made-up token, or one without Bearer, passes")
	}

	bad, err := core.NewIamAuthenticatorBuilder().SetApiKey("wrong-key").SetURL(s.URL()).Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.GetToken(); err == nil {
		t.Fatalf("a token for an unknown key")
	} else if ae, ok := err.(*core.AuthenticationError); !ok || ae.Response == nil || ae.Response.StatusCode != 400 {
		t.Fatalf("refusal of an unknown key: %T %v, want an AuthenticationError with status 400", err, err)
	}

	s.Fail(1)
	fresh, _ := core.NewIamAuthenticatorBuilder().SetApiKey("good-key").SetURL(s.URL()).Build()
	if _, err := fresh.GetToken(); err == nil {
		t.Fatalf("no error while the endpoint fails")
	}
	if _, err := fresh.GetToken(); err != nil {
		t.Fatalf("after the failure passed: %v", err)
	}
	s.RevokeAll()
	if s.Valid("Bearer " + tok) {
		t.Fatalf("a revoked token passes")
	}
}
