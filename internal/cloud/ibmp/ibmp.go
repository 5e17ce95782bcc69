// Package ibmp is the provider for platforms of type ibmp: ppc64le VMs (pvm-instances) in one
// IBM Power Virtual Server workspace, reached with IBM's power-go-client and an IAM API key.
//
// Power VS instances carry no tags berth can list by, so an instance's name says whose it is
// and which launch made it: "b" + cloud.GroupKey(tags) + "-" + the launch token, encoded (see
// names.go). Launch lists the workspace and returns the instance of that name before it
// creates one, which makes it idempotent on the token; List finds a group by the name prefix.
// A platform with a disk size gets it by growing the instance's boot volume once it is up
// (disk.go); the instance counts as running only then.
package ibmp

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM-Cloud/power-go-client/clients/instance"
	"github.com/IBM-Cloud/power-go-client/ibmpisession"
	"github.com/IBM-Cloud/power-go-client/power/models"
	httptransport "github.com/go-openapi/runtime/client"

	"github.com/berth-ci/berth/internal/cloud"
	"github.com/berth-ci/berth/internal/cloud/ibmiam"
)

func init() { cloud.Register("ibmp", New) }

const (
	// adminUser is who Power VS images let in with the key pair named at create, as upstream.
	adminUser = "root"

	// Upstream's defaults for a platform that names no size: the smallest shared VM.
	defaultCores  = 0.25
	defaultMemory = 2
	// procType is fixed: shared processors come in quarters of a core and are what the
	// real configs' 0.25 and 0.5 need.
	procType = "shared"

	callTimeout = 60 * time.Second
	// A call that fails with a 5xx or a network error is tried this many more times, and a
	// throttled one while the API asks for waits no longer than maxInlineWait; then the
	// error goes back to berth, whose own backoff honours RetryAfter.
	transientRetries = 3
	throttleRetries  = 3
	maxInlineWait    = 5 * time.Second
	firstBackoff     = 500 * time.Millisecond
	// launchRounds bounds list-create rounds when creates keep meeting a name conflict.
	launchRounds = 3
)

// Provider launches pvm-instances in one workspace for one platform.
type Provider struct {
	platform   string
	endpoint   string
	iamURL     string
	ws         workspace
	secretName string
	readSecret cloud.SecretReader

	networks []string
	image    string
	key      string
	sysType  string
	cores    float64
	memory   float64
	disk     float64
	userData string

	// backoff is the first wait before retrying a failed call; sleep waits (tests make both
	// short or record the waits instead).
	backoff time.Duration
	sleep   func(ctx context.Context, d time.Duration) error

	mu sync.Mutex
	// sess is the session for the API key whose digest is sessKey: rebuilt when the Secret
	// changes, so a rotated key takes effect at the next call and the IAM token is reused
	// between calls otherwise.
	sess    *ibmpisession.IBMPISession
	sessKey [sha256.Size]byte
	// sized holds the instances whose boot volume was seen at the disk size, so that a
	// running instance costs no volume call per look.
	sized map[string]bool
}

// workspace is what a Power VS workspace CRN says:
// crn:v1:<cname>:<ctype>:power-iaas:<zone>:a/<account>:<cloud instance id>::
type workspace struct {
	crn, zone, account, id string
}

func parseCRN(s string) (workspace, error) {
	seg := strings.Split(s, ":")
	switch {
	case len(seg) != 10 || seg[0] != "crn" || seg[1] != "v1":
		return workspace{}, fmt.Errorf("it is not a CRN like crn:v1:bluemix:public:power-iaas:<zone>:a/<account>:<workspace id>::")
	case seg[4] != "power-iaas":
		return workspace{}, fmt.Errorf("it names service %q, not a Power Virtual Server workspace (power-iaas)", seg[4])
	case seg[5] == "" || seg[5] == "global":
		return workspace{}, fmt.Errorf("it has no zone (like wdc06): a workspace lives in one")
	case !strings.HasPrefix(seg[6], "a/") || len(seg[6]) == 2:
		return workspace{}, fmt.Errorf("its scope %q is not an account (a/<account id>)", seg[6])
	case seg[7] == "":
		return workspace{}, fmt.Errorf("it has no workspace id (the service instance, after the account)")
	}
	return workspace{crn: s, zone: seg[5], account: seg[6][2:], id: seg[7]}, nil
}

