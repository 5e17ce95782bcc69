package awsec2

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/berth-ci/berth/internal/cloud"
)

const (
	// rootDevice is the root device of the RHEL, Fedora and Ubuntu AMIs the configs use;
	// a mapping under another name would add a second volume instead of sizing the root.
	rootDevice = "/dev/sda1"
	// defaultDisk is the root volume's size in GiB when the config sets none, as upstream.
	defaultDisk = 40
	// maxUserData is EC2's limit on user data, before base64.
	maxUserData = 16 << 10
)

// The root volume is gp3 (runInput), so disk, iops and throughput are held to gp3's limits.
// The ranges are the EC2 API Reference's, for EbsBlockDevice (VolumeSize, Iops, Throughput)
// and CreateVolume (Size, Iops, Throughput):
// https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html
// https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateVolume.html
// AWS raised them in September 2025 (from 16 TiB, 16,000 IOPS and 1,000 MiB/s); older pages
// and SDK docs still give the old figures. The ratios are the Amazon EBS User Guide's
// (the API reference does not give them), and EC2 refuses a request past them with
// InvalidParameterValue ("Iops to volume size ratio ... maximum is 500", "Throughput (MiBps)
// to iops ratio ... maximum is 0.250000 MiBps per iops"):
// https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html#gp3-performance
const (
	gp3MinDisk, gp3MaxDisk             = 1, 65536 // GiB
	gp3MinIOPS, gp3MaxIOPS             = 3000, 80000
	gp3MinThroughput, gp3MaxThroughput = 125, 2000 // MiB/s
	// gp3BaselineIOPS is what every gp3 volume gets, whatever its size, and EC2's default
	// when the request sets no Iops.
	gp3BaselineIOPS = 3000
	// gp3IOPSPerGiB: IOPS above the baseline are provisioned at up to 500 per GiB of size.
	gp3IOPSPerGiB = 500
	// gp3IOPSPerMiBps: throughput is provisioned at up to 0.25 MiB/s per provisioned IOPS,
	// that is, each MiB/s needs 4 IOPS.
	gp3IOPSPerMiBps = 4
)

// launchSettings are a platform's provider keys, checked, as RunInstances takes them.
type launchSettings struct {
	region, ami, instanceType, keyName, secret string
	securityGroup, securityGroupID, subnetID   string
	profileName, profileARN                    string
	strictPublicAddress                        bool
	disk                                       int32
	iops, throughput                           *int32
	userData                                   string // base64, as on the wire
	tenancy, hostResourceGroupARN, licenseARN  string
	endpoint                                   string
	// fallbackTypes are berth's fallback-instance-types, in order.
	fallbackTypes []string
}

// types are the instance types a launch may ask for: the configured one, then the fallbacks.
func (s launchSettings) types() []string {
	return append([]string{s.instanceType}, s.fallbackTypes...)
}

var (
	regionShape       = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)
	amiShape          = regexp.MustCompile(`^(ami-[0-9a-f]{8,17}|resolve:ssm:\S+)$`)
	instanceTypeShape = regexp.MustCompile(`^[a-z0-9-]+\.[a-z0-9-]+$`)
	secretNameShape   = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
	profileARNShape   = regexp.MustCompile(`^arn:aws[a-z-]*:iam::[0-9]{12}:instance-profile/.+$`)
	groupARNShape     = regexp.MustCompile(`^arn:aws[a-z-]*:resource-groups:[a-z0-9-]+:[0-9]{12}:group/.+$`)
	licenseARNShape   = regexp.MustCompile(`^arn:aws[a-z-]*:license-manager:[a-z0-9-]+:[0-9]{12}:license-configuration:.+$`)
)

