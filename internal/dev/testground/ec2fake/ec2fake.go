//go:build linux

// Package ec2fake is a stand-in of the Amazon EC2 Query API for berth's aws provider: the
// three actions it calls (RunInstances, DescribeInstances, TerminateInstances), spoken as EC2
// speaks them (form-encoded POSTs signed with Signature Version 4, XML answers in EC2's
// namespace, EC2's error envelope and HTTP statuses), so the real AWS SDK serialises, signs,
// retries and parses against it. It refuses what EC2 refuses that berth could get wrong:
// unsigned or wrongly signed calls, unknown keys, missing parameters, unknown key pairs or
// images, a client token over 64 characters and a client token reused with a different
// request.
//
// It keeps EC2's view of instances (ids, reservations, client tokens, addresses, tags) and
// leaves the machines to a *vmcloud.Cloud: a new RunInstances launches one there, and the
// cloud's faults (no capacity, quota, slow or failed boots) show through as EC2 would show
// them. Its own faults are the API's: 5xx answers, throttling, revoked keys, actions IAM
// denies (UnauthorizedOperation) and instances stopped or terminated from the console.
//
// Where it is simpler than EC2: one instance per RunInstances (MaxCount 1), no
// eventual consistency, instance types, security groups and profiles are taken as given,
// and client tokens are remembered for the server's life (EC2: about a day).
//
// It is a test ground: tests, the dev stack and the bench link it, never the controller.
package ec2fake

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/berth-ci/berth/internal/dev/testground/vmcloud"
)

// Namespace is the XML namespace of EC2's answers (API version 2016-11-15).
const Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"

const (
	ownerID = "123456789012"
	// maxBody bounds a request; RunInstances with 16 KB of user data is far below it.
	maxBody = 1 << 20
	// keepTerminated is how long EC2 keeps describing a terminated instance.
	keepTerminated = time.Hour
)

// Options configure a Server.
type Options struct {
	// Machines runs the instances. Required; NewForTest makes a hostless one when nil.
	Machines *vmcloud.Cloud
	// AccessKeyID and SecretAccessKey are the one key the API accepts. Required.
	AccessKeyID, SecretAccessKey string
	// Region is the region requests must be signed for; us-east-1 when empty.
	Region string
	// KeyPairs are the key pair names that exist; a RunInstances naming another one is
	// refused with InvalidKeyPair.NotFound.
	KeyPairs []string
	// Images, when set, are the only AMIs that exist (InvalidAMIID.NotFound otherwise); when
	// empty, any well-formed AMI id does.
	Images []string
	// Subnets, when set, are the only subnets that exist (InvalidSubnetID.NotFound
	// otherwise); when empty, any well-formed subnet id does and none maps public addresses.
	Subnets []Subnet
	// Addr is where the API listens; 127.0.0.1:0 (a free port) when empty.
	Addr string
	// Logf, if set, hears about every call and its outcome (never a secret).
	Logf func(format string, args ...any)
}

// Subnet is a subnet of the stand-in's VPC.
type Subnet struct {
	ID string
	// MapPublicIPOnLaunch gives the instances launched into it a public address, as the
	// subnet attribute of that name does: the machine's reachable address is then the
	// public one, and the private one is in 198.19.128.0/17, where nothing answers.
	MapPublicIPOnLaunch bool
}

// Instance is an instance as the stand-in shows it.
type Instance struct {
	ID string
	// MachineID is the instance's id in the vmcloud.
	MachineID   string
	ClientToken string
	// State is EC2's: pending, running, stopped, shutting-down or terminated.
	State        string
	PrivateIP    string
	PublicIP     string
	ImageID      string
	InstanceType string
	KeyName      string
	SubnetID     string
	Tags         map[string]string
	LaunchedAt   time.Time
}

// Call is one authenticated API call as the stand-in received it.
type Call struct {
	Action string
	Params url.Values
	// Error is the error code it was answered with; empty on success.
	Error string
}

