//go:build linux

// Package vpcfake is a stand-in for the part of IBM Cloud's VPC API (v1, JSON) that berth's
// ibmz provider calls through github.com/IBM/vpc-go-sdk: VPCs, subnets and SSH keys to resolve
// names, instances (create, get, list with name and VPC filters and pagination, delete) and
// floating IPs (create bound to a network interface, get, list, delete). It checks what the
// real API checks — the version and generation query parameters, a bearer token that IAM
// (iamfake) issued, the required fields of an instance prototype, unique names — and answers
// failures with the API's error body: {"errors":[{"code","message","more_info","target"}],
// "trace","status_code"}.
//
// The machines behind the instances are a *vmcloud.Cloud's: this package keeps the VPC's own
// view (ids, names, network interfaces, floating IPs) and leaves booting, capacity, quotas and
// boot delays to the cloud. A capacity failure shows as the real API shows it: the create
// succeeds and the instance is then "failed" with status reason cannot_start_capacity.
//
// It is a test ground: only tests, the dev stack and the bench link it, never the controller.
package vpcfake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/iamfake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// Options configure a Server. Everything but Machines and IAM has a default.
type Options struct {
	// Machines runs the instances. Required.
	Machines *vmcloud.Cloud
	// IAM issued the bearer tokens the API accepts. Required.
	IAM *iamfake.Server
	// Region is the API's region ("us-east"); Zone the subnet's zone ("us-east-2").
	Region, Zone string
	// VPC and Subnet are the names of the one VPC and the one subnet in it.
	VPC, Subnet string
	// Keys are the names of the SSH keys in the region.
	Keys []string
	// Images are the ids of the images instances may boot; Profiles the instance profiles.
	Images, Profiles []string
	// PageLimit is the most items a list answers at once (the API's default is 50).
	PageLimit int
	// Addr is where the API listens; 127.0.0.1:0 when empty.
	Addr string
}

// Defaults of Options.
const (
	DefaultRegion  = "us-east"
	DefaultVPC     = "berth-vpc"
	DefaultSubnet  = "berth-subnet"
	DefaultKey     = "berth-key"
	DefaultImage   = "r014-5e0f7ab6-4e0a-4d5f-9c0e-2b7a1f6d3c11"
	DefaultProfile = "bz2-2x8"
)

// Instance is an instance as the stand-in keeps it, with what its create asked for.
type Instance struct {
	ID, Name, Status string
	// StatusReason is the code of the first status reason of a failed instance.
	StatusReason string
	// MachineID is the vmcloud instance behind it ("" after a capacity failure).
	MachineID                  string
	VPC, Zone, Profile, Image  string
	Subnet, NetworkInterfaceID string
	Keys                       []string
	// BootVolumeGB is the boot volume's capacity (0: the image's default).
	BootVolumeGB int64
	// BootVolumeProfile is the boot volume's profile name.
	BootVolumeProfile string
	// ResourceGroup is the id of the resource group the create named ("": the account's default).
	ResourceGroup string
	// PrimaryIP is the network interface's address ("0.0.0.0" until the VM runs).
	PrimaryIP string
	CreatedAt time.Time
}

// FloatingIP is a floating IP as the stand-in keeps it.
type FloatingIP struct {
	ID, Name, Address, Zone string
	// Target is the id of the network interface it is bound to; "" when unbound.
	Target string
}

// Server is a running VPC API.
type Server struct {
	opts Options
	srv  *http.Server
	url  string

	vpc    resource
	subnet resource
	keys   []resource

	mu        sync.Mutex
	instances map[string]*instance
	order     []string // instance ids in creation order
	fips      map[string]*floatingIP
	fipOrder  []string
	addrs     int // private addresses handed out
	requests  int
	// Faults armed for the next calls.
	failures       int
	throttles      int
	throttleAfter  time.Duration
	throttledUntil time.Time
}

type resource struct{ ID, CRN, Name string }

type instance struct {
	Instance
	capacityFailed bool
	fipAddress     string
}

type floatingIP struct {
	FloatingIP
	CreatedAt time.Time
}

