//go:build linux

package vpcfake_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/berth-ci/berth/internal/dev/testground/iamfake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
	"github.com/berth-ci/berth/internal/dev/testground/vpcfake"
)

// The SDK always sends version, generation and a token; these are the API's answers to a
// client that does not.
func TestRefusesWhatTheRealAPIRefuses(t *testing.T) {
	m := vmcloud.NewForTest(t, vmcloud.Options{APIKey: "k", Hostless: true})
	s := vpcfake.NewForTest(t, vpcfake.Options{Machines: m, IAM: iamfake.NewForTest(t, "key")})
	for _, c := range []struct {
		query, auth string
		status      int
		code        string
	}{
		{"", "Bearer x", http.StatusBadRequest, "bad_request"},
		{"?version=2024-04-30", "Bearer x", http.StatusBadRequest, "bad_request"},
		{"?version=2024-04-30&generation=2", "", http.StatusUnauthorized, "not_authorized"},
		{"?version=2024-04-30&generation=2", "Bearer forged", http.StatusUnauthorized, "not_authorized"},
	} {
		req, _ := http.NewRequest(http.MethodGet, s.URL()+"/instances"+c.query, nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Errors []struct{ Code, Message, MoreInfo string } `json:"errors"`
			Trace  string                                     `json:"trace"`
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.status || len(body.Errors) != 1 || body.Errors[0].Code != c.code || body.Trace == "" {
			t.Errorf("%s with %q: %d %+v, want %d %s", c.query, c.auth, resp.StatusCode, body, c.status, c.code)
		}
	}
}