// parseSettings checks every key it knows; an error of kind BadConfig names the key.
// security-group-id and subnet-id are passed on unchecked: a malformed one is the config's
// warning (config.Parse), and EC2 refuses it at launch with InvalidGroupId.Malformed or
// InvalidSubnetID.Malformed, which fails the launch as BadConfig naming the key (see hints).
// Refusing it here would make the whole platform unbuildable for a value only EC2 can judge,
// and real overlays ship placeholders (SG_ID) in platforms that must still load.
func parseSettings(platform string, values map[string]string) (launchSettings, error) {
	get := func(key string) string { return strings.TrimSpace(values[key]) }
	bad := func(key, format string, args ...any) error { return cloud.BadKey(platform, key, format, args...) }
	s := launchSettings{
		region:               get("region"),
		ami:                  get("ami"),
		instanceType:         get("instance-type"),
		keyName:              get("key-name"),
		secret:               get("aws-secret"),
		securityGroup:        get("security-group"),
		securityGroupID:      get("security-group-id"),
		subnetID:             get("subnet-id"),
		profileName:          get("instance-profile-name"),
		profileARN:           get("instance-profile-arn"),
		tenancy:              get("tenancy"),
		hostResourceGroupARN: get("host-resource-group-arn"),
		licenseARN:           get("license-configuration-arn"),
		endpoint:             get("endpoint"),
		disk:                 defaultDisk,
	}
	for _, c := range []struct {
		key, value, what string
		shape            *regexp.Regexp
	}{
		{"region", s.region, "an AWS region like us-east-1", regionShape},
		{"ami", s.ami, "an AMI id like ami-0123456789abcdef0", amiShape},
		{"instance-type", s.instanceType, "an instance type like m6g.large", instanceTypeShape},
		{"key-name", s.keyName, "the name of the EC2 key pair the VMs accept", nil},
		{"aws-secret", s.secret, "the name of the Secret holding access-key-id and secret-access-key", secretNameShape},
	} {
		if c.value == "" {
			return s, bad(c.key, "is required: %s", c.what)
		}
		if c.shape != nil && !c.shape.MatchString(c.value) {
			return s, bad(c.key, "%q is not %s", c.value, c.what)
		}
	}
	for _, c := range []struct {
		key, value, what string
		shape            *regexp.Regexp
	}{
		{"instance-profile-arn", s.profileARN, "an instance profile ARN like arn:aws:iam::123456789012:instance-profile/name", profileARNShape},
		{"host-resource-group-arn", s.hostResourceGroupARN, "a resource group ARN like arn:aws:resource-groups:us-east-1:123456789012:group/name", groupARNShape},
		{"license-configuration-arn", s.licenseARN, "a license configuration ARN like arn:aws:license-manager:us-east-1:123456789012:license-configuration:lic-0123", licenseARNShape},
	} {
		if c.value != "" && !c.shape.MatchString(c.value) {
			return s, bad(c.key, "%q is not %s", c.value, c.what)
		}
	}
	if raw := get("fallback-instance-types"); raw != "" {
		for _, typ := range strings.Split(raw, ",") {
			typ = strings.TrimSpace(typ)
			switch {
			case typ == "":
			case !instanceTypeShape.MatchString(typ):
				return s, bad("fallback-instance-types", "%q is not an instance type like m6g.xlarge", typ)
			case slices.Contains(s.types(), typ):
				return s, bad("fallback-instance-types", "lists %s twice (instance-type counts)", typ)
			default:
				s.fallbackTypes = append(s.fallbackTypes, typ)
			}
		}
	}
	if raw := get("strict-public-address"); raw != "" {
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return s, bad("strict-public-address", "%q is not true or false", raw)
		}
		s.strictPublicAddress = b
	}
	intKey := func(key string, lo, hi int64, unit string) (*int32, error) {
		raw := get(key)
		if raw == "" {
			return nil, nil
		}
		n, err := strconv.ParseInt(raw, 10, 32)
		if err != nil || n < lo || n > hi {
			return nil, bad(key, "%q is not a whole number from %d to %d, the gp3 limits in %s", raw, lo, hi, unit)
		}
		return aws.Int32(int32(n)), nil
	}
	disk, err := intKey("disk", gp3MinDisk, gp3MaxDisk, "GiB")
	if err != nil {
		return s, err
	}
	if disk != nil {
		s.disk = *disk
	}
	if s.iops, err = intKey("iops", gp3MinIOPS, gp3MaxIOPS, "IOPS"); err != nil {
		return s, err
	}
	if s.throughput, err = intKey("throughput", gp3MinThroughput, gp3MaxThroughput, "MiB/s"); err != nil {
		return s, err
	}
	if err := checkVolume(s, disk != nil, bad); err != nil {
		return s, err
	}
	if ud := values["user-data"]; strings.TrimSpace(ud) != "" {
		if len(ud) > maxUserData {
			return s, bad("user-data", "is %d bytes; EC2 takes at most %d", len(ud), maxUserData)
		}
		s.userData = base64.StdEncoding.EncodeToString([]byte(ud))
	}
	switch s.tenancy {
	case "", "default", "dedicated", "host":
	default:
		return s, bad("tenancy", "%q is not default, dedicated or host", s.tenancy)
	}
	if s.hostResourceGroupARN != "" && s.tenancy != "host" {
		return s, bad("host-resource-group-arn", "needs tenancy: host (dedicated hosts)")
	}
	if s.endpoint != "" {
		u, err := url.Parse(s.endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return s, bad("endpoint", "%q is not an http(s) URL like https://ec2.us-east-1.amazonaws.com", s.endpoint)
		}
	}
	return s, nil
}

