package otp_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"regexp"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/otp"
)

func TestTokensAreRandomURLSafeAnd256Bits(t *testing.T) {
	seen := map[string]bool{}
	var ones, bits int
	for range 1000 {
		text := otp.NewToken().String()
		if seen[text] {
			t.Fatalf("token %q drawn twice", text)
		}
		seen[text] = true
		if !regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`).MatchString(text) {
			t.Fatalf("token %q is not 43 characters of URL-safe base64", text)
		}
		raw, err := base64.RawURLEncoding.DecodeString(text)
		if err != nil || len(raw) != 32 {
			t.Fatalf("token %q: %d bytes, %v", text, len(raw), err)
		}
		for _, b := range raw {
			for ; b > 0; b >>= 1 {
				ones += int(b & 1)
			}
		}
		bits += 8 * len(raw)
	}
	// A generator stuck on zeros or ones, or a short read padded with zeros, shows here.
	if share := float64(ones) / float64(bits); share < 0.48 || share > 0.52 {
		t.Errorf("%.3f of the tokens' bits are set, want about half", share)
	}
}

func TestParseTokenTakesWhatTasksSend(t *testing.T) {
	tok := otp.NewToken()
	for _, sent := range []string{tok.String(), tok.String() + "\n", " " + tok.String() + "\r\n"} {
		got, err := otp.ParseToken(sent)
		if err != nil || got != tok {
			t.Errorf("ParseToken(%q) = %v, %v; want the token", sent, got, err)
		}
	}
	text := tok.String()
	for _, bad := range []string{"", text[:42], text + "A", strings.Replace(text, text[:1], "+", 1),
		strings.Repeat("=", 43), text[:40] + "%2F", "token=" + text} {
		if _, err := otp.ParseToken(bad); err != otp.ErrMalformed {
			t.Errorf("ParseToken(%q): %v, want ErrMalformed", bad, err)
		}
	}
	// The last character carries 4 bits of the token and 2 unused ones: only one spelling of
	// each token is accepted, so a token cannot be redeemed twice under two spellings.
	last := strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", text[42])
	alias := text[:42] + string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"[last^1])
	if got, err := otp.ParseToken(alias); err == nil && got == tok {
		t.Errorf("%q, a second spelling of the token, parses to it", alias)
	}
}

func TestNameIsStableAndTellsNothingOfTheToken(t *testing.T) {
	a, b := otp.NewToken(), otp.NewToken()
	if a.Name() != a.Name() {
		t.Fatal("a token's name changes")
	}
	if a.Name() == b.Name() {
		t.Fatal("two tokens share a name")
	}
	if !regexp.MustCompile(`^berth-otp-[0-9a-f]{32}$`).MatchString(a.Name()) {
		t.Errorf("name %q is not a Secret name of the expected shape", a.Name())
	}
	raw, _ := base64.RawURLEncoding.DecodeString(a.String())
	if strings.Contains(a.Name(), a.String()[:8]) || strings.Contains(a.Name(), hex.EncodeToString(raw)[:8]) {
		t.Errorf("name %q carries the token %q", a.Name(), a)
	}
}

func TestSealedKeyOpensOnlyWithItsTokenAndContext(t *testing.T) {
	tok := otp.NewToken()
	key := []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nsecret\n-----END OPENSSH PRIVATE KEY-----\n")
	context := []byte("allocation=a uid=1 user=u-1 expires=2030-01-01T00:00:00Z")
	sealed := tok.Seal(key, context)
	if bytes.Contains(sealed, []byte("secret")) || bytes.Contains(sealed, []byte("PRIVATE KEY")) {
		t.Fatal("the sealed key shows the key")
	}
	if again := tok.Seal(key, context); bytes.Equal(again, sealed) {
		t.Error("sealing twice gives the same bytes: the nonce is not fresh")
	}
	got, err := tok.Open(sealed, context)
	if err != nil || !bytes.Equal(got, key) {
		t.Fatalf("Open: %q, %v", got, err)
	}
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)/2] ^= 1
	for name, try := range map[string]func() ([]byte, error){
		"another token": func() ([]byte, error) { return otp.NewToken().Open(sealed, context) },
		"another context": func() ([]byte, error) {
			return tok.Open(sealed, []byte("allocation=b uid=1 user=u-1 expires=2099-01-01T00:00:00Z"))
		},
		"a flipped bit":     func() ([]byte, error) { return tok.Open(flipped, context) },
		"a truncated value": func() ([]byte, error) { return tok.Open(sealed[:20], context) },
		"nothing":           func() ([]byte, error) { return tok.Open(nil, context) },
	} {
		if got, err := try(); err != otp.ErrOpen || got != nil {
			t.Errorf("%s: %q, %v; want ErrOpen", name, got, err)
		}
	}
}