// New starts the API over a cloud; Close stops it (the cloud stays).
func New(opts Options) (*Server, error) {
	if opts.Machines == nil || opts.IAM == nil {
		return nil, errors.New("vpcfake: Options.Machines and Options.IAM are required")
	}
	if opts.Region == "" {
		opts.Region = DefaultRegion
	}
	if opts.Zone == "" {
		opts.Zone = opts.Region + "-1"
	}
	if opts.VPC == "" {
		opts.VPC = DefaultVPC
	}
	if opts.Subnet == "" {
		opts.Subnet = DefaultSubnet
	}
	if len(opts.Keys) == 0 {
		opts.Keys = []string{DefaultKey}
	}
	if len(opts.Images) == 0 {
		opts.Images = []string{DefaultImage}
	}
	if len(opts.Profiles) == 0 {
		opts.Profiles = []string{DefaultProfile}
	}
	if opts.PageLimit <= 0 {
		opts.PageLimit = 50
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("vpcfake: listen: %w", err)
	}
	s := &Server{
		opts:      opts,
		url:       "http://" + ln.Addr().String() + "/v1",
		instances: map[string]*instance{},
		fips:      map[string]*floatingIP{},
	}
	s.vpc = s.newResource("vpc", opts.VPC)
	s.subnet = s.newResource("subnet", opts.Subnet)
	for _, k := range opts.Keys {
		s.keys = append(s.keys, s.newResource("key", k))
	}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

// NewForTest starts the API for t and closes it when t ends.
func NewForTest(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// URL is the API's endpoint, ending in /v1, as the SDK's URL setting takes it.
func (s *Server) URL() string { return s.url }

// Close stops the API.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
}

// Options returns the options the server runs with, defaults filled in.
func (s *Server) Options() Options { return s.opts }

// --- Faults ---

// Fail makes the next n API calls (with a valid token) answer 500.
func (s *Server) Fail(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = n
}

// Throttle makes the next n API calls answer 429 with Retry-After: retryAfter (whole
// seconds, rounded up); a call that comes before the wait is over is throttled again.
func (s *Server) Throttle(n int, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttles, s.throttleAfter = n, retryAfter
}

// FailLaunches makes the next n new instances fail for want of capacity.
func (s *Server) FailLaunches(n int) { s.opts.Machines.FailLaunches(n) }

// SetQuota sets how many instances may run at once; creates beyond it answer over_quota.
func (s *Server) SetQuota(n int) { s.opts.Machines.SetQuota(n) }

// SetBootDelay sets how long new instances stay pending; a long one leaves them stuck.
func (s *Server) SetBootDelay(d time.Duration) { s.opts.Machines.SetBootDelay(d) }

// RevokeCredentials makes IAM forget every API key and token, as when keys are deleted.
func (s *Server) RevokeCredentials() { s.opts.IAM.RevokeAll() }

// DeleteInstance deletes an instance as someone in the console would, behind berth's back:
// its machine stops, the API forgets it, and its floating IP stays, unbound.
func (s *Server) DeleteInstance(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.instances[id]; !ok {
		return fmt.Errorf("vpcfake: no instance %s", id)
	}
	s.deleteInstance(id)
	return nil
}

// StopInstance stops an instance as someone in the console would: the VPC keeps it, stopped,
// with its volumes and floating IP, until it is deleted.
func (s *Server) StopInstance(id string) error {
	s.mu.Lock()
	in := s.instances[id]
	s.mu.Unlock()
	if in == nil {
		return fmt.Errorf("vpcfake: no instance %s", id)
	}
	return s.opts.Machines.Stop(in.MachineID)
}

// --- Introspection ---

// Instances returns the instances the API knows, in creation order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Instance
	for _, id := range s.order {
		if in := s.refresh(id); in != nil {
			out = append(out, in.Instance)
		}
	}
	return out
}

// FloatingIPs returns the floating IPs that exist.
func (s *Server) FloatingIPs() []FloatingIP {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []FloatingIP
	for _, id := range s.fipOrder {
		out = append(out, s.fips[id].FloatingIP)
	}
	return out
}

// Requests is how many API calls were made, refused ones included.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// --- Wire ---

type apiError struct {
	Code     string       `json:"code"`
	Message  string       `json:"message"`
	MoreInfo string       `json:"more_info"`
	Target   *errorTarget `json:"target,omitempty"`
}

type errorTarget struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Value string `json:"value,omitempty"`
}

type errorBody struct {
	Errors     []apiError `json:"errors"`
	Trace      string     `json:"trace"`
	StatusCode int        `json:"status_code"`
}

// failure is an error answer under way.
type failure struct {
	status int
	err    apiError
}

