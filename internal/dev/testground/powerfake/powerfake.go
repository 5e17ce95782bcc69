//go:build linux

// Package powerfake is a stand-in for the IBM Power Virtual Server API, the part of it that
// power-go-client's instance client calls for berth's ibmp provider, on the real paths and
// with the real JSON shapes (power-go-client's models):
//
//	GET    /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances       → 200 {"pvmInstances":[...]}
//	POST   /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances       → 201 [instance]
//	GET    /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances/{id}  → 200 instance
//	DELETE /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances/{id}  → 200 {}
//	GET    /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances/{id}/volumes → 200 {"volumes":[...]}
//	PUT    /pcloud/v1/cloud-instances/{cloud_instance_id}/volumes/{volume_id} → 200 volume
//
// Every call needs "Authorization: Bearer <token>" with a token the IAM stand-in issued (401
// otherwise) and the CRN header of the workspace (403 otherwise). Failures answer Power VS's
// error body {"code","description","error","message"}. The machines behind the instances,
// and their faults (capacity, quota, slow or failed boots, vanishing), are a vmcloud.Cloud's;
// this keeps Power VS's view: instance ids, names, networks and statuses (BUILD while the
// machine is pending, ACTIVE while it runs, ERROR when its boot failed, SHUTOFF once stopped
// with Shutoff), and each instance's boot volume ("creating" while the instance builds, then
// "in-use"; "extending" while a resize is held with HoldResizes). A resize must ask for more
// than the volume's size (400 otherwise, as Power VS refuses to shrink a volume) and meets a
// 409 while an earlier one is under way.
//
// It is a test ground: only tests, the dev stack and the bench link it, never the controller.
package powerfake

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM-Cloud/power-go-client/power/models"
	"github.com/go-openapi/strfmt"

	"github.com/berth-ci/berth/internal/dev/testground/iamfake"
	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// Options configure a Server.
type Options struct {
	// Machines runs the instances' machines. Required.
	Machines *vmcloud.Cloud
	// IAM issues the bearer tokens calls must carry. Required.
	IAM *iamfake.Server
	// CloudInstanceID is the workspace's id (a GUID); a random one when empty.
	CloudInstanceID string
	// Zone and Account go into the workspace's CRN; wdc06 and a random account when empty.
	Zone, Account string
	// Networks, Images and Keys are what the workspace has; a create may name a network or
	// an image by id or by name, a key pair by name. At least one network and one image.
	Networks []Network
	Images   []Resource
	Keys     []string
	// SysTypes are the system types a create may ask for; s922, e980 and e1080 when empty.
	SysTypes []string
	// BootSize is the size in GB of the boot volume an instance gets from its image; 100
	// when 0.
	BootSize float64
	// Addr is where the API listens; 127.0.0.1:0 (a free port) when empty.
	Addr string
}

// Resource is an image of the workspace.
type Resource struct{ ID, Name string }

// Network is a network of the workspace. On an External (public) network an instance has
// an externalIP, which is its machine's address, and an ipAddress in 198.19.255.0/24 that
// nothing answers at, as a public network's private side is reached from nowhere berth is;
// on a private one its ipAddress is its machine's address.
type Network struct {
	ID, Name string
	External bool
}

// Server is a running Power VS API stand-in for one workspace.
type Server struct {
	opts Options
	crn  string
	url  string
	srv  *http.Server

	mu        sync.Mutex
	instances map[string]*pvm // by pvm-instance id
	order     []*pvm
	creates   []models.PVMInstanceCreate
	volumes   map[string]*volume // boot volumes by volume id
	resizes   []Resize
	// internal counts the private addresses given on external networks.
	internal int
	// Faults armed for the next calls.
	failures      int
	throttles     int
	throttleAfter time.Duration
	loseCreates   int
	failResizes   int
	loseResizes   int
	holdResizes   bool
}

type pvm struct {
	id, vmID, name string
	body           models.PVMInstanceCreate
	created        time.Time
	boot           *volume
	shutoff        bool
	// internalIP is its ipAddress when its first network is external.
	internalIP string
}

type volume struct {
	id, name string
	owner    *pvm
	size     float64
	// extendTo is the size a held resize grows the volume to; 0 when none is under way.
	extendTo float64
}

// Resize is a resize of a boot volume the API accepted.
type Resize struct {
	VolumeID, InstanceID string
	From, To             float64
}

