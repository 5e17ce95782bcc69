package awsec2

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/berth-ci/berth/internal/cloud"
)

const (
	accessKeyIDKey     = "access-key-id"
	secretAccessKeyKey = "secret-access-key"
	// sessionTokenKey is optional, for temporary credentials, as upstream reads it.
	sessionTokenKey = "session-token"
	// credentialsTTL bounds how long credentials read from the Secret are used before it is
	// read again, so that a rotated key is picked up without a restart.
	credentialsTTL = 2 * time.Minute
)

// secretCredentials reads the platform's AWS key from its Secret when the SDK asks.
type secretCredentials struct {
	name string
	read cloud.SecretReader
}

func (c secretCredentials) Retrieve(ctx context.Context) (aws.Credentials, error) {
	values, err := c.read.Credentials(ctx, "credentials", c.name, "the AWS key", accessKeyIDKey, secretAccessKeyKey)
	if err != nil {
		return aws.Credentials{}, err
	}
	return aws.Credentials{
		AccessKeyID:     values[accessKeyIDKey],
		SecretAccessKey: values[secretAccessKeyKey],
		SessionToken:    values[sessionTokenKey],
		Source:          "Secret " + c.name,
		CanExpire:       true,
		Expires:         time.Now().Add(credentialsTTL),
	}, nil
}

// code is the EC2 error code of err, or "".
func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// Error codes by what berth should do about them. Codes not listed go by their prefix and
// the HTTP status (kindOfCode).
var kinds = map[string]cloud.Kind{
	"InsufficientInstanceCapacity":          cloud.Capacity,
	"InsufficientHostCapacity":              cloud.Capacity,
	"InsufficientCapacity":                  cloud.Capacity,
	"InsufficientAddressCapacity":           cloud.Capacity,
	"InsufficientFreeAddressesInSubnet":     cloud.Capacity,
	"InsufficientReservedInstanceCapacity":  cloud.Capacity,
	"InsufficientCapacityOnHost":            cloud.Capacity,
	"Unsupported":                           cloud.Capacity, // "instance type not supported in this Availability Zone"
	"InstanceLimitExceeded":                 cloud.Quota,
	"VcpuLimitExceeded":                     cloud.Quota,
	"ResourceLimitExceeded":                 cloud.Quota,
	"MaxSpotInstanceCountExceeded":          cloud.Quota,
	"RequestLimitExceeded":                  cloud.Throttled,
	"Throttling":                            cloud.Throttled,
	"ThrottlingException":                   cloud.Throttled,
	"InvalidInstanceID.NotFound":            cloud.NotFound,
	"InvalidInstanceID.Malformed":           cloud.NotFound,
	"AuthFailure":                           cloud.Auth,
	"UnauthorizedOperation":                 cloud.Auth,
	"InvalidClientTokenId":                  cloud.Auth,
	"SignatureDoesNotMatch":                 cloud.Auth,
	"MissingAuthenticationToken":            cloud.Auth,
	"IncompleteSignature":                   cloud.Auth,
	"ExpiredToken":                          cloud.Auth,
	"OptInRequired":                         cloud.Auth,
	"Blocked":                               cloud.Auth,
	"InternalError":                         cloud.Transient,
	"Unavailable":                           cloud.Transient,
	"ServiceUnavailable":                    cloud.Transient,
	"IdempotentParameterMismatch":           cloud.BadConfig,
	"InvalidParameterValue":                 cloud.BadConfig,
	"InvalidParameter":                      cloud.BadConfig,
	"InvalidParameterCombination":           cloud.BadConfig,
	"MissingParameter":                      cloud.BadConfig,
	"TagLimitExceeded":                      cloud.BadConfig,
	"InvalidBlockDeviceMapping":             cloud.BadConfig,
	"InvalidInstanceType":                   cloud.BadConfig,
	"InvalidUserData.Malformed":             cloud.BadConfig,
	"UnsupportedOperation":                  cloud.BadConfig,
	"InvalidAction":                         cloud.BadConfig,
	"InvalidIamInstanceProfile.NotFound":    cloud.BadConfig,
	"InvalidLicenseConfiguration.NotFound":  cloud.BadConfig,
	"InvalidHostResourceGroupArn.Malformed": cloud.BadConfig,
}