// checkVolume holds iops to the disk size and throughput to iops, by gp3's ratios.
// diskSet says whether the config set disk (else it is defaultDisk).
func checkVolume(s launchSettings, diskSet bool, bad func(key, format string, args ...any) error) error {
	disk := int64(s.disk)
	diskNote := fmt.Sprintf("disk is %d GiB", disk)
	if !diskSet {
		diskNote = fmt.Sprintf("%d GiB when disk is unset", disk)
	}
	iops, iopsNote := int64(gp3BaselineIOPS), fmt.Sprintf("%d when iops is unset", gp3BaselineIOPS)
	if s.iops != nil {
		iops, iopsNote = int64(*s.iops), fmt.Sprintf("iops is %d", *s.iops)
	}
	// The baseline needs no size: a 1 GiB volume has 3000 IOPS too.
	if s.iops != nil && iops > gp3BaselineIOPS && iops > gp3IOPSPerGiB*disk {
		return bad("iops", "%d needs a disk of at least %d GiB: gp3 allows %d IOPS per GiB of volume size (%s)",
			iops, (iops+gp3IOPSPerGiB-1)/gp3IOPSPerGiB, gp3IOPSPerGiB, diskNote)
	}
	if s.throughput != nil && int64(*s.throughput)*gp3IOPSPerMiBps > iops {
		return bad("throughput", "%d MiB/s needs at least %d iops: gp3 allows 0.25 MiB/s per provisioned IOPS (%s)",
			*s.throughput, int64(*s.throughput)*gp3IOPSPerMiBps, iopsNote)
	}
	return nil
}

// runInput is the RunInstances request of one launch. Tags are sorted so that a repeat of
// the same launch is byte for byte the same request: EC2 refuses a client token reused with
// a different one.
func (s launchSettings) runInput(req cloud.LaunchRequest) *ec2.RunInstancesInput {
	in := &ec2.RunInstancesInput{
		ClientToken:  aws.String(req.Token),
		ImageId:      aws.String(s.ami),
		InstanceType: types.InstanceType(s.types()[req.Fallback]),
		KeyName:      aws.String(s.keyName),
		MinCount:     aws.Int32(1),
		MaxCount:     aws.Int32(1),
		EbsOptimized: aws.Bool(true),
		// A VM that powers itself off is gone for good, and its bill with it.
		InstanceInitiatedShutdownBehavior: types.ShutdownBehaviorTerminate,
		BlockDeviceMappings: []types.BlockDeviceMapping{{
			DeviceName: aws.String(rootDevice),
			Ebs: &types.EbsBlockDevice{
				DeleteOnTermination: aws.Bool(true),
				VolumeSize:          aws.Int32(s.disk),
				VolumeType:          types.VolumeTypeGp3,
				Iops:                s.iops,
				Throughput:          s.throughput,
			},
		}},
	}
	if s.securityGroup != "" {
		in.SecurityGroups = []string{s.securityGroup}
	}
	if s.securityGroupID != "" {
		in.SecurityGroupIds = []string{s.securityGroupID}
	}
	if s.subnetID != "" {
		in.SubnetId = aws.String(s.subnetID)
	}
	if s.profileName != "" || s.profileARN != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{}
		if s.profileName != "" {
			in.IamInstanceProfile.Name = aws.String(s.profileName)
		}
		if s.profileARN != "" {
			in.IamInstanceProfile.Arn = aws.String(s.profileARN)
		}
	}
	if s.userData != "" {
		in.UserData = aws.String(s.userData)
	}
	if s.tenancy != "" || s.hostResourceGroupARN != "" {
		in.Placement = &types.Placement{Tenancy: types.Tenancy(s.tenancy)}
		if s.hostResourceGroupARN != "" {
			in.Placement.HostResourceGroupArn = aws.String(s.hostResourceGroupARN)
		}
	}
	if s.licenseARN != "" {
		in.LicenseSpecifications = []types.LicenseConfigurationRequest{{LicenseConfigurationArn: aws.String(s.licenseARN)}}
	}
	tags := launchTags(req)
	in.TagSpecifications = []types.TagSpecification{
		{ResourceType: types.ResourceTypeInstance, Tags: tags},
		{ResourceType: types.ResourceTypeVolume, Tags: tags},
	}
	return in
}

// launchTags are the request's tags and a Name tag (the console shows it), sorted by key.
func launchTags(req cloud.LaunchRequest) []types.Tag {
	all := map[string]string{}
	for k, v := range req.Tags {
		all[k] = v
	}
	if req.Name != "" {
		all["Name"] = req.Name
	}
	tags := make([]types.Tag, 0, len(all))
	for _, k := range sortedKeys(all) {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(all[k])})
	}
	return tags
}