func fail(status int, code, message string) *failure {
	return &failure{status, apiError{Code: code, Message: message, MoreInfo: "https://cloud.ibm.com/docs/vpc?topic=vpc-rias-error-messages#" + strings.ReplaceAll(code, "_", "-")}}
}

func fieldFail(code, field, message string) *failure {
	f := fail(http.StatusBadRequest, code, message)
	f.err.Target = &errorTarget{Name: field, Type: "field"}
	return f
}

var (
	versionRe = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}$`)
	// nameRe is the API's rule for resource names.
	nameRe = regexp.MustCompile(`^-?([a-z]|[a-z][-a-z0-9]*[a-z0-9]|[0-9][-a-z0-9]*([a-z]|[-a-z0-9]*[a-z0-9]))$`)
)

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	if f := s.admit(w, r); f != nil {
		s.writeFailure(w, f)
		return
	}
	path, ok := strings.CutPrefix(r.URL.Path, "/v1/")
	if !ok {
		s.writeFailure(w, fail(http.StatusNotFound, "not_found", "no such path "+r.URL.Path))
		return
	}
	collection, id, _ := strings.Cut(path, "/")
	var (
		status = http.StatusOK
		body   any
		f      *failure
	)
	switch {
	case collection == "vpcs" && id == "" && r.Method == http.MethodGet:
		body, f = s.listResources(r, "vpcs", []resource{s.vpc}, s.vpcJSON)
	case collection == "subnets" && id == "" && r.Method == http.MethodGet:
		body, f = s.listResources(r, "subnets", []resource{s.subnet}, s.subnetJSON)
	case collection == "keys" && id == "" && r.Method == http.MethodGet:
		body, f = s.listResources(r, "keys", s.keys, s.keyJSON)
	case collection == "instances" && id == "" && r.Method == http.MethodPost:
		status = http.StatusCreated
		body, f = s.createInstance(r)
	case collection == "instances" && id == "" && r.Method == http.MethodGet:
		body, f = s.listInstances(r)
	case collection == "instances" && id != "" && r.Method == http.MethodGet:
		body, f = s.getInstance(id)
	case collection == "instances" && id != "" && r.Method == http.MethodDelete:
		status, f = http.StatusNoContent, s.removeInstance(id)
	case collection == "floating_ips" && id == "" && r.Method == http.MethodPost:
		status = http.StatusCreated
		body, f = s.createFloatingIP(r)
	case collection == "floating_ips" && id == "" && r.Method == http.MethodGet:
		body, f = s.listFloatingIPs(r)
	case collection == "floating_ips" && id != "" && r.Method == http.MethodGet:
		body, f = s.getFloatingIP(id)
	case collection == "floating_ips" && id != "" && r.Method == http.MethodDelete:
		status, f = http.StatusNoContent, s.removeFloatingIP(id)
	default:
		f = fail(http.StatusNotFound, "not_found", "no such operation: "+r.Method+" "+r.URL.Path)
	}
	if f != nil {
		s.writeFailure(w, f)
		return
	}
	if body == nil {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// admit checks what every call needs and applies armed faults.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) *failure {
	q := r.URL.Query()
	if v := q.Get("version"); !versionRe.MatchString(v) {
		f := fail(http.StatusBadRequest, "bad_request", "the version query parameter is required, as a date like 2024-04-30")
		f.err.Target = &errorTarget{Name: "version", Type: "parameter", Value: v}
		return f
	}
	if g := q.Get("generation"); g != "2" {
		f := fail(http.StatusBadRequest, "bad_request", "the generation query parameter must be 2")
		f.err.Target = &errorTarget{Name: "generation", Type: "parameter", Value: g}
		return f
	}
	if !s.opts.IAM.Valid(r.Header.Get("Authorization")) {
		return fail(http.StatusUnauthorized, "not_authorized", "The request is not authorized.")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.throttles > 0 || now.Before(s.throttledUntil) {
		if s.throttles > 0 {
			s.throttles--
		}
		secs := int(math.Ceil(s.throttleAfter.Seconds()))
		if now.After(s.throttledUntil) {
			s.throttledUntil = now.Add(time.Duration(secs) * time.Second)
		}
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		return fail(http.StatusTooManyRequests, "too_many_requests", "too many requests; retry later")
	}
	if s.failures > 0 {
		s.failures--
		return fail(http.StatusInternalServerError, "internal_error", "an internal error occurred; try again")
	}
	return nil
}

func (s *Server) writeFailure(w http.ResponseWriter, f *failure) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.status)
	json.NewEncoder(w).Encode(errorBody{Errors: []apiError{f.err}, Trace: newID("trace"), StatusCode: f.status})
}

func (s *Server) newResource(kind, name string) resource {
	id := "r014-" + newUUID()
	return resource{ID: id, CRN: "crn:v1:bluemix:public:is:" + s.opts.Region + ":a/berth::" + kind + ":" + id, Name: name}
}

func (s *Server) href(parts ...string) string { return s.url + "/" + strings.Join(parts, "/") }

type ref struct {
	ID           string `json:"id,omitempty"`
	CRN          string `json:"crn,omitempty"`
	Href         string `json:"href,omitempty"`
	Name         string `json:"name,omitempty"`
	Address      string `json:"address,omitempty"`
	ResourceType string `json:"resource_type,omitempty"`
}

var resourceGroup = map[string]string{"id": "fee82deba12e4c0fb69c3b09d1f12345", "href": "https://resource-controller.cloud.ibm.com/v2/resource_groups/fee82deba12e4c0fb69c3b09d1f12345", "name": "Default"}

func (s *Server) vpcJSON(r resource) any {
	return map[string]any{"id": r.ID, "crn": r.CRN, "href": s.href("vpcs", r.ID), "name": r.Name, "status": "available", "resource_type": "vpc", "resource_group": resourceGroup, "created_at": time.Now().UTC().Format(time.RFC3339)}
}

func (s *Server) subnetJSON(r resource) any {
	return map[string]any{"id": r.ID, "crn": r.CRN, "href": s.href("subnets", r.ID), "name": r.Name, "status": "available", "resource_type": "subnet",
		"ipv4_cidr_block": "198.19.0.0/16", "zone": s.zoneRef(), "vpc": s.vpcRef(), "resource_group": resourceGroup}
}

func (s *Server) keyJSON(r resource) any {
	return map[string]any{"id": r.ID, "crn": r.CRN, "href": s.href("keys", r.ID), "name": r.Name, "type": "ed25519", "length": 256, "resource_group": resourceGroup}
}

func (s *Server) zoneRef() ref {
	return ref{Name: s.opts.Zone, Href: s.href("regions", s.opts.Region, "zones", s.opts.Zone)}
}

func (s *Server) vpcRef() ref {
	return ref{ID: s.vpc.ID, CRN: s.vpc.CRN, Href: s.href("vpcs", s.vpc.ID), Name: s.vpc.Name, ResourceType: "vpc"}
}

// page answers one page of a list, the way the API pages: ids cut at the start token and the
// limit, each rendered under kind, with first and next links (the next one carries the start
// token of the next page).
func (s *Server) page(r *http.Request, ids []string, kind string, render func(id string) any) (any, *failure) {
	q := r.URL.Query()
	limit := s.opts.PageLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			f := fail(http.StatusBadRequest, "bad_request", "limit must be between 1 and 100")
			f.err.Target = &errorTarget{Name: "limit", Type: "parameter", Value: v}
			return nil, f
		}
		limit = n
	}
	from := 0
	if start := q.Get("start"); start != "" {
		from = slices.Index(ids, start)
		if from < 0 {
			f := fail(http.StatusBadRequest, "bad_request", "the start token is not valid")
			f.err.Target = &errorTarget{Name: "start", Type: "parameter", Value: start}
			return nil, f
		}
	}
	base := *r.URL
	first := base.Query()
	first.Del("start")
	base.RawQuery = first.Encode()
	paging := map[string]any{"limit": limit, "total_count": len(ids), "first": map[string]string{"href": s.url + strings.TrimPrefix(base.String(), "/v1")}}
	to := min(from+limit, len(ids))
	if to < len(ids) {
		next := base.Query()
		next.Set("start", ids[to])
		base.RawQuery = next.Encode()
		paging["next"] = map[string]string{"href": s.url + strings.TrimPrefix(base.String(), "/v1")}
	}
	items := []any{}
	for _, id := range ids[from:to] {
		items = append(items, render(id))
	}
	paging[kind] = items
	return paging, nil
}

func (s *Server) listResources(r *http.Request, kind string, all []resource, render func(resource) any) (any, *failure) {
	ids := make([]string, len(all))
	for i, res := range all {
		ids[i] = res.ID
	}
	return s.page(r, ids, kind, func(id string) any { return render(all[slices.Index(ids, id)]) })
}

// identity is any of the API's "identity" shapes: by id, by name, by CRN or by href.
type identity struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	CRN  string `json:"crn"`
	Href string `json:"href"`
}

type instancePrototype struct {
	Name                    *string    `json:"name"`
	Image                   *identity  `json:"image"`
	Profile                 *identity  `json:"profile"`
	Zone                    *identity  `json:"zone"`
	VPC                     *identity  `json:"vpc"`
	ResourceGroup           *identity  `json:"resource_group"`
	Keys                    []identity `json:"keys"`
	PrimaryNetworkInterface *struct {
		Name   string    `json:"name"`
		Subnet *identity `json:"subnet"`
	} `json:"primary_network_interface"`
	BootVolumeAttachment *struct {
		Volume *struct {
			Capacity *int64    `json:"capacity"`
			Profile  *identity `json:"profile"`
		} `json:"volume"`
	} `json:"boot_volume_attachment"`
}

func (s *Server) createInstance(r *http.Request) (any, *failure) {
	var p instancePrototype
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err := dec.Decode(&p); err != nil {
		return nil, fail(http.StatusBadRequest, "bad_request", "the body is not an instance prototype: "+err.Error())
	}
	in, f := s.validate(p)
	if f != nil {
		return nil, f
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range s.order {
		if other := s.refresh(id); other != nil && other.Name == in.Name {
			f := fieldFail("validation_unique_failed", "name", "Provided Name ("+in.Name+") is not unique")
			f.err.Target.Value = in.Name
			return nil, f
		}
	}
	in.ID = "0757_" + newUUID()
	in.NetworkInterfaceID = "0757-" + newUUID()
	in.CreatedAt = time.Now().UTC().Truncate(time.Second)
	in.PrimaryIP = "0.0.0.0"
	vm, _, err := s.opts.Machines.Launch(in.ID, in.Name, nil)
	switch {
	case errors.Is(err, vmcloud.ErrQuota):
		return nil, fail(http.StatusBadRequest, "over_quota", "The instance cannot be created: the account's quota of instances is used up.")
	case errors.Is(err, vmcloud.ErrCapacity):
		// The real API accepts the create and fails the instance when no host can take it.
		in.capacityFailed = true
	case err != nil:
		return nil, fail(http.StatusInternalServerError, "internal_error", err.Error())
	default:
		in.MachineID = vm.ID
	}
	in.Status = "pending"
	s.instances[in.ID] = in
	s.order = append(s.order, in.ID)
	return s.instanceJSON(in), nil
}

func (s *Server) validate(p instancePrototype) (*instance, *failure) {
	in := &instance{}
	if p.Name != nil {
		if len(*p.Name) > 63 || !nameRe.MatchString(*p.Name) {
			f := fieldFail("validation_invalid_name", "name", "The value is not a valid name: lowercase letters, digits and dashes, at most 63, starting with a letter")
			f.err.Target.Value = *p.Name
			return nil, f
		}
		in.Name = *p.Name
	} else {
		in.Name = "instance-" + newID("")[:12]
	}
	switch {
	case p.Image == nil || p.Image.ID == "":
		return nil, fieldFail("validation_required_field", "image", "Missing a required field: image (by id).")
	case !slices.Contains(s.opts.Images, p.Image.ID):
		return nil, fieldFail("bad_field", "image.id", "No image "+p.Image.ID+" in this region.")
	case p.Profile == nil || p.Profile.Name == "":
		return nil, fieldFail("validation_required_field", "profile", "Missing a required field: profile (by name).")
	case !slices.Contains(s.opts.Profiles, p.Profile.Name):
		return nil, fieldFail("bad_field", "profile.name", "No instance profile "+p.Profile.Name+".")
	case p.Zone == nil || p.Zone.Name == "":
		return nil, fieldFail("validation_required_field", "zone", "Missing a required field: zone (by name).")
	case p.Zone.Name != s.opts.Zone:
		return nil, fieldFail("bad_field", "zone.name", "The subnet is in zone "+s.opts.Zone+", not "+p.Zone.Name+".")
	case p.PrimaryNetworkInterface == nil || p.PrimaryNetworkInterface.Subnet == nil:
		return nil, fieldFail("validation_required_field", "primary_network_interface.subnet", "Missing a required field: primary_network_interface.subnet.")
	case p.PrimaryNetworkInterface.Subnet.ID != s.subnet.ID:
		return nil, fieldFail("bad_field", "primary_network_interface.subnet.id", "No subnet "+p.PrimaryNetworkInterface.Subnet.ID+".")
	case p.ResourceGroup != nil && p.ResourceGroup.ID != resourceGroup["id"]:
		return nil, fieldFail("bad_field", "resource_group.id", "No resource group "+p.ResourceGroup.ID+".")
	case p.VPC != nil && p.VPC.ID != s.vpc.ID:
		return nil, fieldFail("bad_field", "vpc.id", "The subnet is not in VPC "+p.VPC.ID+".")
	case len(p.Keys) == 0:
		return nil, fieldFail("validation_required_field", "keys", "Missing a required field: keys (an instance from a Linux image needs one).")
	}
	for _, k := range p.Keys {
		i := slices.IndexFunc(s.keys, func(r resource) bool { return r.ID == k.ID })
		if i < 0 {
			return nil, fieldFail("bad_field", "keys[].id", "No key "+k.ID+".")
		}
		in.Keys = append(in.Keys, s.keys[i].Name)
	}
	if b := p.BootVolumeAttachment; b != nil {
		if b.Volume == nil || b.Volume.Profile == nil || b.Volume.Profile.Name == "" {
			return nil, fieldFail("validation_required_field", "boot_volume_attachment.volume.profile", "Missing a required field: boot_volume_attachment.volume.profile.")
		}
		if c := b.Volume.Capacity; c != nil {
			if *c < 10 || *c > 250 {
				return nil, fieldFail("bad_field", "boot_volume_attachment.volume.capacity", "A boot volume's capacity must be between 10 and 250 GB.")
			}
			in.BootVolumeGB = *c
		}
		in.BootVolumeProfile = b.Volume.Profile.Name
	}
	in.VPC, in.Zone, in.Profile, in.Image, in.Subnet = s.vpc.Name, p.Zone.Name, p.Profile.Name, p.Image.ID, s.subnet.Name
	if p.ResourceGroup != nil {
		in.ResourceGroup = p.ResourceGroup.ID
	}
	return in, nil
}

// refresh brings an instance's status up to date with its machine and returns it; nil when
// the API no longer knows it (its machine vanished or was ended outside the API). The caller
// holds mu.
func (s *Server) refresh(id string) *instance {
	in := s.instances[id]
	if in == nil {
		return nil
	}
	if in.capacityFailed {
		in.Status, in.StatusReason = "failed", "cannot_start_capacity"
		return in
	}
	vm, ok := s.opts.Machines.Instance(in.MachineID)
	if !ok || vm.Vanished || (vm.State == vmcloud.Gone && !strings.HasPrefix(vm.Reason, "boot failed")) {
		s.forget(id)
		return nil
	}
	switch vm.State {
	case vmcloud.Pending:
		in.Status = "pending"
	case vmcloud.Running:
		in.Status = "running"
		if in.PrimaryIP == "0.0.0.0" {
			in.PrimaryIP = vm.Address
			if s.boundFIP(in.NetworkInterfaceID) != nil {
				in.PrimaryIP = s.privateAddress()
			}
		}
	case vmcloud.Stopped:
		in.Status = "stopped"
	default:
		in.Status, in.StatusReason = "failed", "cannot_start"
	}
	return in
}

// privateAddress hands out an address in the subnet that nothing answers at: with a floating
// IP the VM is reached at the floating address. The caller holds mu.
func (s *Server) privateAddress() string {
	s.addrs++
	return fmt.Sprintf("198.19.%d.%d", 200+s.addrs/250, 1+s.addrs%250)
}

func (s *Server) boundFIP(nic string) *floatingIP {
	for _, id := range s.fipOrder {
		if f := s.fips[id]; f.Target == nic {
			return f
		}
	}
	return nil
}

func (s *Server) instanceJSON(in *instance) any {
	nic := map[string]any{
		"id": in.NetworkInterfaceID, "href": s.href("instances", in.ID, "network_interfaces", in.NetworkInterfaceID),
		"name": "eth0", "resource_type": "network_interface",
		"primary_ip": map[string]any{"address": in.PrimaryIP, "href": s.href("subnets", s.subnet.ID, "reserved_ips", in.NetworkInterfaceID), "id": in.NetworkInterfaceID, "name": in.Name + "-ip", "resource_type": "subnet_reserved_ip"},
		"subnet":     ref{ID: s.subnet.ID, CRN: s.subnet.CRN, Href: s.href("subnets", s.subnet.ID), Name: s.subnet.Name, ResourceType: "subnet"},
	}
	reasons := []any{}
	if in.StatusReason != "" {
		reasons = append(reasons, map[string]string{"code": in.StatusReason, "message": "The instance could not start: " + strings.ReplaceAll(in.StatusReason, "_", " ") + "."})
	}
	volID := "r014-vol-" + in.ID
	return map[string]any{
		"id": in.ID, "crn": "crn:v1:bluemix:public:is:" + in.Zone + ":a/berth::instance:" + in.ID, "href": s.href("instances", in.ID),
		"name": in.Name, "created_at": in.CreatedAt.Format(time.RFC3339), "status": in.Status, "status_reasons": reasons,
		"lifecycle_state": "stable", "resource_type": "instance", "startable": true,
		"zone": s.zoneRef(), "vpc": s.vpcRef(), "resource_group": resourceGroup,
		"profile": ref{Name: in.Profile, Href: s.href("instance", "profiles", in.Profile), ResourceType: "instance_profile"},
		"image":   ref{ID: in.Image, CRN: "crn:v1:bluemix:public:is:" + s.opts.Region + ":a/berth::image:" + in.Image, Href: s.href("images", in.Image), ResourceType: "image"},
		"vcpu":    map[string]any{"architecture": "s390x", "count": 2, "manufacturer": "ibm"}, "memory": 8, "bandwidth": 4000,
		"primary_network_interface": nic, "network_interfaces": []any{nic},
		"boot_volume_attachment": map[string]any{"id": "att-" + in.ID, "href": s.href("instances", in.ID, "volume_attachments", "att-"+in.ID), "name": "boot",
			"volume": ref{ID: volID, CRN: "crn:v1:bluemix:public:is:" + in.Zone + ":a/berth::volume:" + volID, Href: s.href("volumes", volID), Name: in.Name + "-boot", ResourceType: "volume"}},
	}
}

func (s *Server) listInstances(r *http.Request) (any, *failure) {
	q := r.URL.Query()
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, id := range slices.Clone(s.order) {
		in := s.refresh(id)
		switch {
		case in == nil:
		case q.Has("name") && in.Name != q.Get("name"):
		case q.Has("vpc.id") && q.Get("vpc.id") != s.vpc.ID:
		case q.Has("vpc.name") && q.Get("vpc.name") != s.vpc.Name:
		default:
			ids = append(ids, id)
		}
	}
	return s.page(r, ids, "instances", func(id string) any { return s.instanceJSON(s.instances[id]) })
}

func (s *Server) getInstance(id string) (any, *failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.refresh(id)
	if in == nil {
		return nil, fail(http.StatusNotFound, "not_found", "Instance not found: "+id)
	}
	return s.instanceJSON(in), nil
}

func (s *Server) removeInstance(id string) *failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refresh(id) == nil {
		return fail(http.StatusNotFound, "not_found", "Instance not found: "+id)
	}
	s.deleteInstance(id)
	return nil
}

// deleteInstance ends an instance's machine and forgets it; a floating IP bound to it stays,
// unbound, as in the real API. The caller holds mu.
func (s *Server) deleteInstance(id string) {
	if in := s.instances[id]; in.MachineID != "" {
		s.opts.Machines.Terminate(in.MachineID) // ErrNotFound: its machine is gone already
	}
	s.forget(id)
}

// forget drops an instance from the API's view. The caller holds mu.
func (s *Server) forget(id string) {
	in := s.instances[id]
	if f := s.boundFIP(in.NetworkInterfaceID); f != nil {
		f.Target = ""
	}
	delete(s.instances, id)
	s.order = slices.DeleteFunc(s.order, func(o string) bool { return o == id })
}

type floatingIPPrototype struct {
	Name   *string   `json:"name"`
	Zone   *identity `json:"zone"`
	Target *identity `json:"target"`
}

func (s *Server) createFloatingIP(r *http.Request) (any, *failure) {
	var p floatingIPPrototype
	if err := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<16)).Decode(&p); err != nil {
		return nil, fail(http.StatusBadRequest, "bad_request", "the body is not a floating IP prototype: "+err.Error())
	}
	if p.Zone == nil && p.Target == nil {
		return nil, fieldFail("validation_required_field", "target", "Missing a required field: a floating IP needs a zone or a target.")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fip := &floatingIP{FloatingIP: FloatingIP{ID: "r014-" + newUUID(), Zone: s.opts.Zone}, CreatedAt: time.Now().UTC().Truncate(time.Second)}
	if p.Name != nil {
		if len(*p.Name) > 63 || !nameRe.MatchString(*p.Name) {
			return nil, fieldFail("validation_invalid_name", "name", "The value is not a valid name.")
		}
		fip.Name = *p.Name
	} else {
		fip.Name = "fip-" + newID("")[:12]
	}
	for _, id := range s.fipOrder {
		if s.fips[id].Name == fip.Name {
			f := fieldFail("validation_unique_failed", "name", "Provided Name ("+fip.Name+") is not unique")
			f.err.Target.Value = fip.Name
			return nil, f
		}
	}
	if p.Target != nil {
		var owner *instance
		for _, id := range s.order {
			if in := s.refresh(id); in != nil && in.NetworkInterfaceID == p.Target.ID {
				owner = in
			}
		}
		switch {
		case owner == nil:
			return nil, fieldFail("bad_field", "target.id", "No network interface "+p.Target.ID+".")
		case s.boundFIP(p.Target.ID) != nil:
			return nil, fieldFail("bad_field", "target.id", "The network interface has a floating IP already.")
		}
		fip.Target = p.Target.ID
		if owner.PrimaryIP != "0.0.0.0" {
			// Running already: the reachable address moves to the floating IP.
			fip.Address, owner.PrimaryIP = owner.PrimaryIP, s.privateAddress()
		}
	} else if p.Zone.Name != s.opts.Zone {
		return nil, fieldFail("bad_field", "zone.name", "No zone "+p.Zone.Name+" here.")
	}
	if fip.Address == "" {
		fip.Address = s.privateAddress()
	}
	s.fips[fip.ID] = fip
	s.fipOrder = append(s.fipOrder, fip.ID)
	return s.fipJSON(fip), nil
}

// address is what the floating IP answers at: the VM behind it, once it runs. The caller
// holds mu.
func (s *Server) address(fip *floatingIP) string {
	for _, id := range s.order {
		in := s.refresh(id)
		if in == nil || in.NetworkInterfaceID != fip.Target || in.Status != "running" {
			continue
		}
		if vm, ok := s.opts.Machines.Instance(in.MachineID); ok && vm.Address != "" {
			fip.Address = vm.Address
		}
	}
	return fip.Address
}

func (s *Server) fipJSON(f *floatingIP) any {
	out := map[string]any{
		"id": f.ID, "crn": "crn:v1:bluemix:public:is:" + f.Zone + ":a/berth::floating-ip:" + f.ID, "href": s.href("floating_ips", f.ID),
		"name": f.Name, "address": s.address(f), "created_at": f.CreatedAt.Format(time.RFC3339),
		"status": "available", "zone": s.zoneRef(), "resource_group": resourceGroup,
	}
	if f.Target != "" {
		for _, id := range s.order {
			if in := s.instances[id]; in.NetworkInterfaceID == f.Target {
				out["target"] = map[string]any{"id": f.Target, "href": s.href("instances", in.ID, "network_interfaces", f.Target), "name": "eth0",
					"resource_type": "network_interface", "primary_ip": map[string]any{"address": in.PrimaryIP}}
			}
		}
	}
	return out
}

func (s *Server) listFloatingIPs(r *http.Request) (any, *failure) {
	q := r.URL.Query()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range slices.Clone(s.order) {
		s.refresh(id) // unbinds the floating IPs of instances gone behind the API's back
	}
	var ids []string
	for _, id := range s.fipOrder {
		if q.Has("target.id") && s.fips[id].Target != q.Get("target.id") {
			continue
		}
		ids = append(ids, id)
	}
	return s.page(r, ids, "floating_ips", func(id string) any { return s.fipJSON(s.fips[id]) })
}

func (s *Server) getFloatingIP(id string) (any, *failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fips[id]
	if f == nil {
		return nil, fail(http.StatusNotFound, "not_found", "Floating IP not found: "+id)
	}
	return s.fipJSON(f), nil
}

func (s *Server) removeFloatingIP(id string) *failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fips[id] == nil {
		return fail(http.StatusNotFound, "not_found", "Floating IP not found: "+id)
	}
	delete(s.fips, id)
	s.fipOrder = slices.DeleteFunc(s.fipOrder, func(o string) bool { return o == id })
	return nil
}

func newID(prefix string) string {
	b := make([]byte, 16)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func newUUID() string {
	h := newID("")
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