var (
	// A name the API takes as an image, network or key pair: an id or a plain name.
	resourceName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 ._-]{0,127}$`)
	sysTypeShape = regexp.MustCompile(`^[a-z0-9-]{1,32}$`)
)

// New builds a provider from the platform's keys, checking each; the API key is read later,
// at each call.
func New(s cloud.Settings) (cloud.Provider, error) {
	v := func(k string) string { return strings.TrimSpace(s.Values[k]) }
	bad := func(key, format string, args ...any) error { return cloud.BadKey(s.Platform, key, format, args...) }
	p := &Provider{
		platform:   s.Platform,
		secretName: v("secret"),
		readSecret: s.Secret,
		image:      v("image"),
		key:        v("key"),
		sysType:    v("system"),
		cores:      defaultCores,
		memory:     defaultMemory,
		backoff:    firstBackoff,
		sleep:      sleepCtx,
		sized:      map[string]bool{},
	}
	for _, k := range []string{"url", "crn", "network", "image", "key", "secret"} {
		if v(k) == "" {
			return nil, bad(k, "required (see docs/clouds/ibmp.md)")
		}
	}
	if s.Secret == nil {
		return nil, cloud.Errorf(cloud.BadConfig, "setup", "platform %s: no way to read Secrets was given", s.Platform)
	}
	var err error
	if p.endpoint, err = endpointURL(v("url")); err != nil {
		return nil, bad("url", "%q %v", v("url"), err)
	}
	p.iamURL = ibmiam.DefaultURL
	if raw := v("iam-url"); raw != "" {
		if p.iamURL, err = endpointURL(raw); err != nil {
			return nil, bad("iam-url", "%q %v", raw, err)
		}
	}
	if p.ws, err = parseCRN(v("crn")); err != nil {
		return nil, bad("crn", "%q: %v", v("crn"), err)
	}
	for _, n := range strings.Split(v("network"), ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !resourceName.MatchString(n) {
			return nil, bad("network", "%q is not a network id or name", n)
		}
		p.networks = append(p.networks, n)
	}
	if len(p.networks) == 0 {
		return nil, bad("network", "names no network")
	}
	if !resourceName.MatchString(p.image) {
		return nil, bad("image", "%q is not an image id or name", p.image)
	}
	if !resourceName.MatchString(p.key) {
		return nil, bad("key", "%q is not an SSH key name", p.key)
	}
	if p.sysType != "" && !sysTypeShape.MatchString(p.sysType) {
		return nil, bad("system", "%q is not a system type like s922 or e980", p.sysType)
	}
	if raw := v("cores"); raw != "" {
		c, err := strconv.ParseFloat(raw, 64)
		// Shared processors come in quarters of a core.
		if err != nil || c <= 0 || c > 1024 || c*4 != float64(int(c*4)) {
			return nil, bad("cores", "%q is not a number of cores in steps of 0.25, like 0.25, 0.5 or 2", raw)
		}
		p.cores = c
	}
	if raw := v("memory"); raw != "" {
		m, err := strconv.ParseFloat(raw, 64)
		if err != nil || m < 2 || m > 65536 || m != float64(int(m)) {
			return nil, bad("memory", "%q is not a whole number of GB (2 or more), like 8", raw)
		}
		p.memory = m
	}
	if raw := v("disk"); raw != "" {
		d, err := strconv.ParseFloat(raw, 64)
		if err != nil || d < 1 || d > 65536 || d != float64(int(d)) {
			return nil, bad("disk", "%q is not a whole number of GB, like 200", raw)
		}
		p.disk = d
	}
	// The API takes cloud-init user data base64-encoded; the config holds it as written.
	if ud := s.Values["user-data"]; strings.TrimSpace(ud) != "" {
		p.userData = base64.StdEncoding.EncodeToString([]byte(ud))
	}
	return p, nil
}

// endpointURL checks an http(s) base URL (no path, query or credentials) and returns it
// without a trailing slash.
func endpointURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("is not an http(s) URL of a host, like https://us-east.power-iaas.cloud.ibm.com")
	}
	return u.Scheme + "://" + u.Host, nil
}

var _ cloud.Provider = (*Provider)(nil)

func (p *Provider) AdminUser() string { return adminUser }

func (p *Provider) Launch(ctx context.Context, req cloud.LaunchRequest) (cloud.Instance, error) {
	if req.Token == "" {
		return cloud.Instance{}, cloud.Errorf(cloud.BadConfig, "launch", "no launch token: a launch without one could start a VM twice")
	}
	name := instanceName(req.Tags, req.Token)
	for round := 0; ; round++ {
		// The token's instance may exist already: made by a launch whose answer was lost, or
		// before a crash that kept berth from saving its id.
		var found *models.PVMInstanceReference
		err := p.call(ctx, "launch", func(c api) error {
			all, err := c.instances().GetAll()
			if err == nil {
				found = byName(all, name)
			}
			return err
		})
		if err != nil {
			return cloud.Instance{}, err
		}
		if found != nil {
			return p.observe(ctx, "launch", viewOfRef(found), req.Tags)
		}
		var made *models.PVMInstanceList
		err = p.call(ctx, "launch", func(c api) error {
			var err error
			made, err = c.instances().Create(p.createBody(name))
			return err
		})
		switch {
		case err == nil && made != nil && len(*made) > 0 && (*made)[0] != nil:
			return p.observe(ctx, "launch", viewOf((*made)[0]), req.Tags)
		case err == nil:
			return cloud.Instance{}, cloud.Errorf(cloud.Transient, "launch", "workspace %s accepted %s but named no instance", p.ws.id, name)
		case statusOf(err) == 409 && round+1 < launchRounds:
			continue // made meanwhile (a concurrent or retried create): list again
		case statusOf(err) == 404:
			// The create names the workspace, image, network and key: one of them is not there.
			return cloud.Instance{}, &cloud.Error{Kind: cloud.BadConfig, Op: "launch", Err: err}
		}
		return cloud.Instance{}, err
	}
}

// createBody maps the platform's keys to the create request (docs/clouds/ibmp.md has the table).
func (p *Provider) createBody(name string) *models.PVMInstanceCreate {
	nets := make([]*models.PVMInstanceAddNetwork, len(p.networks))
	for i, n := range p.networks {
		nets[i] = &models.PVMInstanceAddNetwork{NetworkID: ptr(n)}
	}
	return &models.PVMInstanceCreate{
		ServerName:  ptr(name),
		ImageID:     ptr(p.image),
		Processors:  ptr(p.cores),
		ProcType:    ptr(procType),
		Memory:      ptr(p.memory),
		Networks:    nets,
		KeyPairName: p.key,
		SysType:     p.sysType,
		UserData:    p.userData,
	}
}

func (p *Provider) Get(ctx context.Context, id string) (cloud.Instance, error) {
	if id == "" {
		return cloud.Instance{}, cloud.Errorf(cloud.NotFound, "get", "no instance id")
	}
	var got *models.PVMInstance
	err := p.call(ctx, "get", func(c api) error {
		var err error
		got, err = c.instances().Get(id)
		return err
	})
	if cloud.KindOf(err) == cloud.NotFound {
		p.forgetSized(id)
	}
	if err != nil {
		return cloud.Instance{}, err
	}
	return p.observe(ctx, "get", viewOf(got), nil)
}

func (p *Provider) List(ctx context.Context, tags map[string]string) ([]cloud.Instance, error) {
	var all *models.PVMInstances
	err := p.call(ctx, "list", func(c api) error {
		var err error
		all, err = c.instances().GetAll()
		return err
	})
	if err != nil {
		return nil, err
	}
	prefix := groupPrefix(tags)
	var out []cloud.Instance
	for _, ref := range all.PvmInstances {
		if ref == nil || ref.ServerName == nil || !strings.HasPrefix(*ref.ServerName, prefix) {
			continue
		}
		inst, err := p.observe(ctx, "list", viewOfRef(ref), tags)
		if err != nil {
			return nil, err
		}
		if inst.State != cloud.StateGone {
			out = append(out, inst)
		}
	}
	return out, nil
}

func (p *Provider) Terminate(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	err := p.call(ctx, "terminate", func(c api) error { return c.instances().Delete(id) })
	if err == nil || cloud.KindOf(err) == cloud.NotFound {
		p.forgetSized(id)
		return nil // gone already, or never known: either way it runs no more
	}
	return err
}

// observe turns what the API says of an instance into berth's view. An instance that failed
// (ERROR) is of no use to berth but still held and billed, and once berth hears it is gone it
// forgets it: so the provider deletes it here, best effort, and the next look finds it
// deleting or deleted. One shut off (SHUTOFF) is stopped: berth's VM loop or sweeper
// terminates it, and retries until that holds. An instance that is up is running only once
// its boot volume has the platform's disk size; the error is that of the volume calls.
func (p *Provider) observe(ctx context.Context, op string, v view, tags map[string]string) (cloud.Instance, error) {
	inst := cloud.Instance{ID: v.id, Token: tokenOf(v.name), Address: p.address(v.networks), LaunchedAt: v.created}
	if len(tags) > 0 {
		inst.Tags = map[string]string{cloud.TagInstallation: tags[cloud.TagInstallation], cloud.TagPlatform: tags[cloud.TagPlatform]}
	}
	switch strings.ToUpper(v.status) {
	case "ACTIVE":
		// Running once it has an address berth can reach it at, and the disk it was asked with.
		inst.State = cloud.StatePending
		if inst.Address != "" {
			sized, err := p.diskSized(ctx, op, v.id)
			if err != nil {
				return cloud.Instance{}, err
			}
			if sized {
				inst.State = cloud.StateRunning
			}
		}
	case "SHUTOFF":
		inst.State = cloud.StateStopped
	case "ERROR":
		inst.State = cloud.StateGone
		// Every instance observed is berth's: found by its id, its name or its group's prefix.
		_ = p.Terminate(ctx, v.id) // a failure here leaves it for the next look
	case "DELETING", "DELETED":
		inst.State = cloud.StateGone
		p.forgetSized(v.id)
	default:
		// BUILD, and the passing states (REBOOT, RESIZE, MIGRATING, ...) of an instance that
		// has not settled.
		inst.State = cloud.StatePending
	}
	if inst.State != cloud.StateRunning {
		inst.Address = ""
	}
	return inst, nil
}

// address is the instance's address on the first configured network: its external (public)
// IP when it has one, as upstream prefers, else its IP on the network. An instance not yet
// on that network, as the API reports it, has none.
func (p *Provider) address(nets []*models.PVMInstanceNetwork) string {
	want := p.networks[0]
	for _, n := range nets {
		if n == nil || (n.NetworkID != want && n.NetworkName != want) {
			continue
		}
		if n.ExternalIP != "" {
			return n.ExternalIP
		}
		if n.IPAddress != "" {
			return n.IPAddress
		}
		return n.IP
	}
	return ""
}

// view is what Power VS's instance and instance-reference models have in common.
type view struct {
	id, name, status string
	networks         []*models.PVMInstanceNetwork
	created          time.Time
}

func viewOf(m *models.PVMInstance) view {
	return view{id: deref(m.PvmInstanceID), name: deref(m.ServerName), status: deref(m.Status), networks: m.Networks, created: time.Time(m.CreationDate)}
}

func viewOfRef(m *models.PVMInstanceReference) view {
	return view{id: deref(m.PvmInstanceID), name: deref(m.ServerName), status: deref(m.Status), networks: m.Networks, created: time.Time(m.CreationDate)}
}

func byName(all *models.PVMInstances, name string) *models.PVMInstanceReference {
	if all == nil {
		return nil
	}
	for _, ref := range all.PvmInstances {
		if ref != nil && deref(ref.ServerName) == name {
			return ref
		}
	}
	return nil
}

// api gives one try of a call the workspace's clients, bound to the try's context.
type api struct {
	ctx  context.Context
	sess *ibmpisession.IBMPISession
	ws   string
}

func (a api) instances() *instance.IBMPIInstanceClient {
	return instance.NewIBMPIInstanceClient(a.ctx, a.sess, a.ws)
}

func (a api) volumes() *instance.IBMPIVolumeClient {
	return instance.NewIBMPIVolumeClient(a.ctx, a.sess, a.ws)
}

// call runs one API call with the workspace's clients, retrying it inline while the failure
// is short-lived, and returns a *cloud.Error otherwise.
func (p *Provider) call(ctx context.Context, op string, fn func(api) error) error {
	sess, err := p.session(ctx, op)
	if err != nil {
		return err
	}
	transient, throttled := 0, 0
	for {
		rec := &exchange{}
		cctx, cancel := context.WithTimeout(withExchange(ctx, rec), callTimeout)
		err := fn(api{ctx: cctx, sess: sess, ws: p.ws.id})
		cancel()
		if err == nil {
			return nil
		}
		cerr := p.classify(op, err, rec)
		if ctx.Err() != nil {
			return cerr
		}
		var wait time.Duration
		switch cerr.Kind {
		case cloud.Transient:
			// A conflict is the caller's to resolve (Launch lists again), not a passing fault.
			if transient == transientRetries || statusOf(cerr) == http.StatusConflict {
				return cerr
			}
			wait = p.backoff << transient
			transient++
		case cloud.Throttled:
			if throttled == throttleRetries {
				return cerr
			}
			wait = cerr.RetryAfter
			if wait == 0 {
				wait = p.backoff << throttled
			}
			if wait > maxInlineWait {
				return cerr
			}
			throttled++
		default:
			return cerr
		}
		if p.sleep(ctx, wait) != nil {
			return cerr
		}
	}
}

// session returns the session for the API key now in the platform's Secret.
func (p *Provider) session(ctx context.Context, op string) (*ibmpisession.IBMPISession, error) {
	key, err := ibmiam.Read(ctx, p.readSecret, op, p.secretName, p.iamURL)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess != nil && p.sessKey == key.Digest {
		return p.sess, nil
	}
	sess, err := ibmpisession.NewIBMPISession(&ibmpisession.IBMPIOptions{
		Authenticator: key.Authenticator,
		URL:           p.endpoint,
		UserAccount:   p.ws.account,
		Zone:          p.ws.zone,
	})
	if err != nil {
		return nil, cloud.Errorf(cloud.BadConfig, op, "platform %s: setting up the Power VS client for %s: %v", p.platform, p.endpoint, err)
	}
	// The generated client drops response headers; this records the status and Retry-After
	// of each response for the call that made it.
	if rt, ok := sess.Power.Transport.(*httptransport.Runtime); ok {
		rt.Transport = recordingTransport{next: rt.Transport}
	}
	p.sess, p.sessKey = sess, key.Digest
	return sess, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func ptr[T any](v T) *T { return &v }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
