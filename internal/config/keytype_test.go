package config

import (
	"strings"
	"testing"
)

func TestUserKeyTypeDefaultsToEd25519(t *testing.T) {
	cfg, problems := Parse(base())
	if problems.HasErrors() {
		t.Fatalf("the base config has errors: %s", problems.Summary())
	}
	if cfg.UserKeyType != KeyTypeEd25519 {
		t.Fatalf("without user-key-type the key type is %q, want ed25519", cfg.UserKeyType)
	}
}

func TestUserKeyTypeIsRead(t *testing.T) {
	for raw, want := range map[string]KeyType{
		"ed25519":      KeyTypeEd25519,
		"ecdsa-p256":   KeyTypeECDSAP256,
		"rsa-3072":     KeyTypeRSA3072,
		" RSA-3072\n":  KeyTypeRSA3072, // as a folded YAML value or a shouting operator writes it
		"ECDSA-P256":   KeyTypeECDSAP256,
		"":             KeyTypeEd25519,
		"   ":          KeyTypeEd25519,
		"\ted25519\t ": KeyTypeEd25519,
	} {
		cfg, problems := Parse(with(map[string]string{"user-key-type": raw}))
		if problems.HasErrors() {
			t.Errorf("user-key-type %q: %s", raw, problems.Summary())
			continue
		}
		if cfg.UserKeyType != want {
			t.Errorf("user-key-type %q gave %q, want %q", raw, cfg.UserKeyType, want)
		}
	}
}

func TestBadUserKeyTypeIsAnErrorWithTheAcceptedValues(t *testing.T) {
	for _, tc := range []struct {
		raw, suggestion string
	}{
		{"rsa3072", "rsa-3072"},
		{"ecdsa-p265", "ecdsa-p256"},
		{"ed2519", "ed25519"},
		{"ssh-ed25519", "ed25519"},
		{"rsa", "rsa-3072"},
		{"ecdsa", "ecdsa-p256"},
		{"rsa-4096", "rsa-3072"},
		{"dsa-1024-please-no-thanks", ""},
	} {
		cfg, problems := Parse(with(map[string]string{"user-key-type": tc.raw}))
		var found *Problem
		for i, p := range problems {
			if p.Key == "user-key-type" {
				found = &problems[i]
			}
		}
		if found == nil || found.Severity != Error {
			t.Errorf("user-key-type %q: no error on user-key-type in %s", tc.raw, problems.Summary())
			continue
		}
		for _, accepted := range []string{"ed25519", "ecdsa-p256", "rsa-3072", tc.raw} {
			if !strings.Contains(found.Message, accepted) {
				t.Errorf("user-key-type %q: the message %q does not name %q", tc.raw, found.Message, accepted)
			}
		}
		hint := "did you mean " + tc.suggestion + "?"
		if tc.suggestion == "" && strings.Contains(found.Message, "did you mean") {
			t.Errorf("user-key-type %q: the message %q guesses, though nothing is close", tc.raw, found.Message)
		}
		if tc.suggestion != "" && !strings.Contains(found.Message, hint) {
			t.Errorf("user-key-type %q: the message %q lacks %q", tc.raw, found.Message, hint)
		}
		if cfg.UserKeyType != DefaultKeyType {
			t.Errorf("user-key-type %q: the config has key type %q, want the default kept", tc.raw, cfg.UserKeyType)
		}
	}
}

func TestMisspelledUserKeyTypeKeyIsPointedAtIt(t *testing.T) {
	_, problems := Parse(with(map[string]string{"user-keytype": "rsa-3072"}))
	for _, p := range problems {
		if p.Key == "user-keytype" && strings.Contains(p.Message, "user-key-type") {
			return
		}
	}
	t.Fatalf("a misspelled user-key-type key is not pointed at the right one: %s", problems.Summary())
}
