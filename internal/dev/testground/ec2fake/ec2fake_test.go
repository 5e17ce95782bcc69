//go:build linux

package ec2fake_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/berth-ci/berth/internal/dev/testground/ec2fake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

const (
	keyID  = "AKIAIOSFODNN7EXAMPLE"
	secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)

func start(t *testing.T) *ec2fake.Server {
	return ec2fake.NewForTest(t, ec2fake.Options{AccessKeyID: keyID, SecretAccessKey: secret, KeyPairs: []string{"k"}, Logf: t.Logf})
}

func client(srv *ec2fake.Server, id, key, region string) *ec2.Client {
	return ec2.New(ec2.Options{
		Region:       region,
		BaseEndpoint: aws.String(srv.URL()),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: id, SecretAccessKey: key}, nil
		}),
		RetryMaxAttempts: 1,
	})
}

func errorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// post sends a form as EC2's Query protocol does, signed with key when key is not empty;
// tamper changes the body after signing.
func post(t *testing.T, srv *ec2fake.Server, form url.Values, key string, tamper bool) (int, string) {
	t.Helper()
	body := form.Encode()
	req, err := http.NewRequest(http.MethodPost, srv.URL()+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		sum := sha256.Sum256([]byte(body))
		creds := aws.Credentials{AccessKeyID: keyID, SecretAccessKey: key}
		if err := v4.NewSigner().SignHTTP(context.Background(), creds, req, hex.EncodeToString(sum[:]), "ec2", "us-east-1", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if tamper {
		body = strings.Replace(body, "MinCount=1", "MinCount=2", 1)
		req.Body = io.NopCloser(strings.NewReader(body))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var e struct {
		Code      string `xml:"Errors>Error>Code"`
		RequestID string `xml:"RequestID"`
	}
	if resp.StatusCode != http.StatusOK {
		if err := xml.Unmarshal(data, &e); err != nil || e.RequestID == "" {
			t.Fatalf("error answer %d is not EC2's envelope: %s", resp.StatusCode, data)
		}
	}
	return resp.StatusCode, e.Code
}

func launchForm(drop string) url.Values {
	f := url.Values{"Action": {"RunInstances"}, "Version": {"2016-11-15"}, "ImageId": {"ami-0123456789abcdef0"}, "MinCount": {"1"}, "MaxCount": {"1"}, "KeyName": {"k"}}
	f.Del(drop)
	return f
}

func TestSignatureAndCredentials(t *testing.T) {
	srv := start(t)
	for _, tc := range []struct {
		name   string
		key    string
		tamper bool
		status int
		code   string
	}{
		{"unsigned", "", false, 401, "MissingAuthenticationToken"},
		{"wrong secret", "not-the-secret", false, 401, "AuthFailure"},
		{"body changed after signing", secret, true, 401, "AuthFailure"},
		{"good", secret, false, 200, ""},
	} {
		status, code := post(t, srv, launchForm(""), tc.key, tc.tamper)
		if status != tc.status || code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, code, tc.status, tc.code)
		}
	}
	ctx := t.Context()
	if _, err := client(srv, keyID, secret, "eu-west-1").DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); errorCode(err) != "AuthFailure" {
		t.Errorf("signed for another region: %v", err)
	}
	srv.RevokeAccessKey(keyID)
	if _, err := client(srv, keyID, secret, "us-east-1").DescribeInstances(ctx, &ec2.DescribeInstancesInput{}); errorCode(err) != "AuthFailure" {
		t.Errorf("revoked key: %v", err)
	}
	if n := srv.AuthFailures(); n != 5 {
		t.Errorf("AuthFailures %d, want 5", n)
	}
	if n := srv.Machines().LaunchCount(); n != 1 {
		t.Errorf("LaunchCount %d: only the good call may launch", n)
	}
	for _, inst := range srv.Instances() {
		if err := srv.TerminateFromConsole(inst.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRefusesWhatEC2Refuses(t *testing.T) {
	srv := start(t)
	for _, tc := range []struct {
		name string
		form url.Values
		code string
	}{
		{"no ImageId", launchForm("ImageId"), "MissingParameter"},
		{"no MinCount", launchForm("MinCount"), "MissingParameter"},
		{"no MaxCount", launchForm("MaxCount"), "MissingParameter"},
		{"unknown key pair", func() url.Values { f := launchForm(""); f.Set("KeyName", "nosuch"); return f }(), "InvalidKeyPair.NotFound"},
		{"malformed AMI", func() url.Values { f := launchForm(""); f.Set("ImageId", "rhel"); return f }(), "InvalidAMIID.Malformed"},
		{"long client token", func() url.Values { f := launchForm(""); f.Set("ClientToken", strings.Repeat("t", 65)); return f }(), "InvalidParameterValue"},
		{"user data not base64", func() url.Values { f := launchForm(""); f.Set("UserData", "#cloud-config"); return f }(), "InvalidParameterValue"},
		{"no action", url.Values{"Version": {"2016-11-15"}}, "MissingAction"},
		{"other action", url.Values{"Action": {"StopInstances"}, "InstanceId.1": {"i-0123456789abcdef0"}}, "InvalidAction"},
		{"describe an unknown instance", url.Values{"Action": {"DescribeInstances"}, "InstanceId.1": {"i-0123456789abcdef0"}}, "InvalidInstanceID.NotFound"},
		{"terminate nothing", url.Values{"Action": {"TerminateInstances"}}, "MissingParameter"},
		{"unknown filter", url.Values{"Action": {"DescribeInstances"}, "Filter.1.Name": {"colour"}, "Filter.1.Value.1": {"red"}}, "InvalidParameterValue"},
	} {
		if status, code := post(t, srv, tc.form, secret, false); status != 400 || code != tc.code {
			t.Errorf("%s: %d %s, want 400 %s", tc.name, status, code, tc.code)
		}
	}
	if n := srv.Machines().LaunchCount(); n != 0 {
		t.Errorf("LaunchCount %d after refused launches", n)
	}
}

func TestClientTokenAndPages(t *testing.T) {
	srv := start(t)
	ctx := t.Context()
	c := client(srv, keyID, secret, "us-east-1")
	run := func(token string) (*ec2.RunInstancesOutput, error) {
		return c.RunInstances(ctx, &ec2.RunInstancesInput{
			ImageId: aws.String("ami-0123456789abcdef0"), InstanceType: "m6g.large", KeyName: aws.String("k"),
			MinCount: aws.Int32(1), MaxCount: aws.Int32(1), ClientToken: aws.String(token),
		})
	}
	first, err := run("a")
	if err != nil {
		t.Fatal(err)
	}
	id := aws.ToString(first.Instances[0].InstanceId)
	if again, err := run("a"); err != nil || aws.ToString(again.Instances[0].InstanceId) != id {
		t.Fatalf("repeat: %v", err)
	}
	if _, err := c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id}}); err != nil {
		t.Fatal(err)
	}
	after, err := run("a")
	if err != nil || aws.ToString(after.Instances[0].InstanceId) != id || after.Instances[0].State.Name != "terminated" {
		t.Fatalf("repeat after terminate: %+v, %v", after, err)
	}
	other, err := c.RunInstances(ctx, &ec2.RunInstancesInput{
		ImageId: aws.String("ami-0123456789abcdef0"), InstanceType: "m6g.xlarge", KeyName: aws.String("k"),
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1), ClientToken: aws.String("a"),
	})
	if errorCode(err) != "IdempotentParameterMismatch" {
		t.Fatalf("same token, other request: %+v, %v", other, err)
	}
	for i := range 6 {
		if _, err := run(fmt.Sprintf("b%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	pages := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{
		MaxResults: aws.Int32(5),
		Filters:    []types.Filter{{Name: aws.String("instance-state-name"), Values: []string{"pending", "running"}}},
	})
	n, calls := 0, 0
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		calls++
		for _, r := range page.Reservations {
			n += len(r.Instances)
		}
	}
	if n != 6 || calls != 2 {
		t.Fatalf("%d live instances in %d pages, want 6 in 2", n, calls)
	}
	if got := srv.Machines().LaunchCount(); got != 7 {
		t.Fatalf("LaunchCount %d, want 7", got)
	}
	for _, inst := range srv.Instances() {
		if _, err := c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{inst.ID}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range srv.Machines().Instances() {
		if m.State != vmcloud.Gone {
			t.Errorf("machine %s is %s at the end", m.ID, m.State)
		}
	}
}

