// Package ibmz is the provider for platforms of type ibmz: s390x virtual servers in an IBM
// Cloud VPC, through IBM's VPC SDK with an IAM API key from the platform's Secret.
//
// VPC instances carry no tags berth can list by, so the instance's name carries what berth
// needs: "berth-<GroupKey>-<token>" (see instanceName). The name makes Launch idempotent (the
// VPC keeps names unique and lists by name), lets List find a platform's instances by prefix,
// and gives the sweeper the launch token back.
package ibmz

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/ibmiam"
)

func init() { cloud.Register("ibmz", New) }

const (
	// adminUser is who IBM's s390x images let in with the instance's SSH key.
	adminUser = "root"
	// defaultDiskGB is the boot volume the upstream controller always asked for.
	defaultDiskGB = 100
	// Boot volumes of VPC instances are 10 to 250 GB.
	minDiskGB, maxDiskGB = 10, 250
	bootVolumeProfile    = "general-purpose"

	callTimeout = 30 * time.Second
	// maxNameLen is the VPC's limit on resource names.
	maxNameLen = 63
)

// Retries of 429 and 5xx answers, done by the SDK's retrying client (which honours
// Retry-After). A throttle that asks for longer than maxInlineWait is not waited out inline:
// it goes back to berth as Throttled with RetryAfter, for its own backoff. Tests shorten
// the waits.
var (
	retryMax      = 3
	retryWaitMin  = time.Second
	retryWaitMax  = 8 * time.Second
	maxInlineWait = 10 * time.Second
)

// Provider launches s390x instances in one VPC subnet for one platform.
type Provider struct {
	platform   string
	endpoint   string
	iamURL     string
	zone       string // from the region key when it names a zone; else the subnet's
	vpc        string
	subnet     string
	key        string
	image      string
	profile    string
	privateIP  bool
	diskGB     int64
	secretName string
	readSecret cloud.SecretReader

	mu sync.Mutex
	// keyDigest is the digest of the key svc authenticates with; a changed Secret makes a new
	// svc, so a rotated key takes effect at the next call and IAM tokens are reused between calls.
	keyDigest [sha256.Size]byte
	svc       *operations
	// net is the VPC, subnet, key and zone the names in the config resolved to, once found:
	// they stay while the settings do (a new provider comes with new settings). A launch the
	// cloud refuses as misconfigured forgets them, in case they were deleted and made anew.
	net *network
}

var zoneRe = regexp.MustCompile(`^([a-z]+-[a-z]+)-[0-9]+$`)

// New builds a provider from the platform's keys; an error of kind BadConfig names a key that
// is missing or malformed.
func New(s cloud.Settings) (cloud.Provider, error) {
	v := func(k string) string { return strings.TrimSpace(s.Values[k]) }
	bad := func(key, format string, args ...any) error { return cloud.BadKey(s.Platform, key, format, args...) }
	for _, k := range []string{"region", "vpc", "subnet", "key", "image-id", "profile", "secret"} {
		if v(k) == "" {
			return nil, bad(k, "required for an ibmz platform")
		}
	}
	if s.Secret == nil {
		return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s: no way to read Secrets was given", s.Platform)
	}
	p := &Provider{
		platform: s.Platform, vpc: v("vpc"), subnet: v("subnet"), key: v("key"),
		image: v("image-id"), profile: v("profile"), secretName: v("secret"), readSecret: s.Secret,
		diskGB: defaultDiskGB,
	}
	region := v("region")
	if m := zoneRe.FindStringSubmatch(region); m != nil {
		// Real configs name a zone here (us-east-2): the upstream controller creates
		// instances in it, and its region (us-east) picks the endpoint.
		p.zone, region = region, m[1]
	}
	p.endpoint = v("url")
	if p.endpoint == "" {
		u, err := vpcv1.GetServiceURLForRegion(region)
		if err != nil {
			return nil, bad("region", "%q is not a VPC region berth knows an endpoint of; set url (like https://%s.iaas.cloud.ibm.com/v1)", v("region"), region)
		}
		p.endpoint = u
	}
	if err := httpURL(p.endpoint); err != nil {
		return nil, bad("url", "%q %v", p.endpoint, err)
	}
	p.iamURL = v("iam-url")
	if p.iamURL == "" {
		p.iamURL = ibmiam.DefaultURL
	}
	if err := httpURL(p.iamURL); err != nil {
		return nil, bad("iam-url", "%q %v", p.iamURL, err)
	}
	if raw := v("private-ip"); raw != "" {
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return nil, bad("private-ip", "%q is not true or false", raw)
		}
		p.privateIP = b
	}
	if raw := v("disk"); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < minDiskGB || n > maxDiskGB {
			return nil, bad("disk", "%q is not a boot volume size in GiB from %d to %d", raw, minDiskGB, maxDiskGB)
		}
		p.diskGB = n
	}
	return p, nil
}

func httpURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return errors.New("is not an http(s) URL")
	}
	return nil
}

var _ cloud.Provider = (*Provider)(nil)

func (p *Provider) AdminUser() string { return adminUser }

// --- Names ---

// namePrefix is what the names of the instances (and floating IPs) of one installation's
// platform start with.
func namePrefix(tags map[string]string) string { return "berth-" + cloud.GroupKey(tags) + "-" }

// instanceName is the instance's name for a launch token: the prefix and the token itself
// when it is a valid end of a VPC name (berth's tokens, "<uid>-<attempt>", are), else the
// prefix, a second dash (which no plain token starts with) and a hash of the token.
func instanceName(tags map[string]string, token string) string {
	prefix := namePrefix(tags)
	if plainToken(token) && len(prefix)+len(token) <= maxNameLen {
		return prefix + token
	}
	sum := sha256.Sum256([]byte(token))
	return prefix + "-" + hex.EncodeToString(sum[:12])
}

func plainToken(t string) bool {
	if t == "" || !alnum(t[0]) || !alnum(t[len(t)-1]) {
		return false
	}
	for i := range len(t) {
		if !alnum(t[i]) && t[i] != '-' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool { return ('a' <= c && c <= 'z') || ('0' <= c && c <= '9') }

// tokenOf returns the launch token in an instance name of the plain form, "" otherwise.
func tokenOf(name string) string {
	rest, ok := strings.CutPrefix(name, "berth-")
	if !ok || len(rest) < 10 || rest[8] != '-' {
		return ""
	}
	if t := rest[9:]; plainToken(t) {
		return t
	}
	return ""
}

// --- Provider ---

func (p *Provider) Launch(ctx context.Context, req cloud.LaunchRequest) (cloud.Instance, error) {
	const op = "launch"
	if req.Token == "" {
		return cloud.Instance{}, cloud.Errorf(cloud.BadConfig, op, "no launch token: a launch without one could start a VM twice")
	}
	svc, err := p.service(ctx, op)
	if err != nil {
		return cloud.Instance{}, err
	}
	name := instanceName(req.Tags, req.Token)
	net, err := p.network(ctx, svc, op)
	if err != nil {
		return cloud.Instance{}, err
	}
	inst, err := p.findByName(ctx, svc, op, net.vpcID, name)
	if err != nil {
		return cloud.Instance{}, err
	}
	if inst == nil {
		if inst, err = p.create(ctx, svc, net, name); err != nil {
			if k := cloud.KindOf(err); k == cloud.BadConfig || k == cloud.NotFound {
				p.forgetNetwork()
			}
			return cloud.Instance{}, err
		}
	}
	if reason := capacityFailure(inst); reason != "" {
		// A failed instance is no use and still holds its name: clear it so that the retry
		// berth makes after its backoff starts afresh.
		if err := p.remove(ctx, svc, op, inst); err != nil {
			return cloud.Instance{}, err
		}
		return cloud.Instance{}, cloud.Errorf(cloud.Capacity, op, "zone %s has no room for profile %s now (%s)", deref(inst.Zone.Name), p.profile, reason)
	}
	address := ""
	if !p.privateIP && liveState(deref(inst.Status)) {
		if address, err = p.ensureFloatingIP(ctx, svc, inst); err != nil {
			// Half a launch is no use: end the instance rather than leave it unreachable; the
			// next Launch starts afresh. If that fails too, the sweeper finds the instance.
			p.remove(ctx, svc, op, inst)
			return cloud.Instance{}, err
		}
	}
	out := p.toInstance(inst, address)
	out.Tags = req.Tags
	return out, nil
}

func (p *Provider) Get(ctx context.Context, id string) (cloud.Instance, error) {
	const op = "get"
	if id == "" {
		return cloud.Instance{}, cloud.Errorf(cloud.NotFound, op, "no instance id")
	}
	svc, err := p.service(ctx, op)
	if err != nil {
		return cloud.Instance{}, err
	}
	inst, resp, err := svc.GetInstanceWithContext(ctx, &vpcv1.GetInstanceOptions{ID: &id})
	if err != nil {
		return cloud.Instance{}, p.failure(op, resp, err)
	}
	address := ""
	if !p.privateIP && deref(inst.Status) == vpcv1.InstanceStatusRunningConst {
		fips, err := p.floatingIPs(ctx, svc, op, nicID(inst))
		if err != nil {
			return cloud.Instance{}, err
		}
		if len(fips) > 0 {
			address = deref(fips[0].Address)
		}
	}
	return p.toInstance(inst, address), nil
}

// List returns the platform's instances not yet gone: those that may still serve, and
// stopped ones, which the VPC keeps (and bills) until berth deletes them. On the way it
// deletes what nobody else ever will: the platform's instances that failed (berth sees them
// gone and launches anew, so no record ends them) and its floating IPs left unbound by an
// instance that went without berth (deleted in the console, say). The sweeper calls List.
func (p *Provider) List(ctx context.Context, tags map[string]string) ([]cloud.Instance, error) {
	const op = "list"
	svc, err := p.service(ctx, op)
	if err != nil {
		return nil, err
	}
	net, err := p.network(ctx, svc, op)
	if err != nil {
		return nil, err
	}
	prefix := namePrefix(tags)
	var ours []*vpcv1.Instance
	for start := (*string)(nil); ; {
		page, resp, err := svc.ListInstancesWithContext(ctx, &vpcv1.ListInstancesOptions{VPCID: &net.vpcID, Start: start})
		if err != nil {
			return nil, p.failure(op, resp, err)
		}
		for i := range page.Instances {
			if strings.HasPrefix(deref(page.Instances[i].Name), prefix) {
				ours = append(ours, &page.Instances[i])
			}
		}
		if start, err = page.GetNextStart(); err != nil || start == nil {
			break
		}
	}
	fips, err := p.floatingIPs(ctx, svc, op, "")
	if err != nil {
		return nil, err
	}
	addresses := map[string]string{}
	for _, f := range fips {
		target, _ := f.Target.(*vpcv1.FloatingIPTarget)
		switch {
		case target != nil && target.ID != nil:
			addresses[*target.ID] = deref(f.Address)
		case strings.HasPrefix(deref(f.Name), prefix):
			// Best effort: a floating IP that stays is deleted by the next List.
			svc.DeleteFloatingIPWithContext(ctx, &vpcv1.DeleteFloatingIPOptions{ID: f.ID})
		}
	}
	out := []cloud.Instance{}
	for _, inst := range ours {
		switch status := deref(inst.Status); {
		case status == vpcv1.InstanceStatusFailedConst:
			p.remove(ctx, svc, op, inst) // best effort, as above
			continue
		case status == vpcv1.InstanceStatusDeletingConst:
			continue
		}
		address := ""
		if !p.privateIP {
			address = addresses[nicID(inst)]
		}
		i := p.toInstance(inst, address)
		i.Tags = tags
		out = append(out, i)
	}
	return out, nil
}

func (p *Provider) Terminate(ctx context.Context, id string) error {
	const op = "terminate"
	if id == "" {
		return nil
	}
	svc, err := p.service(ctx, op)
	if err != nil {
		return err
	}
	inst, resp, err := svc.GetInstanceWithContext(ctx, &vpcv1.GetInstanceOptions{ID: &id})
	if err != nil {
		err = p.failure(op, resp, err)
		if cloud.KindOf(err) == cloud.NotFound {
			return nil // gone already; a floating IP it left is List's to reclaim
		}
		return err
	}
	return p.remove(ctx, svc, op, inst)
}

// remove deletes an instance's floating IPs, then the instance; what is gone already counts
// as deleted.
func (p *Provider) remove(ctx context.Context, svc *operations, op string, inst *vpcv1.Instance) error {
	if nic := nicID(inst); nic != "" {
		fips, err := p.floatingIPs(ctx, svc, op, nic)
		if err != nil {
			return err
		}
		for _, f := range fips {
			resp, err := svc.DeleteFloatingIPWithContext(ctx, &vpcv1.DeleteFloatingIPOptions{ID: f.ID})
			if err := p.failure(op, resp, err); err != nil && cloud.KindOf(err) != cloud.NotFound {
				return err
			}
		}
	}
	resp, err := svc.DeleteInstanceWithContext(ctx, &vpcv1.DeleteInstanceOptions{ID: inst.ID})
	if err := p.failure(op, resp, err); err != nil && cloud.KindOf(err) != cloud.NotFound {
		return err
	}
	return nil
}

// --- Launch steps ---

// network is what a launch needs resolved from the config's names.
type network struct {
	vpcID, subnetID, keyID, zone string
	// resourceGroupID is the VPC's group: instances go where the VPC is, as upstream put them,
	// so that IAM policies scoped to that group cover them.
	resourceGroupID string
}

// network returns what the config's names resolved to, resolving them at the first call.
func (p *Provider) network(ctx context.Context, svc *operations, op string) (network, error) {
	p.mu.Lock()
	known := p.net
	p.mu.Unlock()
	if known != nil {
		return *known, nil
	}
	n, err := p.resolve(ctx, svc, op)
	if err != nil {
		return network{}, err
	}
	p.mu.Lock()
	p.net = &n
	p.mu.Unlock()
	return n, nil
}

func (p *Provider) forgetNetwork() {
	p.mu.Lock()
	p.net = nil
	p.mu.Unlock()
}

// resolve finds the VPC, the subnet and the SSH key the config names (by name, as real
// configs do, or by id) and the zone to launch in.
func (p *Provider) resolve(ctx context.Context, svc *operations, op string) (network, error) {
	vpc, err := p.resolveVPC(ctx, svc, op)
	if err != nil {
		return network{}, err
	}
	n := network{vpcID: deref(vpc.ID)}
	if vpc.ResourceGroup != nil {
		n.resourceGroupID = deref(vpc.ResourceGroup.ID)
	}
	var zone string
	err = eachPage(func(start *string) (*string, error) {
		page, resp, err := svc.ListSubnetsWithContext(ctx, &vpcv1.ListSubnetsOptions{VPCID: vpc.ID, Start: start})
		if err != nil {
			return nil, p.failure(op, resp, err)
		}
		for _, s := range page.Subnets {
			if matches(p.subnet, s.Name, s.ID) {
				n.subnetID = deref(s.ID)
				if s.Zone != nil {
					zone = deref(s.Zone.Name)
				}
				return nil, nil
			}
		}
		return page.GetNextStart()
	})
	if err != nil {
		return network{}, err
	}
	if n.subnetID == "" {
		return network{}, cloud.Errorf(cloud.BadConfig, op, "platform %s: VPC %s has no subnet %q (the subnet key)", p.platform, p.vpc, p.subnet)
	}
	switch {
	case p.zone == "":
		n.zone = zone
	case zone != "" && zone != p.zone:
		return network{}, cloud.Errorf(cloud.BadConfig, op, "platform %s: subnet %s is in zone %s, but the region key names zone %s", p.platform, p.subnet, zone, p.zone)
	default:
		n.zone = p.zone
	}
	err = eachPage(func(start *string) (*string, error) {
		page, resp, err := svc.ListKeysWithContext(ctx, &vpcv1.ListKeysOptions{Start: start})
		if err != nil {
			return nil, p.failure(op, resp, err)
		}
		for _, k := range page.Keys {
			if matches(p.key, k.Name, k.ID) {
				n.keyID = deref(k.ID)
				return nil, nil
			}
		}
		return page.GetNextStart()
	})
	if err != nil {
		return network{}, err
	}
	if n.keyID == "" {
		return network{}, cloud.Errorf(cloud.BadConfig, op, "platform %s: the region has no SSH key %q (the key key)", p.platform, p.key)
	}
	return n, nil
}

func (p *Provider) resolveVPC(ctx context.Context, svc *operations, op string) (*vpcv1.VPC, error) {
	var found *vpcv1.VPC
	err := eachPage(func(start *string) (*string, error) {
		page, resp, err := svc.ListVpcsWithContext(ctx, &vpcv1.ListVpcsOptions{Start: start})
		if err != nil {
			return nil, p.failure(op, resp, err)
		}
		for i, v := range page.Vpcs {
			if matches(p.vpc, v.Name, v.ID) {
				found = &page.Vpcs[i]
				return nil, nil
			}
		}
		return page.GetNextStart()
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, cloud.Errorf(cloud.BadConfig, op, "platform %s: %s has no VPC %q (the vpc key)", p.platform, p.endpoint, p.vpc)
	}
	return found, nil
}

func (p *Provider) findByName(ctx context.Context, svc *operations, op, vpcID, name string) (*vpcv1.Instance, error) {
	page, resp, err := svc.ListInstancesWithContext(ctx, &vpcv1.ListInstancesOptions{VPCID: &vpcID, Name: &name})
	if err != nil {
		return nil, p.failure(op, resp, err)
	}
	if len(page.Instances) == 0 {
		return nil, nil
	}
	return &page.Instances[0], nil
}

func (p *Provider) create(ctx context.Context, svc *operations, n network, name string) (*vpcv1.Instance, error) {
	const op = "launch"
	deleteVolume := true
	proto := &vpcv1.InstancePrototypeInstanceByImage{
		Name:    &name,
		Zone:    &vpcv1.ZoneIdentityByName{Name: &n.zone},
		VPC:     &vpcv1.VPCIdentityByID{ID: &n.vpcID},
		Profile: &vpcv1.InstanceProfileIdentityByName{Name: &p.profile},
		Image:   &vpcv1.ImageIdentityByID{ID: &p.image},
		Keys:    []vpcv1.KeyIdentityIntf{&vpcv1.KeyIdentityByID{ID: &n.keyID}},
		PrimaryNetworkInterface: &vpcv1.NetworkInterfacePrototype{
			Name:   core.StringPtr("eth0"),
			Subnet: &vpcv1.SubnetIdentityByID{ID: &n.subnetID},
		},
		BootVolumeAttachment: &vpcv1.VolumeAttachmentPrototypeInstanceByImageContext{
			DeleteVolumeOnInstanceDelete: &deleteVolume,
			Volume: &vpcv1.VolumePrototypeInstanceByImageContext{
				Name:     core.StringPtr(name + "-boot"),
				Capacity: &p.diskGB,
				Profile:  &vpcv1.VolumeProfileIdentityByName{Name: core.StringPtr(bootVolumeProfile)},
			},
		},
	}
	if n.resourceGroupID != "" {
		proto.ResourceGroup = &vpcv1.ResourceGroupIdentityByID{ID: &n.resourceGroupID}
	}
	created, resp, err := svc.CreateInstanceWithContext(ctx, &vpcv1.CreateInstanceOptions{InstancePrototype: proto})
	if err != nil {
		err = p.failure(op, resp, err)
		if !nameTaken(resp) {
			return nil, err
		}
		// Another call created it first (or a retry of this one did): it is ours.
		inst, ferr := p.findByName(ctx, svc, op, n.vpcID, name)
		switch {
		case ferr != nil:
			return nil, ferr
		case inst == nil:
			return nil, err
		}
		return inst, nil
	}
	// Read it back: an instance no host could take fails at once, and Launch reports that
	// as Capacity rather than handing out an instance that will never run.
	inst, resp, err := svc.GetInstanceWithContext(ctx, &vpcv1.GetInstanceOptions{ID: created.ID})
	if err != nil {
		if err := p.failure(op, resp, err); cloud.KindOf(err) != cloud.NotFound {
			return nil, err
		}
		return created, nil
	}
	return inst, nil
}

// ensureFloatingIP gives the instance's primary network interface a floating IP named like
// the instance, unless it has one, and returns its address.
func (p *Provider) ensureFloatingIP(ctx context.Context, svc *operations, inst *vpcv1.Instance) (string, error) {
	const op = "launch"
	nic := nicID(inst)
	if nic == "" {
		return "", cloud.Errorf(cloud.Transient, op, "instance %s has no network interface yet", deref(inst.ID))
	}
	fips, err := p.floatingIPs(ctx, svc, op, nic)
	if err != nil {
		return "", err
	}
	if len(fips) > 0 {
		return deref(fips[0].Address), nil
	}
	for attempt := 0; ; attempt++ {
		proto := &vpcv1.FloatingIPPrototypeFloatingIPByTarget{
			Name:   inst.Name,
			Target: &vpcv1.FloatingIPTargetPrototypeNetworkInterfaceIdentityNetworkInterfaceIdentityByID{ID: &nic},
		}
		if inst.ResourceGroup != nil && inst.ResourceGroup.ID != nil {
			proto.ResourceGroup = &vpcv1.ResourceGroupIdentityByID{ID: inst.ResourceGroup.ID}
		}
		fip, resp, err := svc.CreateFloatingIPWithContext(ctx, &vpcv1.CreateFloatingIPOptions{FloatingIPPrototype: proto})
		if err == nil {
			return deref(fip.Address), nil
		}
		err = p.failure(op, resp, err)
		if !nameTaken(resp) || attempt > 0 {
			return "", err
		}
		// A floating IP of this name is left from an earlier try of this launch, unbound:
		// delete it and create the one bound to this interface.
		all, lerr := p.floatingIPs(ctx, svc, op, "")
		if lerr != nil {
			return "", lerr
		}
		for _, f := range all {
			if deref(f.Name) == deref(inst.Name) {
				resp, err := svc.DeleteFloatingIPWithContext(ctx, &vpcv1.DeleteFloatingIPOptions{ID: f.ID})
				if err := p.failure(op, resp, err); err != nil && cloud.KindOf(err) != cloud.NotFound {
					return "", err
				}
			}
		}
	}
}

// floatingIPs lists the floating IPs bound to a network interface, or all when nic is "".
func (p *Provider) floatingIPs(ctx context.Context, svc *operations, op, nic string) ([]vpcv1.FloatingIP, error) {
	var out []vpcv1.FloatingIP
	err := eachPage(func(start *string) (*string, error) {
		opts := &vpcv1.ListFloatingIpsOptions{Start: start}
		if nic != "" {
			opts.TargetID = &nic
		}
		page, resp, err := svc.ListFloatingIpsWithContext(ctx, opts)
		if err != nil {
			return nil, p.failure(op, resp, err)
		}
		out = append(out, page.FloatingIps...)
		return page.GetNextStart()
	})
	return out, err
}

// --- Translation ---

func (p *Provider) toInstance(inst *vpcv1.Instance, floating string) cloud.Instance {
	out := cloud.Instance{ID: deref(inst.ID), Token: tokenOf(deref(inst.Name))}
	if inst.CreatedAt != nil {
		out.LaunchedAt = time.Time(*inst.CreatedAt)
	}
	switch status := deref(inst.Status); {
	case status == vpcv1.InstanceStatusRunningConst:
		out.State = cloud.StateRunning
	case liveState(status):
		out.State = cloud.StatePending
	case status == vpcv1.InstanceStatusFailedConst || status == vpcv1.InstanceStatusDeletingConst:
		out.State = cloud.StateGone
	default:
		// Stopped or stopping; or a status this berth does not know (the API says its
		// enumerations may grow): not serving and not known gone, so berth deletes it rather
		// than forget it.
		out.State = cloud.StateStopped
	}
	if out.State != cloud.StateRunning {
		return out
	}
	if !p.privateIP {
		out.Address = floating
		return out
	}
	if n := inst.PrimaryNetworkInterface; n != nil && n.PrimaryIP != nil {
		if a := deref(n.PrimaryIP.Address); a != "0.0.0.0" {
			out.Address = a // 0.0.0.0 is the API's "not assigned yet"
		}
	}
	return out
}

// liveState says whether an instance in this status may still serve: it runs or is on its
// way to running.
func liveState(status string) bool {
	switch status {
	case vpcv1.InstanceStatusPendingConst, vpcv1.InstanceStatusStartingConst, vpcv1.InstanceStatusRestartingConst, vpcv1.InstanceStatusRunningConst:
		return true
	}
	return false
}

// capacityFailure returns the reason code of an instance that failed because no host could
// take it, "" for any other.
func capacityFailure(inst *vpcv1.Instance) string {
	if deref(inst.Status) != vpcv1.InstanceStatusFailedConst {
		return ""
	}
	for _, r := range inst.StatusReasons {
		switch c := deref(r.Code); c {
		case vpcv1.InstanceStatusReasonCodeCannotStartCapacityConst, vpcv1.InstanceStatusReasonCodeCannotStartComputeConst,
			vpcv1.InstanceStatusReasonCodeCannotStartPlacementGroupConst, vpcv1.InstanceStatusReasonCodeCannotStartReservationCapacityConst:
			return c
		}
	}
	return ""
}

func nicID(inst *vpcv1.Instance) string {
	if inst.PrimaryNetworkInterface == nil {
		return ""
	}
	return deref(inst.PrimaryNetworkInterface.ID)
}

func matches(want string, name, id *string) bool { return want == deref(name) || want == deref(id) }

// eachPage calls page with each start token (nil first) until it returns no next one.
func eachPage(page func(start *string) (next *string, err error)) error {
	var start *string
	for {
		next, err := page(start)
		if err != nil || next == nil {
			return err
		}
		start = next
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// --- Errors ---

// apiProblem is the first entry of the VPC API's error body.
type apiProblem struct {
	status                int
	code, message, target string
}

func problemOf(resp *core.DetailedResponse) apiProblem {
	pr := apiProblem{}
	if resp == nil {
		return pr
	}
	pr.status = resp.StatusCode
	body, _ := resp.Result.(map[string]any)
	errs, _ := body["errors"].([]any)
	if len(errs) == 0 {
		return pr
	}
	first, _ := errs[0].(map[string]any)
	pr.code, _ = first["code"].(string)
	pr.message, _ = first["message"].(string)
	if t, ok := first["target"].(map[string]any); ok {
		pr.target, _ = t["name"].(string)
	}
	return pr
}

// nameTaken says whether a create failed because the name is in use.
func nameTaken(resp *core.DetailedResponse) bool {
	pr := problemOf(resp)
	return pr.status == http.StatusConflict || pr.code == "validation_unique_failed"
}

// failure turns an SDK error into a typed one; nil stays nil. IAM refusing the key and the
// VPC API refusing the token are Auth; the body's code decides quota and capacity; the status
// the rest.
func (p *Provider) failure(op string, resp *core.DetailedResponse, err error) error {
	if err == nil {
		return nil
	}
	var hp *core.HTTPProblem
	if errors.As(err, &hp) && hp.Component != nil && hp.Component.Name == "iam_identity_services" {
		status := 0
		if hp.Response != nil {
			status = hp.Response.StatusCode
		}
		if status == http.StatusBadRequest || status == http.StatusUnauthorized || status == http.StatusForbidden {
			return cloud.Errorf(cloud.Auth, op, "IBM Cloud IAM (%s) refused the API key in key %s of Secret %s (%d): check that it is a valid key of the account", p.iamURL, ibmiam.APIKeyKey, p.secretName, status)
		}
		return cloud.Errorf(cloud.Transient, op, "getting a token from IBM Cloud IAM (%s): %d", p.iamURL, status)
	}
	pr := problemOf(resp)
	if pr.status == 0 {
		// No answer: network trouble, a timeout or the caller giving up.
		return &cloud.Error{Kind: cloud.Transient, Op: op, Err: err}
	}
	msg := fmt.Sprintf("VPC API %s answered %d", p.endpoint, pr.status)
	if pr.code != "" {
		msg += " " + pr.code
	}
	if pr.message != "" {
		msg += ": " + pr.message
	}
	if pr.target != "" {
		msg += " (field " + pr.target + ")"
	}
	e := &cloud.Error{Kind: kindOf(pr), Op: op, Err: errors.New(msg)}
	switch e.Kind {
	case cloud.Throttled:
		if s, err := strconv.Atoi(resp.GetHeaders().Get("Retry-After")); err == nil && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
	case cloud.Auth:
		e.Err = fmt.Errorf("%w (the API key is key %s of Secret %s: check that its user or service ID may manage VPC instances)", e.Err, ibmiam.APIKeyKey, p.secretName)
	}
	return e
}

func kindOf(pr apiProblem) cloud.Kind {
	switch {
	case strings.Contains(pr.code, "quota"):
		return cloud.Quota
	case strings.Contains(pr.code, "capacity"):
		return cloud.Capacity
	case pr.code == "iam_failure" || pr.code == "backend_service_unavailable":
		return cloud.Transient
	}
	switch s := pr.status; {
	case s == http.StatusTooManyRequests:
		return cloud.Throttled
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return cloud.Auth
	case s == http.StatusNotFound:
		return cloud.NotFound
	case s == http.StatusRequestTimeout || s == http.StatusConflict || s >= 500:
		return cloud.Transient
	case s >= 400:
		return cloud.BadConfig
	}
	return cloud.Transient
}

// --- Credentials ---

// service returns the calls of the SDK client for the API key now in the Secret, building a
// new client when the key changed.
func (p *Provider) service(ctx context.Context, op string) (*operations, error) {
	key, err := ibmiam.Read(ctx, p.readSecret, op, p.secretName, p.iamURL)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.svc != nil && p.keyDigest == key.Digest {
		return p.svc, nil
	}
	svc, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: p.endpoint, Authenticator: key.Authenticator})
	if err != nil {
		return nil, cloud.Errorf(cloud.BadConfig, op, "platform %s: the VPC client for %s: %v", p.platform, p.endpoint, err)
	}
	httpClient := core.DefaultHTTPClient()
	httpClient.Timeout = callTimeout
	retrying := core.NewRetryableClientWithHTTPClient(httpClient)
	retrying.RetryMax, retrying.RetryWaitMin, retrying.RetryWaitMax = retryMax, retryWaitMin, retryWaitMax
	retrying.CheckRetry = func(ctx context.Context, resp *http.Response, err error) (bool, error) {
		if err == nil && resp != nil && resp.StatusCode == http.StatusTooManyRequests {
			if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && time.Duration(s)*time.Second > maxInlineWait {
				return false, nil
			}
		}
		return core.IBMCloudSDKRetryPolicy(ctx, resp, err)
	}
	svc.Service.SetHTTPClient(retrying.StandardClient())
	p.keyDigest, p.svc = key.Digest, operationsOf(svc)
	return p.svc, nil
}

// operations are the VPC calls berth makes, as method values of the SDK's client; the
// provider holds these and never the client, so that the binary keeps only these of its
// nearly 1,900 operations (see the same type in package awsec2 for why a client held as
// itself keeps them all).
type operations struct {
	ListVpcsWithContext         func(context.Context, *vpcv1.ListVpcsOptions) (*vpcv1.VPCCollection, *core.DetailedResponse, error)
	ListSubnetsWithContext      func(context.Context, *vpcv1.ListSubnetsOptions) (*vpcv1.SubnetCollection, *core.DetailedResponse, error)
	ListKeysWithContext         func(context.Context, *vpcv1.ListKeysOptions) (*vpcv1.KeyCollection, *core.DetailedResponse, error)
	ListInstancesWithContext    func(context.Context, *vpcv1.ListInstancesOptions) (*vpcv1.InstanceCollection, *core.DetailedResponse, error)
	GetInstanceWithContext      func(context.Context, *vpcv1.GetInstanceOptions) (*vpcv1.Instance, *core.DetailedResponse, error)
	CreateInstanceWithContext   func(context.Context, *vpcv1.CreateInstanceOptions) (*vpcv1.Instance, *core.DetailedResponse, error)
	DeleteInstanceWithContext   func(context.Context, *vpcv1.DeleteInstanceOptions) (*core.DetailedResponse, error)
	ListFloatingIpsWithContext  func(context.Context, *vpcv1.ListFloatingIpsOptions) (*vpcv1.FloatingIPCollection, *core.DetailedResponse, error)
	CreateFloatingIPWithContext func(context.Context, *vpcv1.CreateFloatingIPOptions) (*vpcv1.FloatingIP, *core.DetailedResponse, error)
	DeleteFloatingIPWithContext func(context.Context, *vpcv1.DeleteFloatingIPOptions) (*core.DetailedResponse, error)
}

func operationsOf(v *vpcv1.VpcV1) *operations {
	return &operations{
		ListVpcsWithContext:         v.ListVpcsWithContext,
		ListSubnetsWithContext:      v.ListSubnetsWithContext,
		ListKeysWithContext:         v.ListKeysWithContext,
		ListInstancesWithContext:    v.ListInstancesWithContext,
		GetInstanceWithContext:      v.GetInstanceWithContext,
		CreateInstanceWithContext:   v.CreateInstanceWithContext,
		DeleteInstanceWithContext:   v.DeleteInstanceWithContext,
		ListFloatingIpsWithContext:  v.ListFloatingIpsWithContext,
		CreateFloatingIPWithContext: v.CreateFloatingIPWithContext,
		DeleteFloatingIPWithContext: v.DeleteFloatingIPWithContext,
	}
}
