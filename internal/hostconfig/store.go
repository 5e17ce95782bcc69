// Package hostconfig keeps berth's host configuration in force: it watches the ConfigMap
// labelled build.appstudio.redhat.com/multi-platform-config in the controller's namespace,
// swaps a valid edit in atomically, and keeps the last good config when an edit is broken,
// saying why in a Warning Event on the ConfigMap, the log and the berth_config_valid metric.
package hostconfig

import (
	"sync"
	"sync/atomic"

	"github.com/berth-ci/berth/internal/config"
)

// Store holds the config in force. Reads are lock-free: allocation reads it on every reconcile.
type Store struct {
	current atomic.Pointer[config.Config]
	synced  atomic.Bool

	mu       sync.Mutex
	rejected *config.Config
	problems config.Problems
	// retired are hosts a newer config removed. Tasks already running there still need the
	// host's address and admin secret to be cleaned up, so they stay resolvable by name.
	retired   map[string]*config.StaticHost
	listeners []func(*config.Config)
}

// NewStore returns an empty store: no config in force yet.
func NewStore() *Store { return &Store{retired: map[string]*config.StaticHost{}} }

// Synced tells whether the watcher has judged the cluster's config at least once. Before
// that, "no config" means "not read yet", not "none exists": nobody should be failed for it.
func (s *Store) Synced() bool { return s.synced.Load() }

// MarkSynced records the watcher's first judgement.
func (s *Store) MarkSynced() { s.synced.Store(true) }

// Config is the config in force, or nil before the first valid one.
func (s *Store) Config() *config.Config { return s.current.Load() }

// Host finds a host by name in the config in force or among hosts removed since; new work must
// use Config().HostsFor, which never returns a removed host.
func (s *Store) Host(name string) *config.StaticHost {
	if cfg := s.current.Load(); cfg != nil {
		if h := cfg.Host(name); h != nil {
			return h
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired[name]
}

// Rejected is the latest config that had errors, with its problems, if it came after the one in
// force. Before any valid config, it lets a controller tell each task which setting breaks its
// platform.
func (s *Store) Rejected() (*config.Config, config.Problems) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rejected, s.problems
}

// OnChange registers f to run after each swap with the new config (say, to wake tasks waiting
// for a platform that just got hosts).
func (s *Store) OnChange(f func(*config.Config)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, f)
}

// Apply puts a valid config in force.
func (s *Store) Apply(cfg *config.Config) {
	s.mu.Lock()
	if old := s.current.Load(); old != nil {
		for _, h := range old.Hosts {
			if cfg.Host(h.Name) == nil {
				s.retired[h.Name] = h
			}
		}
	}
	for _, h := range cfg.Hosts {
		delete(s.retired, h.Name) // back in the config: the new settings count
	}
	s.current.Store(cfg)
	s.rejected, s.problems = nil, nil
	listeners := append([]func(*config.Config){}, s.listeners...)
	s.mu.Unlock()
	for _, f := range listeners {
		f(cfg)
	}
}

// Reject records a config with errors; the config in force stays.
func (s *Store) Reject(cfg *config.Config, problems config.Problems) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejected, s.problems = cfg, problems
}