// An action IAM does not allow is refused as EC2 refuses it: 403, UnauthorizedOperation in
// EC2's envelope, a message naming the principal (and so the account) with an encoded
// authorization failure message, while other actions still answer.
func TestDenyAnswersUnauthorizedOperation(t *testing.T) {
	srv := start(t)
	const principal = "arn:aws:iam::210987654321:user/berth-launcher"
	srv.Deny("RunInstances", principal)
	if status, code := post(t, srv, launchForm(""), secret, false); status != http.StatusForbidden || code != "UnauthorizedOperation" {
		t.Fatalf("a denied RunInstances: %d %s, want 403 UnauthorizedOperation", status, code)
	}
	c := client(srv, keyID, secret, "us-east-1")
	_, err := c.RunInstances(t.Context(), &ec2.RunInstancesInput{ImageId: aws.String("ami-0123456789abcdef0"), MinCount: aws.Int32(1), MaxCount: aws.Int32(1), KeyName: aws.String("k")})
	var ae smithy.APIError
	if !errors.As(err, &ae) || ae.ErrorCode() != "UnauthorizedOperation" {
		t.Fatalf("the SDK read %v, want UnauthorizedOperation", err)
	}
	for _, want := range []string{"You are not authorized to perform this operation.", "User: " + principal, "ec2:RunInstances",
		"arn:aws:ec2:us-east-1:210987654321:instance/*", "Encoded authorization failure message: "} {
		if !strings.Contains(ae.ErrorMessage(), want) {
			t.Errorf("the message does not say %q: %s", want, ae.ErrorMessage())
		}
	}
	if _, err := c.DescribeInstances(t.Context(), &ec2.DescribeInstancesInput{}); err != nil {
		t.Errorf("DescribeInstances, which is not denied: %v", err)
	}
	if calls := srv.Calls("RunInstances"); len(calls) != 2 || calls[1].Error != "UnauthorizedOperation" {
		t.Errorf("calls %+v, want two refused RunInstances", calls)
	}
	if n := srv.Machines().LaunchCount(); n != 0 {
		t.Errorf("LaunchCount %d while RunInstances is denied", n)
	}
	srv.Allow("RunInstances")
	out, err := c.RunInstances(t.Context(), &ec2.RunInstancesInput{ImageId: aws.String("ami-0123456789abcdef0"), MinCount: aws.Int32(1), MaxCount: aws.Int32(1), KeyName: aws.String("k")})
	if err != nil {
		t.Fatalf("RunInstances once allowed: %v", err)
	}
	if err := srv.TerminateFromConsole(*out.Instances[0].InstanceId); err != nil {
		t.Fatal(err)
	}
}
