//go:build linux

package ec2fake

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// sigV4 is what the Authorization header of a Signature Version 4 request says.
type sigV4 struct {
	accessKeyID   string
	date          string // yyyymmdd of the credential scope
	region        string
	service       string
	signedHeaders []string
	signature     string
}

// parseSigV4 reads "AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/ec2/aws4_request,
// SignedHeaders=host;x-amz-date, Signature=hex".
func parseSigV4(h string) (sigV4, error) {
	const algorithm = "AWS4-HMAC-SHA256 "
	if !strings.HasPrefix(h, algorithm) {
		return sigV4{}, fmt.Errorf("the Authorization header is not of AWS4-HMAC-SHA256")
	}
	var s sigV4
	for part := range strings.SplitSeq(strings.TrimPrefix(h, algorithm), ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return sigV4{}, fmt.Errorf("the Authorization header has a part %q without =", part)
		}
		switch k {
		case "Credential":
			scope := strings.Split(v, "/")
			if len(scope) != 5 || scope[4] != "aws4_request" {
				return sigV4{}, fmt.Errorf("the credential scope %q is not AKID/date/region/service/aws4_request", v)
			}
			s.accessKeyID, s.date, s.region, s.service = scope[0], scope[1], scope[2], scope[3]
		case "SignedHeaders":
			s.signedHeaders = strings.Split(v, ";")
		case "Signature":
			s.signature = v
		}
	}
	if s.accessKeyID == "" || len(s.signedHeaders) == 0 || s.signature == "" {
		return sigV4{}, fmt.Errorf("the Authorization header lacks Credential, SignedHeaders or Signature")
	}
	return s, nil
}

// verifySigV4 recomputes the request's signature with the SDK's own signer, from the headers
// the client signed and nothing else (the transport adds some after signing), and compares.
func verifySigV4(r *http.Request, body []byte, sig sigV4, secretAccessKey string) error {
	signingTime, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return fmt.Errorf("no valid X-Amz-Date header")
	}
	if signingTime.Format("20060102") != sig.date {
		return fmt.Errorf("the credential scope's date is not the date of X-Amz-Date")
	}
	if d := time.Since(signingTime); d > 15*time.Minute || d < -15*time.Minute {
		return fmt.Errorf("the request was signed at %s, too far from now", signingTime)
	}
	again, err := http.NewRequest(r.Method, r.URL.String(), nil)
	if err != nil {
		return err
	}
	again.Host = r.Host
	for _, name := range sig.signedHeaders {
		switch name {
		case "host":
		case "content-length":
			again.ContentLength = r.ContentLength
		default:
			again.Header[http.CanonicalHeaderKey(name)] = r.Header.Values(name)
		}
	}
	sum := sha256.Sum256(body)
	creds := aws.Credentials{AccessKeyID: sig.accessKeyID, SecretAccessKey: secretAccessKey}
	if err := v4.NewSigner().SignHTTP(r.Context(), creds, again, hex.EncodeToString(sum[:]), sig.service, sig.region, signingTime); err != nil {
		return err
	}
	want, err := parseSigV4(again.Header.Get("Authorization"))
	if err != nil {
		return err
	}
	if subtle.ConstantTimeCompare([]byte(want.signature), []byte(sig.signature)) != 1 {
		return fmt.Errorf("the signature does not match")
	}
	return nil
}