// Server is a running EC2 API stand-in.
type Server struct {
	opts     Options
	machines *vmcloud.Cloud
	url      string
	srv      *http.Server
	// served is closed once the API stops serving, servedErr then says why.
	served    chan struct{}
	servedErr error

	mu        sync.Mutex
	keys      map[string]string // access key id → secret access key
	instances map[string]*instance
	order     []*instance
	byToken   map[string]*instance
	calls     []Call
	authFails int
	// The next failNext calls answer failWith.
	failNext int
	failWith *apiError
	// denied are the actions IAM refuses, by action, with the principal refused.
	denied map[string]string
	// Instances younger than hideNew are not described yet (EC2's eventual consistency).
	hideNew time.Duration
	// noCapacity are the instance types no launch gets now (NoCapacityFor).
	noCapacity map[string]bool
	// privateIPs counts the unreachable private addresses given to public instances.
	privateIPs int
}

type instance struct {
	id, reservationID, token string
	machineID                string
	// request is the RunInstances that made it, less its client token: a repeat of the token
	// must ask for the same.
	request                                   string
	imageID, instanceType, keyName, subnetID  string
	tenancy, hostResourceGroupARN, privateDNS string
	tags                                      map[string]string
	public                                    bool
	privateIP                                 string
	launchedAt                                time.Time
}

// New starts a stand-in serving the EC2 API over opts.Machines; Close stops it (the machines
// are the cloud's to stop).
func New(opts Options) (*Server, error) {
	if opts.Machines == nil {
		return nil, errors.New("ec2fake: Options.Machines is required")
	}
	if opts.AccessKeyID == "" || opts.SecretAccessKey == "" {
		return nil, errors.New("ec2fake: Options.AccessKeyID and SecretAccessKey are required")
	}
	if opts.Region == "" {
		opts.Region = "us-east-1"
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ec2fake: listen: %w", err)
	}
	s := &Server{
		opts:      opts,
		machines:  opts.Machines,
		url:       "http://" + ln.Addr().String(),
		keys:      map[string]string{opts.AccessKeyID: opts.SecretAccessKey},
		instances: map[string]*instance{},
		byToken:   map[string]*instance{},
		served:    make(chan struct{}),
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		s.servedErr = s.srv.Serve(ln)
		close(s.served)
	}()
	return s, nil
}

// Done is closed once the API has stopped serving: after Close, or when serving failed.
func (s *Server) Done() <-chan struct{} { return s.served }

// Err says why the API stopped serving, once Done is closed (http.ErrServerClosed after Close).
func (s *Server) Err() error {
	select {
	case <-s.served:
		return s.servedErr
	default:
		return nil
	}
}

// NewForTest starts a stand-in for t and closes it when t ends. Without opts.Machines it runs
// over a hostless vmcloud of its own (instances with addresses and no hosts), which needs
// neither root nor sshd.
func NewForTest(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Machines == nil {
		opts.Machines = vmcloud.NewForTest(t, vmcloud.Options{APIKey: randomHex(16), Hostless: true, Logf: opts.Logf})
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the EC2 stand-in: %v", err)
		}
	})
	return s
}

// URL is the API's endpoint, like http://127.0.0.1:40123, for the SDK's BaseEndpoint.
func (s *Server) URL() string { return s.url }

// Region is the region requests must be signed for.
func (s *Server) Region() string { return s.opts.Region }

// Machines is the cloud that runs the instances.
func (s *Server) Machines() *vmcloud.Cloud { return s.machines }

// Close stops the API. The instances keep running in the cloud.
func (s *Server) Close() error { return s.srv.Close() }

// --- Faults ---

// InternalErrors makes the next n calls answer InternalError (500).
func (s *Server) InternalErrors(n int) {
	s.failCalls(n, &apiError{http.StatusInternalServerError, "InternalError", "An internal error has occurred."})
}

// Unavailable makes the next n calls answer Unavailable (503).
func (s *Server) Unavailable(n int) {
	s.failCalls(n, &apiError{http.StatusServiceUnavailable, "Unavailable", "The server is overloaded and can't handle the request."})
}

