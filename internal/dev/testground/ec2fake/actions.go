//go:build linux

package ec2fake

import (
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// The answers, as the SDK's ec2query deserialisers read them.

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type placementXML struct {
	AvailabilityZone     string `xml:"availabilityZone"`
	Tenancy              string `xml:"tenancy"`
	HostResourceGroupArn string `xml:"hostResourceGroupArn,omitempty"`
}

type instanceXML struct {
	InstanceID       string       `xml:"instanceId"`
	ImageID          string       `xml:"imageId"`
	State            stateXML     `xml:"instanceState"`
	PrivateDNSName   string       `xml:"privateDnsName"`
	DNSName          string       `xml:"dnsName"`
	KeyName          string       `xml:"keyName,omitempty"`
	AmiLaunchIndex   int          `xml:"amiLaunchIndex"`
	InstanceType     string       `xml:"instanceType"`
	LaunchTime       string       `xml:"launchTime"`
	Placement        placementXML `xml:"placement"`
	SubnetID         string       `xml:"subnetId,omitempty"`
	PrivateIPAddress string       `xml:"privateIpAddress,omitempty"`
	IPAddress        string       `xml:"ipAddress,omitempty"`
	ClientToken      string       `xml:"clientToken,omitempty"`
	Tags             []tagXML     `xml:"tagSet>item"`
}

type reservationXML struct {
	ReservationID string        `xml:"reservationId"`
	OwnerID       string        `xml:"ownerId"`
	Instances     []instanceXML `xml:"instancesSet>item"`
}

type runInstancesResponse struct {
	XMLName   xml.Name `xml:"RunInstancesResponse"`
	Xmlns     string   `xml:"xmlns,attr"`
	RequestID string   `xml:"requestId"`
	reservationXML
}

type describeInstancesResponse struct {
	XMLName      xml.Name         `xml:"DescribeInstancesResponse"`
	Xmlns        string           `xml:"xmlns,attr"`
	RequestID    string           `xml:"requestId"`
	Reservations []reservationXML `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type stateChangeXML struct {
	InstanceID    string   `xml:"instanceId"`
	CurrentState  stateXML `xml:"currentState"`
	PreviousState stateXML `xml:"previousState"`
}

type terminateInstancesResponse struct {
	XMLName   xml.Name         `xml:"TerminateInstancesResponse"`
	Xmlns     string           `xml:"xmlns,attr"`
	RequestID string           `xml:"requestId"`
	Changes   []stateChangeXML `xml:"instancesSet>item"`
}

func setRequestID(answer any, id string) {
	switch a := answer.(type) {
	case *runInstancesResponse:
		a.RequestID = id
	case *describeInstancesResponse:
		a.RequestID = id
	case *terminateInstancesResponse:
		a.RequestID = id
	}
}

// stateCodes are EC2's instance state codes (InstanceState in the EC2 API reference).
var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func state(name string) stateXML { return stateXML{Code: stateCodes[name], Name: name} }

// toXML is an instance as DescribeInstances shows it. The caller holds mu.
func (s *Server) toXML(inst *instance) instanceXML {
	v := s.view(inst)
	x := instanceXML{
		InstanceID:       inst.id,
		ImageID:          inst.imageID,
		State:            state(v.State),
		KeyName:          inst.keyName,
		InstanceType:     inst.instanceType,
		LaunchTime:       inst.launchedAt.UTC().Format("2006-01-02T15:04:05.000Z"),
		Placement:        placementXML{AvailabilityZone: s.opts.Region + "a", Tenancy: inst.tenancy, HostResourceGroupArn: inst.hostResourceGroupARN},
		SubnetID:         inst.subnetID,
		PrivateIPAddress: v.PrivateIP,
		IPAddress:        v.PublicIP,
		ClientToken:      inst.token,
	}
	if v.PrivateIP != "" {
		x.PrivateDNSName = "ip-" + strings.ReplaceAll(v.PrivateIP, ".", "-") + ".ec2.internal"
	}
	for _, k := range sortedKeys(inst.tags) {
		x.Tags = append(x.Tags, tagXML{Key: k, Value: inst.tags[k]})
	}
	return x
}

var (
	amiID        = regexp.MustCompile(`^ami-[0-9a-f]{8}([0-9a-f]{9})?$`)
	instanceID   = regexp.MustCompile(`^i-[0-9a-f]{8}([0-9a-f]{9})?$`)
	subnetID     = regexp.MustCompile(`^subnet-[0-9a-f]{8}([0-9a-f]{9})?$`)
	groupID      = regexp.MustCompile(`^sg-[0-9a-f]{8}([0-9a-f]{9})?$`)
	volumeTypes  = []string{"standard", "io1", "io2", "gp2", "gp3", "sc1", "st1"}
	tenancies    = []string{"default", "dedicated", "host"}
	taggableKind = []string{"instance", "volume", "network-interface", "spot-instances-request", "elastic-gpu"}
)

// runInstances launches one instance, or answers the one its client token launched.
// capacityError is EC2's answer when a zone has no instance of the type to give now.
func capacityError(instanceType, region string) *apiError {
	return errorf(http.StatusInternalServerError, "InsufficientInstanceCapacity", "We currently do not have sufficient %s capacity in the Availability Zone you requested (%sa). Our system will be working on provisioning additional capacity.", instanceType, region)
}

func (s *Server) runInstances(p url.Values) (any, *apiError) {
	for _, required := range []string{"ImageId", "MinCount", "MaxCount"} {
		if p.Get(required) == "" {
			return nil, badRequest("MissingParameter", "The request must contain the parameter %s", required)
		}
	}
	minCount, err1 := strconv.Atoi(p.Get("MinCount"))
	maxCount, err2 := strconv.Atoi(p.Get("MaxCount"))
	switch {
	case err1 != nil || err2 != nil || minCount < 1 || maxCount < 1:
		return nil, badRequest("InvalidParameterValue", "MinCount and MaxCount must be positive integers")
	case minCount > maxCount:
		return nil, badRequest("InvalidParameterValue", "MinCount (%d) must not be greater than MaxCount (%d)", minCount, maxCount)
	case maxCount != 1:
		return nil, badRequest("InvalidParameterValue", "this stand-in launches one instance per call (MaxCount 1)")
	}
	token := p.Get("ClientToken")
	if len(token) > 64 || strings.IndexFunc(token, func(r rune) bool { return r < 0x20 || r > 0x7e }) >= 0 {
		return nil, badRequest("InvalidParameterValue", "Value (%.70s...) for parameter clientToken is invalid: at most 64 ASCII characters", token)
	}
	request := canonical(p)

	s.mu.Lock()
	defer s.mu.Unlock()
	if inst := s.byToken[token]; token != "" && inst != nil {
		if inst.request != request {
			return nil, badRequest("IdempotentParameterMismatch", "Client token %s was already used with a different request", token)
		}
		return s.reservation(inst), nil
	}
	inst, e := s.validateLaunch(p)
	if e != nil {
		return nil, e
	}
	if s.noCapacity[inst.instanceType] {
		return nil, capacityError(inst.instanceType, s.opts.Region)
	}
	inst.token, inst.request = token, request
	machineToken := token
	if machineToken == "" {
		machineToken = "ec2fake-" + randomHex(16)
	}
	m, _, err := s.machines.Launch(machineToken, inst.tags["Name"], inst.tags)
	switch {
	case errors.Is(err, vmcloud.ErrCapacity):
		return nil, capacityError(inst.instanceType, s.opts.Region)
	case errors.Is(err, vmcloud.ErrQuota):
		return nil, badRequest("InstanceLimitExceeded", "You have requested more instances than your current instance limit allows for the specified instance type. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.")
	case err != nil:
		return nil, errorf(http.StatusInternalServerError, "InternalError", "An internal error has occurred: %v", err)
	}
	inst.id = "i-0" + randomHex(16)
	inst.reservationID = "r-0" + randomHex(16)
	inst.machineID = m.ID
	inst.launchedAt = m.LaunchedAt
	if inst.public {
		s.privateIPs++
		inst.privateIP = fmt.Sprintf("198.19.%d.%d", 128+s.privateIPs/250%128, 2+s.privateIPs%250)
	}
	s.instances[inst.id] = inst
	s.order = append(s.order, inst)
	if token != "" {
		s.byToken[token] = inst
	}
	return s.reservation(inst), nil
}

func (s *Server) reservation(inst *instance) *runInstancesResponse {
	return &runInstancesResponse{Xmlns: Namespace, reservationXML: reservationXML{
		ReservationID: inst.reservationID,
		OwnerID:       ownerID,
		Instances:     []instanceXML{s.toXML(inst)},
	}}
}

// validateLaunch checks what EC2 checks of a RunInstances and returns the instance it asks
// for. The caller holds mu.
func (s *Server) validateLaunch(p url.Values) (*instance, *apiError) {
	inst := &instance{
		imageID:      p.Get("ImageId"),
		instanceType: p.Get("InstanceType"),
		keyName:      p.Get("KeyName"),
		subnetID:     p.Get("SubnetId"),
		tenancy:      p.Get("Placement.Tenancy"),
		tags:         map[string]string{},
	}
	if inst.instanceType == "" {
		inst.instanceType = "m1.small" // EC2's default
	}
	if inst.tenancy == "" {
		inst.tenancy = "default"
	}
	inst.hostResourceGroupARN = p.Get("Placement.HostResourceGroupArn")
	if !amiID.MatchString(inst.imageID) {
		return nil, badRequest("InvalidAMIID.Malformed", "Invalid id: %q (expecting \"ami-...\")", inst.imageID)
	}
	if len(s.opts.Images) > 0 && !slices.Contains(s.opts.Images, inst.imageID) {
		return nil, badRequest("InvalidAMIID.NotFound", "The image id '[%s]' does not exist", inst.imageID)
	}
	if inst.keyName != "" && !slices.Contains(s.opts.KeyPairs, inst.keyName) {
		return nil, badRequest("InvalidKeyPair.NotFound", "The key pair '%s' does not exist", inst.keyName)
	}
	if inst.subnetID != "" {
		if !subnetID.MatchString(inst.subnetID) {
			return nil, badRequest("InvalidSubnetID.Malformed", "The subnet ID '%s' is malformed", inst.subnetID)
		}
		if len(s.opts.Subnets) > 0 {
			i := slices.IndexFunc(s.opts.Subnets, func(sn Subnet) bool { return sn.ID == inst.subnetID })
			if i < 0 {
				return nil, badRequest("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", inst.subnetID)
			}
			inst.public = s.opts.Subnets[i].MapPublicIPOnLaunch
		}
	}
	if v := p.Get("NetworkInterface.1.AssociatePublicIpAddress"); v != "" {
		inst.public = v == "true"
	}
	for _, id := range indexed(p, "SecurityGroupId") {
		if !groupID.MatchString(id) {
			return nil, badRequest("InvalidGroupId.Malformed", "Invalid id: %q (expecting \"sg-...\")", id)
		}
	}
	if !slices.Contains(tenancies, inst.tenancy) {
		return nil, badRequest("InvalidParameterValue", "Value (%s) for parameter tenancy is invalid", inst.tenancy)
	}
	if inst.hostResourceGroupARN != "" && inst.tenancy != "host" {
		return nil, badRequest("InvalidParameterCombination", "A host resource group can only be used with tenancy host")
	}
	if ud := p.Get("UserData"); ud != "" {
		raw, err := base64.StdEncoding.DecodeString(ud)
		if err != nil {
			return nil, badRequest("InvalidParameterValue", "Invalid BASE64 encoding of user data.")
		}
		if len(raw) > 16384 {
			return nil, badRequest("InvalidParameterValue", "User data is limited to 16384 bytes")
		}
	}
	if e := checkBlockDevices(p); e != nil {
		return nil, e
	}
	for i := 1; i <= count(p, "TagSpecification"); i++ {
		prefix := fmt.Sprintf("TagSpecification.%d", i)
		kind := p.Get(prefix + ".ResourceType")
		if !slices.Contains(taggableKind, kind) {
			return nil, badRequest("InvalidParameterValue", "'%s' is not a valid taggable resource type for this operation.", kind)
		}
		for j := 1; j <= count(p, prefix+".Tag"); j++ {
			k, v := p.Get(fmt.Sprintf("%s.Tag.%d.Key", prefix, j)), p.Get(fmt.Sprintf("%s.Tag.%d.Value", prefix, j))
			switch {
			case k == "" || len(k) > 128 || len(v) > 256:
				return nil, badRequest("InvalidParameterValue", "Tag keys are 1 to 128 characters and values at most 256")
			case strings.HasPrefix(strings.ToLower(k), "aws:"):
				return nil, badRequest("InvalidParameterValue", "Tag keys starting with 'aws:' are reserved for internal use")
			}
			if kind == "instance" {
				inst.tags[k] = v
			}
		}
	}
	if len(inst.tags) > 50 {
		return nil, badRequest("TagLimitExceeded", "The maximum number of tags per resource is 50")
	}
	return inst, nil
}

func checkBlockDevices(p url.Values) *apiError {
	for i := 1; i <= count(p, "BlockDeviceMapping"); i++ {
		prefix := fmt.Sprintf("BlockDeviceMapping.%d", i)
		if p.Get(prefix+".DeviceName") == "" {
			return badRequest("MissingParameter", "The request must contain the parameter BlockDeviceMapping.%d.DeviceName", i)
		}
		ebs := prefix + ".Ebs."
		volumeType := p.Get(ebs + "VolumeType")
		if volumeType != "" && !slices.Contains(volumeTypes, volumeType) {
			return badRequest("InvalidParameterValue", "Value (%s) for parameter volumeType is invalid", volumeType)
		}
		if size := p.Get(ebs + "VolumeSize"); size != "" {
			if n, err := strconv.Atoi(size); err != nil || n < 1 || n > 65536 {
				return badRequest("InvalidParameterValue", "Value (%s) for parameter volumeSize is invalid", size)
			}
		}
		if p.Get(ebs+"Iops") != "" && !slices.Contains([]string{"io1", "io2", "gp3"}, volumeType) {
			return badRequest("InvalidParameterCombination", "The parameter iops is not supported for %s volumes", volumeType)
		}
		if p.Get(ebs+"Throughput") != "" && volumeType != "gp3" {
			return badRequest("InvalidParameterCombination", "The parameter throughput is only supported for gp3 volumes")
		}
	}
	return nil
}

// canonical is a request's parameters less its action, version and client token, in a fixed
// order: two requests are the same when these are.
func canonical(p url.Values) string {
	var b strings.Builder
	for _, k := range sortedKeys(p) {
		if k == "Action" || k == "Version" || k == "ClientToken" {
			continue
		}
		for _, v := range p[k] {
			fmt.Fprintf(&b, "%s=%s\n", k, v)
		}
	}
	return b.String()
}

func (s *Server) describeInstances(p url.Values) (any, *apiError) {
	ids := indexed(p, "InstanceId")
	maxResults := 0
	if raw := p.Get("MaxResults"); raw != "" {
		if len(ids) > 0 {
			return nil, badRequest("InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < 5 || n > 1000 {
			return nil, badRequest("InvalidParameterValue", "Value ( %s ) for parameter maxResults is invalid. Expecting a value between 5 and 1000.", raw)
		}
		maxResults = n
	}
	type filter struct {
		name   string
		values []string
	}
	var filters []filter
	for i := 1; i <= count(p, "Filter"); i++ {
		f := filter{name: p.Get(fmt.Sprintf("Filter.%d.Name", i)), values: indexed(p, fmt.Sprintf("Filter.%d.Value", i))}
		switch {
		case f.name == "":
			return nil, badRequest("MissingParameter", "The request must contain the parameter Filter.%d.Name", i)
		case strings.HasPrefix(f.name, "tag:") || slices.Contains([]string{"tag-key", "instance-state-name", "client-token", "instance-id"}, f.name):
		default:
			return nil, badRequest("InvalidParameterValue", "The filter '%s' is invalid", f.name)
		}
		filters = append(filters, f)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var candidates []*instance
	if len(ids) > 0 {
		for _, id := range ids {
			if !instanceID.MatchString(id) {
				return nil, badRequest("InvalidInstanceID.Malformed", "Invalid id: %q", id)
			}
			inst := s.instances[id]
			if inst == nil || !s.describable(inst) {
				return nil, badRequest("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
			}
			candidates = append(candidates, inst)
		}
	} else {
		for _, inst := range s.order {
			if s.describable(inst) {
				candidates = append(candidates, inst)
			}
		}
	}
	var matched []instanceXML
	for _, inst := range candidates {
		x := s.toXML(inst)
		if slices.IndexFunc(filters, func(f filter) bool { return !matches(x, f.name, f.values) }) < 0 {
			matched = append(matched, x)
		}
	}
	start := 0
	if next := p.Get("NextToken"); next != "" {
		n, err := strconv.Atoi(next)
		if err != nil || n < 0 || n > len(matched) {
			return nil, badRequest("InvalidParameterValue", "The token '%s' is invalid", next)
		}
		start = n
	}
	end := len(matched)
	if maxResults > 0 {
		end = min(end, start+maxResults)
	}
	answer := &describeInstancesResponse{Xmlns: Namespace}
	for _, x := range matched[start:end] {
		answer.Reservations = append(answer.Reservations, reservationXML{
			ReservationID: s.instances[x.InstanceID].reservationID,
			OwnerID:       ownerID,
			Instances:     []instanceXML{x},
		})
	}
	if end < len(matched) {
		answer.NextToken = strconv.Itoa(end)
	}
	return answer, nil
}

// matches applies one filter; a filter's values are alternatives.
func matches(x instanceXML, name string, values []string) bool {
	var have []string
	switch {
	case strings.HasPrefix(name, "tag:"):
		key := strings.TrimPrefix(name, "tag:")
		for _, t := range x.Tags {
			if t.Key == key {
				have = append(have, t.Value)
			}
		}
	case name == "tag-key":
		for _, t := range x.Tags {
			have = append(have, t.Key)
		}
	case name == "instance-state-name":
		have = []string{x.State.Name}
	case name == "client-token":
		have = []string{x.ClientToken}
	case name == "instance-id":
		have = []string{x.InstanceID}
	}
	return slices.ContainsFunc(have, func(h string) bool { return slices.Contains(values, h) })
}

func (s *Server) terminateInstances(p url.Values) (any, *apiError) {
	ids := indexed(p, "InstanceId")
	if len(ids) == 0 {
		return nil, badRequest("MissingParameter", "The request must contain the parameter InstanceId")
	}
	s.mu.Lock()
	var insts []*instance
	for _, id := range ids {
		if !instanceID.MatchString(id) {
			s.mu.Unlock()
			return nil, badRequest("InvalidInstanceID.Malformed", "Invalid id: %q", id)
		}
		inst := s.instances[id]
		if inst == nil || !s.describable(inst) {
			s.mu.Unlock()
			return nil, badRequest("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
		insts = append(insts, inst)
	}
	s.mu.Unlock()

	answer := &terminateInstancesResponse{Xmlns: Namespace}
	for _, inst := range insts {
		s.mu.Lock()
		previous := s.view(inst).State
		s.mu.Unlock()
		current := "terminated"
		if previous != "terminated" {
			current = "shutting-down"
			if _, err := s.machines.Terminate(inst.machineID); err != nil && !errors.Is(err, vmcloud.ErrNotFound) {
				return nil, errorf(http.StatusInternalServerError, "InternalError", "An internal error has occurred: %v", err)
			}
		}
		answer.Changes = append(answer.Changes, stateChangeXML{InstanceID: inst.id, CurrentState: state(current), PreviousState: state(previous)})
	}
	return answer, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