// Instance is an instance as the workspace keeps it.
type Instance struct {
	ID, Name string
	// VMID is the vmcloud instance behind it.
	VMID string
	// Create is the request that made it.
	Create models.PVMInstanceCreate
	// BootVolumeID and BootSize are its boot volume's id and size in GB now.
	BootVolumeID string
	BootSize     float64
	// Networks are its networks with their addresses, as the API shows them now.
	Networks []models.PVMInstanceNetwork
}

// New starts a stand-in serving one workspace over machines; Close stops it (the machines
// stay the Cloud's).
func New(opts Options) (*Server, error) {
	if opts.Machines == nil || opts.IAM == nil {
		return nil, errors.New("powerfake: Options.Machines and Options.IAM are required")
	}
	if len(opts.Networks) == 0 || len(opts.Images) == 0 {
		return nil, errors.New("powerfake: the workspace needs at least one network and one image")
	}
	if opts.CloudInstanceID == "" {
		opts.CloudInstanceID = uuid()
	}
	if opts.Zone == "" {
		opts.Zone = "wdc06"
	}
	if opts.Account == "" {
		opts.Account = strings.ReplaceAll(uuid(), "-", "")
	}
	if len(opts.SysTypes) == 0 {
		opts.SysTypes = []string{"s922", "e980", "e1080"}
	}
	if opts.BootSize == 0 {
		opts.BootSize = 100
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("powerfake: listen: %w", err)
	}
	s := &Server{
		opts:      opts,
		crn:       fmt.Sprintf("crn:v1:bluemix:public:power-iaas:%s:a/%s:%s::", opts.Zone, opts.Account, opts.CloudInstanceID),
		url:       "http://" + ln.Addr().String(),
		instances: map[string]*pvm{},
		volumes:   map[string]*volume{},
	}
	s.srv = &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

// NewForTest starts a stand-in for t and closes it when t ends.
func NewForTest(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// URL is the API's endpoint, like http://127.0.0.1:40123: the ibmp platform's url key.
func (s *Server) URL() string { return s.url }

// CRN is the workspace's CRN: the ibmp platform's crn key.
func (s *Server) CRN() string { return s.crn }

// CloudInstanceID is the workspace's id.
func (s *Server) CloudInstanceID() string { return s.opts.CloudInstanceID }

// Close stops the API.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
}

// --- Faults (capacity, quota, boots and vanishing are the Machines' own) ---

// FailNext makes the next n authenticated calls answer 500.
func (s *Server) FailNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures = n
}

// Throttle makes the next n authenticated calls answer 429 with Retry-After: retryAfter,
// rounded up to whole seconds.
func (s *Server) Throttle(n int, retryAfter time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttles, s.throttleAfter = n, retryAfter
}

// LoseCreateAnswers makes the next n creates make their instance and then answer 504, as
// when a gateway gives up on the API before it answers.
func (s *Server) LoseCreateAnswers(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseCreates = n
}

// FailResizes makes the next n resizes answer 500 without resizing.
func (s *Server) FailResizes(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failResizes = n
}

// LoseResizeAnswers makes the next n resizes resize and then answer 504, as when a gateway
// gives up on the API before it answers.
func (s *Server) LoseResizeAnswers(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseResizes = n
}

// HoldResizes, while hold is true, leaves the volumes of accepted resizes "extending" at their
// old size, as a resize under way; HoldResizes(false) completes them.
func (s *Server) HoldResizes(hold bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holdResizes = hold
	if hold {
		return
	}
	for _, v := range s.volumes {
		if v.extendTo > 0 {
			v.size, v.extendTo = v.extendTo, 0
		}
	}
}

// Shutoff stops an instance as its owner would from the console: Power VS keeps it (and
// bills it), SHUTOFF and without addresses, until it is deleted. Its machine stands for
// what Power VS holds and stays until then.
func (s *Server) Shutoff(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.instances[id]
	if p == nil || s.vanished(p) {
		return fmt.Errorf("powerfake: no instance %s", id)
	}
	p.shutoff = true
	return nil
}

// Delete deletes an instance as someone else would, behind berth's back: its machine ends
// and the API knows it no more.
func (s *Server) Delete(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.forget(id) {
		return fmt.Errorf("powerfake: no instance %s", id)
	}
	return nil
}

// --- Introspection ---

// Instances returns the instances the workspace has now, in creation order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, 0, len(s.order))
	for _, p := range s.order {
		inst := Instance{ID: p.id, Name: p.name, VMID: p.vmID, Create: p.body, BootVolumeID: p.boot.id, BootSize: p.boot.size}
		if view, ok := s.view(p); ok {
			for _, n := range view.Networks {
				inst.Networks = append(inst.Networks, *n)
			}
		}
		out = append(out, inst)
	}
	return out
}