// Throttle makes the next n calls answer RequestLimitExceeded (503), as EC2 does when an
// account calls too fast.
func (s *Server) Throttle(n int) {
	s.failCalls(n, &apiError{http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded."})
}

func (s *Server) failCalls(n int, e *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext, s.failWith = n, e
}

// Deny makes every call of action (RunInstances, say) answer UnauthorizedOperation (403)
// until Allow, as EC2 does when the IAM policies of the key's principal do not allow it. The
// message is EC2's: it names the principal's ARN, and so its account id, and ends with an
// encoded authorization failure message (random here; EC2's decodes with sts
// DecodeAuthorizationMessage). Calls are refused after their signature is checked, as EC2
// authorises only a caller it has authenticated.
func (s *Server) Deny(action, principalARN string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.denied == nil {
		s.denied = map[string]string{}
	}
	s.denied[action] = principalARN
}

// Allow lifts a Deny of action.
func (s *Server) Allow(action string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.denied, action)
}

// unauthorized is EC2's refusal of a call its caller's policies do not allow.
func (s *Server) unauthorized(action, principalARN string) *apiError {
	account := ownerID
	if parts := strings.Split(principalARN, ":"); len(parts) > 4 && parts[4] != "" {
		account = parts[4]
	}
	return errorf(http.StatusForbidden, "UnauthorizedOperation",
		"You are not authorized to perform this operation. User: %s is not authorized to perform: ec2:%s on resource: arn:aws:ec2:%s:%s:instance/* because no identity-based policy allows the ec2:%s action. Encoded authorization failure message: %s",
		principalARN, action, s.opts.Region, account, action, encodedAuthorizationMessage())
}

// encodedAuthorizationMessage stands in for the opaque blob EC2 appends: letters, digits, '-'
// and '_', about 1,200 characters, so that the whole message is longer than an Event's note.
func encodedAuthorizationMessage() string {
	b := make([]byte, 900)
	rand.Read(b)
	return strings.NewReplacer("+", "-", "/", "_", "=", "").Replace(base64.StdEncoding.EncodeToString(b))
}

// InsufficientCapacity makes the next n launches of new instances fail with
// InsufficientInstanceCapacity (the cloud's FailLaunches).
func (s *Server) InsufficientCapacity(n int) { s.machines.FailLaunches(n) }

// NoCapacityFor makes every launch of the given instance types fail with
// InsufficientInstanceCapacity until it is called again with other types (none: capacity is
// back for all), as EC2 answers when a zone has run out of one type and not of others.
func (s *Server) NoCapacityFor(instanceTypes ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noCapacity = map[string]bool{}
	for _, t := range instanceTypes {
		s.noCapacity[t] = true
	}
}

// SetQuota sets how many instances may be pending or running at once; launches beyond it
// answer InstanceLimitExceeded. 0 is no limit.
func (s *Server) SetQuota(n int) { s.machines.SetQuota(n) }

// SetBootDelay sets how long instances launched from now on stay pending; a long one leaves
// them stuck in pending.
func (s *Server) SetBootDelay(d time.Duration) { s.machines.SetBootDelay(d) }

// TerminateFromConsole terminates an instance behind its launcher's back, as someone in the
// AWS console would: it shows as terminated from then on.
func (s *Server) TerminateFromConsole(id string) error {
	machine, err := s.machineOf(id)
	if err != nil {
		return err
	}
	if _, err := s.machines.Terminate(machine); err != nil && !errors.Is(err, vmcloud.ErrNotFound) {
		return err
	}
	return nil
}

// StopFromConsole stops an instance behind its launcher's back, as someone in the AWS console
// would (or a Spot interruption that stops rather than terminates): EC2 keeps it, stopped,
// with its volumes, until it is terminated.
func (s *Server) StopFromConsole(id string) error {
	machine, err := s.machineOf(id)
	if err != nil {
		return err
	}
	return s.machines.Stop(machine)
}

// machineOf is the machine of the EC2 instance id.
func (s *Server) machineOf(id string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inst := s.instances[id]; inst != nil {
		return inst.machineID, nil
	}
	return "", fmt.Errorf("ec2fake: no instance %s", id)
}

// HideNewInstances makes DescribeInstances and TerminateInstances answer
// InvalidInstanceID.NotFound for instances launched less than d ago, as EC2 may for a few
// seconds after RunInstances: its API is eventually consistent.
func (s *Server) HideNewInstances(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hideNew = d
}

// RevokeAccessKey deletes an access key: calls signed with it answer AuthFailure.
func (s *Server) RevokeAccessKey(accessKeyID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, accessKeyID)
}

