package cloud_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/berth-ci/berth/internal/cloud"
)

func TestCredentials(t *testing.T) {
	const value = "s3cr3t-value"
	read := func(err error, data map[string][]byte) cloud.SecretReader {
		return func(context.Context, string) (map[string][]byte, error) { return data, err }
	}
	cases := []struct {
		name    string
		read    cloud.SecretReader
		kind    cloud.Kind
		mention []string
	}{
		{"missing Secret", read(fmt.Errorf("get: %w", cloud.ErrNoSecret), nil), cloud.Auth, []string{"Secret creds", "id and key", "does not exist"}},
		{"forbidden", read(fmt.Errorf("get: %w", cloud.ErrSecretForbidden), nil), cloud.Auth, []string{"may not read Secret creds"}},
		{"apiserver down", read(errors.New("connection refused"), nil), cloud.Transient, []string{"reading Secret creds"}},
		{"missing key", read(nil, map[string][]byte{"id": []byte(value)}), cloud.Auth, []string{"Secret creds has no key key"}},
		{"blank key", read(nil, map[string][]byte{"id": []byte(value), "key": []byte(" \n")}), cloud.Auth, []string{"no key key"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.read.Credentials(context.Background(), "launch", "creds", "the test key", "id", "key")
			if cloud.KindOf(err) != c.kind {
				t.Fatalf("kind %v (%v), want %v", cloud.KindOf(err), err, c.kind)
			}
			for _, m := range c.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("%q does not mention %q", err, m)
				}
			}
			if strings.Contains(err.Error(), value) {
				t.Errorf("the error carries the credential: %q", err)
			}
		})
	}
	got, err := read(nil, map[string][]byte{"id": []byte(" a\n"), "key": []byte("b"), "extra": []byte("c ")}).Credentials(context.Background(), "get", "creds", "the test key", "id", "key")
	if err != nil || got["id"] != "a" || got["key"] != "b" || got["extra"] != "c" {
		t.Fatalf("got %v, %v; want every key, trimmed", got, err)
	}
}