// Resizes returns every resize the API accepted, in order.
func (s *Server) Resizes() []Resize {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.resizes)
}

// Creates returns every create request the API accepted, in order.
func (s *Server) Creates() []models.PVMInstanceCreate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.creates)
}

// --- The API ---

func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	base := "/pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances"
	mux.HandleFunc("GET "+base, s.guard(s.list))
	mux.HandleFunc("POST "+base, s.guard(s.create))
	mux.HandleFunc("GET "+base+"/{pvm_instance_id}", s.guard(s.get))
	mux.HandleFunc("DELETE "+base+"/{pvm_instance_id}", s.guard(s.delete))
	mux.HandleFunc("GET "+base+"/{pvm_instance_id}/volumes", s.guard(s.instanceVolumes))
	mux.HandleFunc("PUT /pcloud/v1/cloud-instances/{cloud_instance_id}/volumes/{volume_id}", s.guard(s.updateVolume))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, "no such operation: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// guard checks the caller and the workspace, then applies armed faults.
func (s *Server) guard(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.opts.IAM.Valid(r.Header.Get("Authorization")) {
			fail(w, http.StatusUnauthorized, "the request has no valid IAM bearer token")
			return
		}
		crn := r.Header.Get("CRN")
		if crn == "" {
			fail(w, http.StatusForbidden, "the CRN header naming the workspace is missing")
			return
		}
		if !sameWorkspace(crn, s.crn) || r.PathValue("cloud_instance_id") != s.opts.CloudInstanceID {
			fail(w, http.StatusForbidden, fmt.Sprintf("the token is not authorized for cloud instance %s (CRN %s)", r.PathValue("cloud_instance_id"), crn))
			return
		}
		s.mu.Lock()
		throttle, failNow := s.throttles > 0, false
		after := s.throttleAfter
		if throttle {
			s.throttles--
		} else if s.failures > 0 {
			s.failures--
			failNow = true
		}
		s.mu.Unlock()
		switch {
		case throttle:
			w.Header().Set("Retry-After", fmt.Sprint(int(math.Ceil(after.Seconds()))))
			fail(w, http.StatusTooManyRequests, "rate limit exceeded; retry later")
		case failNow:
			fail(w, http.StatusInternalServerError, "internal server error; try again")
		default:
			next(w, r)
		}
	}
}

// sameWorkspace compares the CRN header with the workspace's: the SDK writes bluemix or
// staging as the cloud name depending on the endpoint's host, so that part may differ.
func sameWorkspace(got, want string) bool {
	g, w := strings.Split(got, ":"), strings.Split(want, ":")
	if len(g) != 10 || g[0] != "crn" || g[4] != "power-iaas" {
		return false
	}
	return slices.Equal(g[5:], w[5:])
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := models.PVMInstances{PvmInstances: []*models.PVMInstanceReference{}}
	for _, p := range s.order {
		if view, ok := s.view(p); ok {
			out.PvmInstances = append(out.PvmInstances, reference(s.opts.CloudInstanceID, view))
		}
	}
	reply(w, http.StatusOK, out)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := r.PathValue("pvm_instance_id")
	p := s.instances[id]
	if p == nil {
		fail(w, http.StatusNotFound, "pvm-instance "+id+" does not exist")
		return
	}
	view, ok := s.view(p)
	if !ok {
		fail(w, http.StatusNotFound, "pvm-instance "+id+" does not exist")
		return
	}
	reply(w, http.StatusOK, view)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := r.PathValue("pvm_instance_id")
	if p := s.instances[id]; p == nil || s.vanished(p) || !s.forget(id) {
		fail(w, http.StatusNotFound, "pvm-instance "+id+" does not exist")
		return
	}
	reply(w, http.StatusOK, map[string]any{})
}

