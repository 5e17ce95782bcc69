//go:build linux

// Package powerfake is a stand-in for the IBM Power Virtual Server API, the part of it that
// power-go-client's instance client calls for berth's ibmp provider, on the real paths and
// with the real JSON shapes (power-go-client's models):
//
//	GET    /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances       → 200 {"pvmInstances":[...]}
//	POST   /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances       → 201 [instance]
//	GET    /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances/{id}  → 200 instance
//	DELETE /pcloud/v1/cloud-instances/{cloud_instance_id}/pvm-instances/{id}  → 200 {}
//
// Every call needs "Authorization: Bearer <token>" with a token the IAM stand-in issued (401
// otherwise) and the CRN header of the workspace (403 otherwise). Failures answer Power VS's
// error body {"code","description","error","message"}. The machines behind the instances,
// and their faults (capacity, quota, slow or failed boots, vanishing), are a vmcloud.Cloud's;
// this keeps Power VS's view: instance ids, names, networks and statuses (BUILD while the
// machine is pending, ACTIVE while it runs, ERROR when its boot failed).
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

	"github.com/berth-ci/berth/internal/testground/iamfake"
	"github.com/berth-ci/berth/internal/testground/vmcloud"
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
	Networks []Resource
	Images   []Resource
	Keys     []string
	// SysTypes are the system types a create may ask for; s922, e980 and e1080 when empty.
	SysTypes []string
	// Addr is where the API listens; 127.0.0.1:0 (a free port) when empty.
	Addr string
}

// Resource is a network or an image of the workspace.
type Resource struct{ ID, Name string }

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
	// Faults armed for the next calls.
	failures      int
	throttles     int
	throttleAfter time.Duration
	loseCreates   int
}

type pvm struct {
	id, vmID, name string
	body           models.PVMInstanceCreate
	created        time.Time
}

// Instance is an instance as the workspace keeps it.
type Instance struct {
	ID, Name string
	// VMID is the vmcloud instance behind it.
	VMID string
	// Create is the request that made it.
	Create models.PVMInstanceCreate
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
		out = append(out, Instance{ID: p.id, Name: p.name, VMID: p.vmID, Create: p.body})
	}
	return out
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
	s.instances[id] = p
	s.order = append(s.order, p)
	s.creates = append(s.creates, body)
	if s.loseCreates > 0 {
		s.loseCreates--
		fail(w, http.StatusGatewayTimeout, "gateway timeout")
		return
	}
	view, _ := s.view(p)
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

func has(rs []Resource, idOrName string) bool {
	return slices.ContainsFunc(rs, func(r Resource) bool { return r.ID == idOrName || r.Name == idOrName })
}

func resource(rs []Resource, idOrName string) Resource {
	for _, r := range rs {
		if r.ID == idOrName || r.Name == idOrName {
			return r
		}
	}
	return Resource{}
}

// view is the instance as the API shows it, and false when the API knows it no more (its
// machine vanished). The caller holds mu.
func (s *Server) view(p *pvm) (*models.PVMInstance, bool) {
	m, ok := s.opts.Machines.Instance(p.vmID)
	if !ok || m.Vanished {
		return nil, false
	}
	status := "BUILD"
	switch {
	case m.State == vmcloud.Running:
		status = "ACTIVE"
	case m.State == vmcloud.Gone:
		status = "ERROR" // its boot failed, or the cloud closed
	}
	b := p.body
	var nets []*models.PVMInstanceNetwork
	names := slices.Clone(b.NetworkIDs)
	for _, n := range b.Networks {
		names = append(names, *n.NetworkID)
	}
	for i, n := range names {
		r := resource(s.opts.Networks, n)
		net := &models.PVMInstanceNetwork{NetworkID: r.ID, NetworkName: r.Name, Type: "fixed", Version: 4,
			Href: fmt.Sprintf("/pcloud/v1/cloud-instances/%s/networks/%s", s.opts.CloudInstanceID, r.ID)}
		// The machine has one address: the instance's on its first network.
		if i == 0 && status == "ACTIVE" {
			net.IPAddress, net.IP = m.Address, m.Address
		}
		nets = append(nets, net)
	}
	image := resource(s.opts.Images, *b.ImageID).ID
	return &models.PVMInstance{
		PvmInstanceID: &p.id,
		ServerName:    &p.name,
		Status:        &status,
		ImageID:       &image,
		Processors:    b.Processors,
		ProcType:      b.ProcType,
		Memory:        b.Memory,
		SysType:       b.SysType,
		DiskSize:      ptr(float64(100)),
		OsType:        ptr("rhel"),
		Networks:      nets,
		NetworkIDs:    networkIDs(nets),
		StorageType:   ptr("tier3"),
		VolumeIDs:     []string{},
		CreationDate:  strfmt.DateTime(p.created),
	}, true
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