// AddAccessKey creates an access key, as rotating one does before the old one is revoked.
func (s *Server) AddAccessKey(accessKeyID, secretAccessKey string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[accessKeyID] = secretAccessKey
}

// --- Introspection ---

// Calls returns the authenticated calls of an action ("" for all) in the order they came.
func (s *Server) Calls(action string) []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Call
	for _, c := range s.calls {
		if action == "" || c.Action == action {
			out = append(out, Call{Action: c.Action, Params: cloneValues(c.Params), Error: c.Error})
		}
	}
	return out
}

// AuthFailures counts the calls refused for their credentials or signature.
func (s *Server) AuthFailures() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.authFails
}

// Instance returns one instance, terminated ones included.
func (s *Server) Instance(id string) (Instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inst := s.instances[id]
	if inst == nil {
		return Instance{}, false
	}
	return s.view(inst), true
}

// Instances returns every instance launched, in launch order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, len(s.order))
	for i, inst := range s.order {
		out[i] = s.view(inst)
	}
	return out
}

// view is an instance as EC2 shows it now. The caller holds mu.
func (s *Server) view(inst *instance) Instance {
	m, _ := s.machines.Instance(inst.machineID)
	v := Instance{
		ID:           inst.id,
		MachineID:    inst.machineID,
		ClientToken:  inst.token,
		ImageID:      inst.imageID,
		InstanceType: inst.instanceType,
		KeyName:      inst.keyName,
		SubnetID:     inst.subnetID,
		Tags:         cloneTags(inst.tags),
		LaunchedAt:   inst.launchedAt,
	}
	switch m.State {
	case vmcloud.Pending:
		v.State = "pending"
	case vmcloud.Running:
		v.State = "running"
	case vmcloud.Stopped:
		v.State = "stopped"
	default:
		v.State = "terminated"
	}
	switch {
	case v.State == "terminated" || v.State == "stopped":
	case inst.public:
		v.PrivateIP, v.PublicIP = inst.privateIP, m.Address
	default:
		v.PrivateIP = m.Address
	}
	return v
}

// describable says whether DescribeInstances shows an instance: EC2 forgets terminated ones
// after about an hour, vanished ones never come back, and new ones may take a moment. The caller holds mu.
func (s *Server) describable(inst *instance) bool {
	m, ok := s.machines.Instance(inst.machineID)
	if !ok || m.Vanished || time.Since(inst.launchedAt) < s.hideNew {
		return false
	}
	return m.State != vmcloud.Gone || time.Since(m.TerminatedAt) < keepTerminated
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}

// --- The wire ---

type apiError struct {
	status  int
	code    string
	message string
}

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{status, code, fmt.Sprintf(format, args...)}
}

func badRequest(code, format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, code, format, args...)
}

type errorResponse struct {
	XMLName   xml.Name `xml:"Response"`
	Code      string   `xml:"Errors>Error>Code"`
	Message   string   `xml:"Errors>Error>Message"`
	RequestID string   `xml:"RequestID"`
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	requestID := newRequestID()
	if r.Method != http.MethodPost {
		writeError(w, requestID, badRequest("InvalidAction", "The action is not valid for this web service: EC2's Query API takes POST"))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		writeError(w, requestID, badRequest("MalformedQueryString", "The request body could not be read or is too large."))
		return
	}
	params, err := url.ParseQuery(string(body))
	if err != nil {
		writeError(w, requestID, badRequest("MalformedQueryString", "The query string is malformed: %v", err))
		return
	}
	if e := s.authenticate(r, body); e != nil {
		s.mu.Lock()
		s.authFails++
		s.mu.Unlock()
		s.logf("ec2fake: %s refused: %s", params.Get("Action"), e.code)
		writeError(w, requestID, e)
		return
	}
	action := params.Get("Action")
	answer, e := s.call(action, params)
	s.mu.Lock()
	call := Call{Action: action, Params: params}
	if e != nil {
		call.Error = e.code
	}
	s.calls = append(s.calls, call)
	s.mu.Unlock()
	if e != nil {
		s.logf("ec2fake: %s: %s %s", action, e.code, e.message)
		writeError(w, requestID, e)
		return
	}
	s.logf("ec2fake: %s ok", action)
	setRequestID(answer, requestID)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, xml.Header)
	xml.NewEncoder(w).Encode(answer)
}