var serverNameShape = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body models.PVMInstanceCreate
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&body); err != nil {
		fail(w, http.StatusBadRequest, "the body is not a pvm-instance create request: "+err.Error())
		return
	}
	if status, msg := s.validate(&body); status != 0 {
		fail(w, status, msg)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.order {
		if _, live := s.view(p); live && p.name == *body.ServerName {
			fail(w, http.StatusConflict, fmt.Sprintf("a pvm-instance named %s already exists in this cloud instance", p.name))
			return
		}
	}
	id := uuid()
	inst, _, err := s.opts.Machines.Launch(id, *body.ServerName, nil)
	switch {
	case errors.Is(err, vmcloud.ErrCapacity):
		fail(w, http.StatusBadRequest, fmt.Sprintf("insufficient resources: not enough cores or memory available in the system pool to deploy %s with %v cores and %v GB", *body.ServerName, *body.Processors, *body.Memory))
		return
	case errors.Is(err, vmcloud.ErrQuota):
		fail(w, http.StatusBadRequest, "the request exceeds the quota of processors and memory for this cloud instance")
		return
	case err != nil:
		fail(w, http.StatusInternalServerError, err.Error())
		return
	}
	p := &pvm{id: id, vmID: inst.ID, name: *body.ServerName, body: body, created: time.Now().UTC()}
	p.boot = &volume{id: uuid(), name: *body.ServerName + "-boot", owner: p, size: s.opts.BootSize}
	if n := s.firstNetwork(&body); n.External {
		s.internal++
		p.internalIP = fmt.Sprintf("198.19.255.%d", 2+s.internal%250)
	}
	s.instances[id] = p
	s.volumes[p.boot.id] = p.boot
	s.order = append(s.order, p)
	s.creates = append(s.creates, body)
	if s.loseCreates > 0 {
		s.loseCreates--
		fail(w, http.StatusGatewayTimeout, "gateway timeout")
		return
	}
	// Power VS answers a create as it accepts it, minutes before the machine is up: the
	// answer shows it building even when the stand-in's machine booted at once.
	view, _ := s.viewAs(p, "BUILD")
	reply(w, http.StatusCreated, models.PVMInstanceList{view})
}

// validate checks a create as the API does: 400 for a missing or malformed field, 404 for
// an image, network or key pair the workspace does not have.
func (s *Server) validate(b *models.PVMInstanceCreate) (int, string) {
	switch {
	case b.ServerName == nil || *b.ServerName == "":
		return 400, "serverName is required"
	case len(*b.ServerName) > 47 || !serverNameShape.MatchString(*b.ServerName):
		return 400, fmt.Sprintf("serverName %q must be at most 47 letters, digits, periods, underscores or hyphens", *b.ServerName)
	case b.ImageID == nil || *b.ImageID == "":
		return 400, "imageID is required"
	case b.Processors == nil || *b.Processors <= 0:
		return 400, "processors is required and must be positive"
	case b.ProcType == nil || !slices.Contains([]string{"dedicated", "shared", "capped"}, *b.ProcType):
		return 400, "procType is required: dedicated, shared or capped"
	case *b.ProcType == "dedicated" && *b.Processors != math.Trunc(*b.Processors):
		return 400, "dedicated processors come in whole cores"
	case *b.Processors*4 != math.Trunc(*b.Processors*4):
		return 400, "shared processors come in steps of 0.25"
	case b.Memory == nil || *b.Memory < 2:
		return 400, "memory is required and must be at least 2 GB"
	case len(b.Networks) == 0 && len(b.NetworkIDs) == 0:
		return 400, "networks is required: at least one network"
	case b.SysType != "" && !slices.Contains(s.opts.SysTypes, b.SysType):
		return 400, fmt.Sprintf("sysType %s is not available in this data center", b.SysType)
	}
	if b.UserData != "" {
		if _, err := base64.StdEncoding.DecodeString(b.UserData); err != nil {
			return 400, "userData must be base64-encoded"
		}
	}
	if !has(s.opts.Images, *b.ImageID) {
		return 404, "image " + *b.ImageID + " does not exist in this cloud instance"
	}
	nets := slices.Clone(b.NetworkIDs)
	for _, n := range b.Networks {
		if n == nil || n.NetworkID == nil {
			return 400, "networks[].networkID is required"
		}
		nets = append(nets, *n.NetworkID)
	}
	for _, n := range nets {
		if !has(s.opts.Networks, n) {
			return 404, "network " + n + " does not exist in this cloud instance"
		}
	}
	if b.KeyPairName != "" && !slices.Contains(s.opts.Keys, b.KeyPairName) {
		return 404, "key pair " + b.KeyPairName + " does not exist"
	}
	return 0, ""
}

func has[R Resource | Network](rs []R, idOrName string) bool {
	_, ok := find(rs, idOrName)
	return ok
}