// prefixKinds: InvalidAMIID.NotFound, InvalidKeyPair.NotFound, InvalidSubnetID.NotFound,
// InvalidGroup.NotFound and their .Malformed kin.
var prefixKinds = map[string]cloud.Kind{
	"InvalidAMIID.":    cloud.BadConfig,
	"InvalidKeyPair.":  cloud.BadConfig,
	"InvalidSubnetID.": cloud.BadConfig,
	"InvalidSubnet.":   cloud.BadConfig,
	"InvalidGroup.":    cloud.BadConfig,
	"InvalidGroupId.":  cloud.BadConfig,
}

// hints name the config key behind a BadConfig code.
var hints = map[string]string{
	"InvalidAMIID.":                "ami",
	"InvalidKeyPair.":              "key-name",
	"InvalidSubnetID.":             "subnet-id",
	"InvalidSubnet.":               "subnet-id",
	"InvalidGroup.":                "security-group or security-group-id",
	"InvalidGroupId.":              "security-group-id",
	"InvalidInstanceType":          "instance-type",
	"InvalidIamInstanceProfile.":   "instance-profile-name or instance-profile-arn",
	"IdempotentParameterMismatch":  "the settings changed while a launch was retried",
	"InvalidLicenseConfiguration.": "license-configuration-arn",
	"InvalidHostResourceGroupArn.": "host-resource-group-arn",
	"InvalidBlockDeviceMapping":    "disk, iops or throughput",
	"InvalidUserData.":             "user-data",
	"InvalidParameterCombination":  "the settings",
	"UnauthorizedOperation":        "the IAM policy of the key (see docs/clouds/aws.md)",
	"Unsupported":                  "instance-type, subnet-id",
	"VcpuLimitExceeded":            "the account's vCPU quota",
	"InstanceLimitExceeded":        "the account's instance quota",
}

func kindOfCode(code string, status int) cloud.Kind {
	if k, ok := kinds[code]; ok {
		return k
	}
	for prefix, k := range prefixKinds {
		if strings.HasPrefix(code, prefix) {
			return k
		}
	}
	switch {
	case status >= 500 || status == 0:
		return cloud.Transient
	case strings.HasPrefix(code, "Invalid") || strings.HasPrefix(code, "Missing") || strings.HasPrefix(code, "Unknown"):
		return cloud.BadConfig
	}
	// Some other refusal (IncorrectState, a dependency): not known to be permanent.
	return cloud.Transient
}

func isAuthCode(code string) bool { return code != "" && kinds[code] == cloud.Auth }

// failure turns an SDK error into a typed one that says what berth should do, naming the
// platform, and the Secret when the key was refused (never the key itself).
func (p *Provider) failure(op string, err error) error {
	var ce *cloud.Error
	if errors.As(err, &ce) {
		// Credentials that could not be read, or one of this package's own errors.
		return &cloud.Error{Kind: ce.Kind, Op: op, Err: fmt.Errorf("platform %s: %w", p.platform, ce.Err)}
	}
	var ae smithy.APIError
	if !errors.As(err, &ae) {
		// A network error, a timeout or the caller giving up, after the SDK's retries.
		return &cloud.Error{Kind: cloud.Transient, Op: op, Err: fmt.Errorf("platform %s: %w", p.platform, err)}
	}
	status := 0
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	kind := kindOfCode(ae.ErrorCode(), status)
	// The hint goes before EC2's message, which can run past what an Event holds (an
	// UnauthorizedOperation's encoded authorization message is a kilobyte or more).
	msg := fmt.Sprintf("platform %s: EC2 answered %s", p.platform, ae.ErrorCode())
	switch kind {
	case cloud.Auth:
		msg += fmt.Sprintf(" (the AWS key is in Secret %s, keys %s and %s)", p.settings.secret, accessKeyIDKey, secretAccessKeyKey)
	case cloud.BadConfig, cloud.Quota, cloud.Capacity:
		if h := hint(ae.ErrorCode()); h != "" {
			msg += " (check " + h + ")"
		}
	}
	msg += ": " + ae.ErrorMessage()
	return &cloud.Error{Kind: kind, Op: op, Err: errors.New(msg)}
}

func hint(code string) string {
	if h, ok := hints[code]; ok {
		return h
	}
	for prefix, h := range hints {
		if strings.HasSuffix(prefix, ".") && strings.HasPrefix(code, prefix) {
			return h
		}
	}
	return ""
}

// noRetryOfCapacity tells the SDK's retryer not to retry a launch EC2 has no room for (EC2
// answers InsufficientInstanceCapacity with a 500, which it would retry otherwise).
func noRetryOfCapacity(err error) aws.Ternary {
	if kindOfCode(code(err), 0) == cloud.Capacity {
		return aws.FalseTernary
	}
	return aws.UnknownTernary
}
