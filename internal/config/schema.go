package config

import (
	"maps"
	"math"
	"regexp"
	"time"
)

// The keys the config understands, by section. A key's kind decides how its value is parsed;
// anything not listed here is an unknown key (a warning, with a suggestion: berth ignores it, as
// the multi-platform controller does).

type kind int

const (
	kindString kind = iota
	kindInt
	kindBool
	kindNumber // a decimal, like IBM Power's cores=0.25
)

type field struct {
	kind     kind
	required bool
	help     string // what to set, for the message when it is missing
	// shape, when set, is the form the cloud gives such values. One of another form is a
	// warning, not an error: the cloud is the judge, and berth passes the value on as it is
	// (see ec2ID). shapeHelp says what the value should be, refusal what the cloud answers.
	shape              *regexp.Regexp
	shapeHelp, refusal string
}

// ec2ID matches EC2 resource ids with prefix: the prefix, a dash and 8 or 17 hex digits
// (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html). A malformed id is
// only a warning: EC2 refuses it at launch itself (InvalidGroupId.Malformed and the like), it
// has changed the length once (8 to 17 digits, 2016-2018), and a real overlay (lw-p01) ships
// the placeholders SG_ID and SUBNET_ID in platforms that must still load.
func ec2ID(prefix string) *regexp.Regexp {
	return regexp.MustCompile(`^` + prefix + `-([0-9a-f]{8}|[0-9a-f]{17})$`)
}

var (
	awsGroupID = field{kind: kindString, shape: ec2ID("sg"),
		shapeHelp: "a security group id like sg-0123456789abcdef0 (a group's name goes in security-group)",
		refusal:   "EC2 refuses every launch with InvalidGroupId.Malformed"}
	awsSubnetID = field{kind: kindString, shape: ec2ID("subnet"),
		shapeHelp: "a subnet id like subnet-0123456789abcdef0",
		refusal:   "EC2 refuses every launch with InvalidSubnetID.Malformed"}
)

// globalKeys are the top-level keys.
var globalKeys = map[string]field{
	"local-platforms":          {kind: kindString},
	"dynamic-platforms":        {kind: kindString},
	"dynamic-pool-platforms":   {kind: kindString},
	"instance-tag":             {kind: kindString},
	"additional-instance-tags": {kind: kindString},
	"allowed-namespaces":       {kind: kindString},
	// berth's own: how many tasks one namespace may run at once on each platform.
	"max-tasks-per-namespace": {kind: kindInt},
	// berth's own: the algorithm of the build users' keys (keytype.go).
	"user-key-type": {kind: kindString},
	// berth's own: the UIDs and subordinate IDs of build users on Linux hosts (uidrange.go).
	"build-uid-range": {kind: kindString},
}

// hostKeys are the fields of host.<name>.<field>.
var hostKeys = map[string]field{
	"address":     {kind: kindString, required: true, help: "the host's IP address or DNS name"},
	"user":        {kind: kindString, required: true, help: "the admin user berth logs in as to create build users"},
	"platform":    {kind: kindString, required: true, help: "the platform the host builds for, like linux/s390x"},
	"secret":      {kind: kindString, required: true, help: "the secret holding the admin user's SSH key under id_rsa"},
	"concurrency": {kind: kindInt},
	"host-key":    {kind: kindString},
}

// dynamicKeys are the fields of dynamic.<platform>.<field> for every provider.
var dynamicKeys = map[string]field{
	"type":               {kind: kindString, required: true, help: "the cloud provider: aws, ibmz, ibmp or local-vm"},
	"max-instances":      {kind: kindInt, required: true, help: "how many VMs berth may run at once for this platform"},
	"ssh-secret":         {kind: kindString, required: true, help: "the secret holding the SSH key the VMs accept, under id_rsa"},
	"instance-tag":       {kind: kindString},
	"sudo-commands":      {kind: kindString},
	"allocation-timeout": {kind: kindInt},
	"check-interval":     {kind: kindInt},
	"host-key":           {kind: kindString},
	// berth's own: how many ready VMs (pool: free slots) to keep so a task starts without a boot.
	"min-idle": {kind: kindInt},
}

func init() {
	// Build limits are set per static host and per dynamic platform alike (buildlimits.go).
	maps.Copy(hostKeys, limitKeys)
	maps.Copy(dynamicKeys, limitKeys)
}

// dynamicOnlyKeys are fields berth reads on dynamic (not pooled) platforms only: max-age bounds
// the life of the warm VMs that min-idle keeps.
var dynamicOnlyKeys = map[string]field{
	"max-age": {kind: kindInt},
}

// poolKeys are the extra fields of platforms in dynamic-pool-platforms.
var poolKeys = map[string]field{
	"concurrency": {kind: kindInt, required: true, help: "how many builds share one VM"},
	"max-age":     {kind: kindInt, required: true, help: "minutes after which a pooled VM takes no new builds"},
}