// find returns the image or network named by id or name.
func find[R Resource | Network](rs []R, idOrName string) (R, bool) {
	for _, r := range rs {
		var id, name string
		switch r := any(r).(type) {
		case Resource:
			id, name = r.ID, r.Name
		case Network:
			id, name = r.ID, r.Name
		}
		if id == idOrName || name == idOrName {
			return r, true
		}
	}
	var zero R
	return zero, false
}

// networkNames are the networks a create named, in order.
func networkNames(b *models.PVMInstanceCreate) []string {
	names := slices.Clone(b.NetworkIDs)
	for _, n := range b.Networks {
		names = append(names, *n.NetworkID)
	}
	return names
}

func (s *Server) firstNetwork(b *models.PVMInstanceCreate) Network {
	n, _ := find(s.opts.Networks, networkNames(b)[0])
	return n
}

func (s *Server) instanceVolumes(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := r.PathValue("pvm_instance_id")
	p := s.instances[id]
	if p == nil || s.vanished(p) {
		fail(w, http.StatusNotFound, "pvm-instance "+id+" does not exist")
		return
	}
	reply(w, http.StatusOK, models.Volumes{Volumes: []*models.VolumeReference{s.volumeRef(p.boot)}})
}

func (s *Server) updateVolume(w http.ResponseWriter, r *http.Request) {
	var body models.UpdateVolume
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	if err := dec.Decode(&body); err != nil {
		fail(w, http.StatusBadRequest, "the body is not a volume update request: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := r.PathValue("volume_id")
	v := s.volumes[id]
	if v == nil || s.vanished(v.owner) {
		fail(w, http.StatusNotFound, "volume "+id+" does not exist")
		return
	}
	if s.failResizes > 0 {
		s.failResizes--
		fail(w, http.StatusInternalServerError, "internal server error; try again")
		return
	}
	switch {
	case body.Size == 0 && body.Name == nil && body.Bootable == nil && body.Shareable == nil:
		fail(w, http.StatusBadRequest, "the update names nothing to change")
		return
	case body.Size != 0 && body.Size != math.Trunc(body.Size):
		fail(w, http.StatusBadRequest, "size must be a whole number of GB")
		return
	case v.extendTo > 0 || s.volumeState(v) != "in-use":
		fail(w, http.StatusConflict, fmt.Sprintf("volume %s is %s: it cannot be updated now", id, s.volumeState(v)))
		return
	case body.Size != 0 && body.Size <= v.size:
		fail(w, http.StatusBadRequest, fmt.Sprintf("the new size %v GB of volume %s must be larger than its current size %v GB", body.Size, id, v.size))
		return
	}
	if body.Size != 0 {
		s.resizes = append(s.resizes, Resize{VolumeID: v.id, InstanceID: v.owner.id, From: v.size, To: body.Size})
		if s.holdResizes {
			v.extendTo = body.Size
		} else {
			v.size = body.Size
		}
	}
	if body.Name != nil {
		v.name = *body.Name
	}
	if s.loseResizes > 0 {
		s.loseResizes--
		fail(w, http.StatusGatewayTimeout, "gateway timeout")
		return
	}
	ref := s.volumeRef(v)
	reply(w, http.StatusOK, models.Volume{
		VolumeID: ref.VolumeID, Name: ref.Name, Size: ref.Size, State: *ref.State, BootVolume: ref.BootVolume,
		Bootable: ref.Bootable, Shareable: ref.Shareable, DiskType: *ref.DiskType, PvmInstanceIDs: ref.PvmInstanceIDs,
		CreationDate: ref.CreationDate, LastUpdateDate: ref.LastUpdateDate, DeleteOnTermination: ref.DeleteOnTermination,
	})
}

// volumeState is what the API says of a boot volume: "creating" while its instance builds,
// "extending" during a held resize, "in-use" otherwise. The caller holds mu.
func (s *Server) volumeState(v *volume) string {
	switch {
	case v.extendTo > 0:
		return "extending"
	case s.status(v.owner) == "BUILD":
		return "creating"
	}
	return "in-use"
}

func (s *Server) volumeRef(v *volume) *models.VolumeReference {
	created := strfmt.DateTime(v.owner.created)
	return &models.VolumeReference{
		VolumeID: ptr(v.id), Name: ptr(v.name), Size: ptr(v.size), State: ptr(s.volumeState(v)),
		BootVolume: ptr(true), Bootable: ptr(true), Shareable: ptr(false), DiskType: ptr("tier3"),
		DeleteOnTermination: ptr(true), PvmInstanceIDs: []string{v.owner.id},
		Href:         ptr(fmt.Sprintf("/pcloud/v1/cloud-instances/%s/volumes/%s", s.opts.CloudInstanceID, v.id)),
		CreationDate: &created, LastUpdateDate: &created, Wwn: ptr(""),
	}
}

// view is the instance as the API shows it, and false when the API knows it no more (its
// machine vanished). The caller holds mu.
func (s *Server) view(p *pvm) (*models.PVMInstance, bool) {
	return s.viewAs(p, s.status(p))
}

// viewAs is view with the instance in status.
func (s *Server) viewAs(p *pvm, status string) (*models.PVMInstance, bool) {
	m, ok := s.opts.Machines.Instance(p.vmID)
	if !ok || m.Vanished {
		return nil, false
	}
	b := p.body
	var nets []*models.PVMInstanceNetwork
	for i, n := range networkNames(&b) {
		r, _ := find(s.opts.Networks, n)
		net := &models.PVMInstanceNetwork{NetworkID: r.ID, NetworkName: r.Name, Type: "fixed", Version: 4,
			Href: fmt.Sprintf("/pcloud/v1/cloud-instances/%s/networks/%s", s.opts.CloudInstanceID, r.ID)}
		// The machine has one address: the instance's on its first network, its external
		// one when that network is public.
		if i == 0 && status == "ACTIVE" {
			net.IPAddress, net.IP = m.Address, m.Address
			if r.External {
				net.IPAddress, net.IP, net.ExternalIP = p.internalIP, p.internalIP, m.Address
			}
		}
		nets = append(nets, net)
	}
	image, _ := find(s.opts.Images, *b.ImageID)
	return &models.PVMInstance{
		PvmInstanceID: &p.id,
		ServerName:    &p.name,
		Status:        &status,
		ImageID:       &image.ID,
		Processors:    b.Processors,
		ProcType:      b.ProcType,
		Memory:        b.Memory,
		SysType:       b.SysType,
		DiskSize:      ptr(p.boot.size),
		OsType:        ptr("rhel"),
		Networks:      nets,
		NetworkIDs:    networkIDs(nets),
		StorageType:   ptr("tier3"),
		VolumeIDs:     []string{p.boot.id},
		CreationDate:  strfmt.DateTime(p.created),
	}, true
}

// status is the instance's Power VS status. The caller holds mu.
func (s *Server) status(p *pvm) string {
	m, _ := s.opts.Machines.Instance(p.vmID)
	switch {
	case p.shutoff:
		return "SHUTOFF"
	case m.State == vmcloud.Running:
		return "ACTIVE"
	case m.State == vmcloud.Gone:
		return "ERROR" // its boot failed, or the cloud closed
	}
	return "BUILD"
}

func reference(cloudInstanceID string, m *models.PVMInstance) *models.PVMInstanceReference {
	return &models.PVMInstanceReference{
		PvmInstanceID: m.PvmInstanceID, ServerName: m.ServerName, Status: m.Status,
		Href:    ptr(fmt.Sprintf("/pcloud/v1/cloud-instances/%s/pvm-instances/%s", cloudInstanceID, *m.PvmInstanceID)),
		ImageID: m.ImageID, Processors: m.Processors, ProcType: m.ProcType, Memory: m.Memory,
		SysType: m.SysType, DiskSize: m.DiskSize, OsType: m.OsType, Networks: m.Networks,
		CreationDate: m.CreationDate,
	}
}

func networkIDs(nets []*models.PVMInstanceNetwork) []string {
	ids := make([]string, len(nets))
	for i, n := range nets {
		ids[i] = n.NetworkID
	}
	return ids
}

func (s *Server) vanished(p *pvm) bool {
	_, ok := s.view(p)
	return !ok
}

// forget ends an instance's machine and drops the instance. The caller holds mu.
func (s *Server) forget(id string) bool {
	p := s.instances[id]
	if p == nil {
		return false
	}
	// ErrNotFound: the machine is gone already (its boot failed); the instance goes all the same.
	s.opts.Machines.Terminate(p.vmID)
	delete(s.instances, id)
	delete(s.volumes, p.boot.id) // deleted with the instance, as boot volumes are
	s.order = slices.DeleteFunc(s.order, func(q *pvm) bool { return q == p })
	return true
}

// fail answers Power VS's error body.
func fail(w http.ResponseWriter, status int, description string) {
	reply(w, status, models.Error{Code: int64(status), Description: description, Error: strings.ToLower(http.StatusText(status))})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func uuid() string {
	b := make([]byte, 16)
	rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func ptr[T any](v T) *T { return &v }
