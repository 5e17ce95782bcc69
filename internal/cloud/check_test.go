package cloud_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/berth-ci/berth/internal/cloud"
	_ "github.com/berth-ci/berth/internal/cloud/awsec2"
	_ "github.com/berth-ci/berth/internal/cloud/ibmp"
	_ "github.com/berth-ci/berth/internal/cloud/ibmz"
	_ "github.com/berth-ci/berth/internal/dev/localvm"
)

// Test types, registered once per test binary (a second Register panics, and -count runs the
// tests again in the same process).
func init() {
	// reads-secret reads its credentials as it is built, which a factory must not.
	cloud.Register("check-test-reads-secret", func(s cloud.Settings) (cloud.Provider, error) {
		_, err := s.Secret.Credentials(context.Background(), "setup", "creds", "the key", "key")
		return nil, err
	})
	// refuses-and-scribbles refuses any settings, and writes into the ones it was given.
	cloud.Register("check-test-refuses", func(s cloud.Settings) (cloud.Provider, error) {
		s.Values["scribbled"] = "yes"
		return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s: zone: %q is no zone", s.Platform, s.Values["zone"])
	})
}

// TestCheckCallsNobody: Check judges every registered type's settings as its factory does,
// and no request reaches the endpoints they name.
func TestCheckCallsNobody(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		t.Errorf("Check called %s %s", r.Method, r.URL)
		http.Error(w, "no", http.StatusTeapot)
	}))
	defer srv.Close()
	good := map[string]map[string]string{
		"aws": {"region": "us-east-1", "ami": "ami-0123456789abcdef0", "instance-type": "m6g.large", "key-name": "builders",
			"aws-secret": "aws-account", "endpoint": srv.URL, "disk": "40", "iops": "4000", "throughput": "1000"},
		"ibmz": {"region": "us-east-2", "vpc": "v", "subnet": "s", "key": "k", "image-id": "i", "profile": "bz2-2x8", "secret": "ibm",
			"url": srv.URL + "/v1", "iam-url": srv.URL},
		"ibmp": {"url": srv.URL, "iam-url": srv.URL, "crn": "crn:v1:bluemix:public:power-iaas:dal10:a/abc:ws-1::", "network": "net",
			"image": "rhel", "key": "k", "secret": "ibm"},
		"local-vm": {"endpoint": srv.URL, "secret": "vm-api"},
	}
	for typ, values := range good {
		if err := cloud.Check(typ, "linux/test", values); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
	}
	bad := map[string]struct {
		values map[string]string
		key    string // the key the error names, for config to report the problem on
		want   []string
	}{
		"aws": {map[string]string{"region": "us-east-1", "ami": "ami-0123456789abcdef0", "instance-type": "m6g.large", "key-name": "builders",
			"aws-secret": "aws-account", "endpoint": srv.URL, "iops": "3000", "throughput": "2000"},
			"throughput", []string{"platform linux/test: throughput: 2000 MiB/s needs at least 8000 iops", "0.25 MiB/s per provisioned IOPS"}},
		"ibmz": {map[string]string{"region": "us-east-2", "vpc": "v", "subnet": "s", "key": "k", "image-id": "i", "profile": "p", "secret": "ibm",
			"url": srv.URL, "disk": "5"}, "disk", []string{`platform linux/test: disk: "5" is not`}},
		"ibmp": {map[string]string{"url": srv.URL, "crn": "crn:v1:nope", "network": "net", "image": "rhel", "key": "k", "secret": "ibm"},
			"crn", []string{`platform linux/test: crn: "crn:v1:nope"`}},
		"local-vm": {map[string]string{"endpoint": "ftp://x", "secret": "vm-api"}, "endpoint", []string{`platform linux/test: endpoint: "ftp://x"`}},
	}
	for typ, tc := range bad {
		err := cloud.Check(typ, "linux/test", tc.values)
		if cloud.KindOf(err) != cloud.BadConfig {
			t.Errorf("%s: %v; want a BadConfig error", typ, err)
			continue
		}
		var keyed interface{ ConfigKey() string }
		if !errors.As(err, &keyed) || keyed.ConfigKey() != tc.key {
			t.Errorf("%s: %v names no key, or not %s", typ, err, tc.key)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", typ, err, w)
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests reached the cloud", n)
	}
}

func TestCheckJudgesOnlySettings(t *testing.T) {
	if err := cloud.Check("no-such-type", "linux/test", nil); err != nil {
		t.Errorf("an unknown type is config.Parse's to report, not Check's: %v", err)
	}
	if err := cloud.Check("check-test-reads-secret", "linux/test", nil); err != nil {
		t.Errorf("a factory's failure to read a Secret says nothing of the settings: %v", err)
	}
	values := map[string]string{"zone": "mars-1"}
	err := cloud.Check("check-test-refuses", "linux/test", values)
	if cloud.KindOf(err) != cloud.BadConfig || !strings.Contains(err.Error(), `platform linux/test: zone: "mars-1" is no zone`) {
		t.Errorf("got %v; want the factory's BadConfig error", err)
	}
	if len(values) != 1 {
		t.Errorf("the factory changed the caller's settings: %v", values)
	}
}