// providerKeys are each provider type's own fields of dynamic.<platform>.<field>.
var providerKeys = map[string]map[string]field{
	"aws": {
		"region":                {kind: kindString, required: true},
		"ami":                   {kind: kindString, required: true},
		"instance-type":         {kind: kindString, required: true},
		"key-name":              {kind: kindString, required: true},
		"aws-secret":            {kind: kindString, required: true},
		"security-group":        {kind: kindString},
		"security-group-id":     awsGroupID,
		"subnet-id":             awsSubnetID,
		"instance-profile-name": {kind: kindString},
		"instance-profile-arn":  {kind: kindString},
		"strict-public-address": {kind: kindBool},
		"disk":                  {kind: kindInt},
		"iops":                  {kind: kindInt},
		"throughput":            {kind: kindInt},
		"user-data":             {kind: kindString},
		// Dedicated hosts (macOS): placement tenancy, the host resource group and the license
		// configuration the instances run under.
		"tenancy":                   {kind: kindString},
		"host-resource-group-arn":   {kind: kindString},
		"license-configuration-arn": {kind: kindString},
		// berth's own: other instance types to launch, in order, when the ones before have no
		// capacity (EC2's InsufficientInstanceCapacity and kin).
		"fallback-instance-types": {kind: kindString, help: "instance types to launch, in order, when instance-type has no capacity, like m6g.xlarge,m7g.large"},
		// berth's own: the EC2 API URL to call instead of the region's public one, for a VPC
		// interface endpoint (or a stand-in of the API in tests).
		"endpoint": {kind: kindString, help: "the EC2 API URL to use instead of the region's, like https://vpce-0abc-xyz.ec2.us-east-1.vpce.amazonaws.com"},
	},
	"ibmz": {
		"region":     {kind: kindString, required: true},
		"key":        {kind: kindString, required: true},
		"subnet":     {kind: kindString, required: true},
		"vpc":        {kind: kindString, required: true},
		"image-id":   {kind: kindString, required: true},
		"secret":     {kind: kindString, required: true},
		"profile":    {kind: kindString, required: true},
		"url":        {kind: kindString},
		"private-ip": {kind: kindBool},
		"disk":       {kind: kindInt},
		// berth's own: the IAM endpoint that turns the API key into tokens, for private
		// endpoints and test clouds.
		"iam-url": {kind: kindString, help: "the IBM Cloud IAM endpoint, like https://iam.cloud.ibm.com (the default)"},
	},
	"ibmp": {
		"key":       {kind: kindString, required: true},
		"image":     {kind: kindString, required: true},
		"secret":    {kind: kindString, required: true},
		"url":       {kind: kindString, required: true},
		"crn":       {kind: kindString, required: true},
		"network":   {kind: kindString, required: true},
		"system":    {kind: kindString},
		"cores":     {kind: kindNumber},
		"memory":    {kind: kindInt},
		"disk":      {kind: kindInt},
		"user-data": {kind: kindString},
		// berth's own: IAM for a private or test endpoint.
		"iam-url": {kind: kindString, help: "IBM Cloud IAM's URL, where berth trades the API key for a token at /identity/token; https://iam.cloud.ibm.com when unset"},
	},
	// berth's own cloud for development and tests (the dev stack and bench run it): VMs that
	// are real SSH hosts of the test ground, reached over HTTP.
	"local-vm": {
		"endpoint": {kind: kindString, required: true, help: "the local VM cloud's URL, like http://127.0.0.1:8790"},
		"secret":   {kind: kindString, required: true, help: "the secret holding the cloud's API key under api-key"},
	},
}

// providerSecretKeys names, per provider, the field holding the cloud credentials secret and
// the keys that secret must have.
var providerSecretKeys = map[string]struct {
	field string
	keys  []string
}{
	"aws":      {field: "aws-secret", keys: []string{"access-key-id", "secret-access-key"}},
	"ibmz":     {field: "secret", keys: []string{"api-key"}},
	"ibmp":     {field: "secret", keys: []string{"api-key"}},
	"local-vm": {field: "secret", keys: []string{"api-key"}},
}

// Defaults, in seconds.
const (
	DefaultAllocationTimeout = 600
	DefaultCheckInterval     = 60
)

// Bounds. Counts (concurrency, max-instances, min-idle, max-tasks-per-namespace) have a lower
// bound only: no system berth talks to documents an upper one (the clouds' instance quotas are
// per account and change), and production configs exceed any guess. Durations are bounded by
// what Go's time.Duration holds (about 292 years), past which they would wrap around.
const (
	noUpperBound      = math.MaxInt
	maxDurationMinute = int(math.MaxInt64 / int64(time.Minute))
	maxDurationSecond = int(math.MaxInt64 / int64(time.Second))
)