func (s *Server) authenticate(r *http.Request, body []byte) *apiError {
	h := r.Header.Get("Authorization")
	if h == "" {
		return errorf(http.StatusUnauthorized, "MissingAuthenticationToken", "The request must contain either a valid (registered) AWS access key ID or X.509 certificate.")
	}
	sig, err := parseSigV4(h)
	if err != nil {
		return badRequest("IncompleteSignature", "%v", err)
	}
	s.mu.Lock()
	secret, known := s.keys[sig.accessKeyID]
	s.mu.Unlock()
	if !known {
		return errorf(http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials")
	}
	if sig.service != "ec2" || sig.region != s.opts.Region {
		return errorf(http.StatusUnauthorized, "AuthFailure", "Credential should be scoped to a valid region and service: ec2 in %s, not %s in %s", s.opts.Region, sig.service, sig.region)
	}
	if err := verifySigV4(r, body, sig, secret); err != nil {
		return errorf(http.StatusUnauthorized, "AuthFailure", "AWS was not able to validate the provided access credentials: %v", err)
	}
	return nil
}

func (s *Server) call(action string, p url.Values) (any, *apiError) {
	s.mu.Lock()
	if principal, denied := s.denied[action]; denied {
		s.mu.Unlock()
		return nil, s.unauthorized(action, principal)
	}
	if s.failNext > 0 {
		s.failNext--
		e := s.failWith
		s.mu.Unlock()
		return nil, e
	}
	s.mu.Unlock()
	switch action {
	case "":
		return nil, badRequest("MissingAction", "The request must contain the parameter Action.")
	case "RunInstances":
		return s.runInstances(p)
	case "DescribeInstances":
		return s.describeInstances(p)
	case "TerminateInstances":
		return s.terminateInstances(p)
	}
	return nil, badRequest("InvalidAction", "The action %s is not valid for this web service.", action)
}

func writeError(w http.ResponseWriter, requestID string, e *apiError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.status)
	io.WriteString(w, xml.Header)
	xml.NewEncoder(w).Encode(errorResponse{Code: e.code, Message: e.message, RequestID: requestID})
}

func newRequestID() string {
	b := randomHex(32)
	return b[:8] + "-" + b[8:12] + "-" + b[12:16] + "-" + b[16:20] + "-" + b[20:]
}

func randomHex(n int) string {
	b := make([]byte, (n+1)/2)
	rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// indexed returns the values of prefix.1, prefix.2, ... in index order, as the Query
// protocol flattens lists.
func indexed(p url.Values, prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		k := fmt.Sprintf("%s.%d", prefix, i)
		if _, ok := p[k]; !ok {
			return out
		}
		out = append(out, p.Get(k))
	}
}

// count returns how many members prefix.1, prefix.2, ... a flattened list of structures has.
func count(p url.Values, prefix string) int {
	n := 0
	for k := range p {
		rest, ok := strings.CutPrefix(k, prefix+".")
		if !ok {
			continue
		}
		idx, _, _ := strings.Cut(rest, ".")
		var i int
		if _, err := fmt.Sscanf(idx, "%d", &i); err == nil && i > n {
			n = i
		}
	}
	return n
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = slices.Clone(vs)
	}
	return out
}

func cloneTags(tags map[string]string) map[string]string {
	out := make(map[string]string, len(tags))
	for k, v := range tags {
		out[k] = v
	}
	return out
}
