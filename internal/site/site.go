// Package site is the site gateway: it terminates tenants' tunnels from
// their offices and forwards between each office network and the networks
// hosted for the tenant, as the RAS Gateway does in multitenant mode.
//
// Each tenant is a network namespace of its own (its compartment), so two
// tenants may use the same addresses. In the namespace a TUN device
// (wireguard-go's tun package, with its GSO/GRO offloads) is the tunnel's
// inside, and routes send the sites' prefixes to it. The kernels it
// targets have no ip_gre, so the datapath is deskway's: where the kernel
// takes them, tc programs (package kernelgre, kernel.go) carry IPv4 GRE
// through a veth into each tenant's namespace; the userspace datapath
// carries the rest, GRE over raw IP sockets (protocol 47), read and
// written in batches (recvmmsg and sendmmsg). On the way in the GRE key names the tenant, the outer source
// must be one of the tenant's sites and the inner source one of that
// site's prefixes; on the way out the inner destination picks the site.
package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/obs"
)

// Deps are what the role needs from the process.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
	// Audit receives every change the role applies (start, stop, each
	// tenant and site a reload adds, changes or removes); nil keeps none.
	Audit obs.AuditLog
}

// Server is the site gateway's datapath for every configured tenant.
type Server struct {
	log    *slog.Logger
	m      *metrics
	d      Deps
	locals []netip.Addr
	// set is the tenants in force: the receive loops read it without a
	// lock, and a reload swaps it whole.
	set atomic.Pointer[tenantSet]

	// mu serializes Run's start and stop with reloads, and guards the
	// tenants' extras for the admin API.
	mu sync.Mutex
	// cfg is the configuration in force.
	cfg        *config.Site
	unders     []*underlay
	runCtx     context.Context
	forwarding bool

	loops    sync.WaitGroup
	fail     chan error // the first forwarding loop that ended by itself
	errMu    sync.Mutex
	loopErrs []error
	// ha is the election of a pair of gateways, nil for a gateway alone.
	ha *haNode
	// kp is the kernel datapath, nil where the userspace one runs alone.
	kp *kernelPath
}

// tenantSet is the tenants in force, by name's order and by key.
type tenantSet struct {
	list  []*tenant
	byKey map[uint32]*tenant
}

// with is the set with ts added and the tenants named in drop left out.
func (set *tenantSet) with(add []*tenant, drop ...string) *tenantSet {
	next := &tenantSet{byKey: map[uint32]*tenant{}}
	for _, t := range append(slices.Clone(set.list), add...) {
		if !slices.Contains(drop, t.name) {
			next.list = append(next.list, t)
			next.byKey[t.key] = t
		}
	}
	return next
}

// New checks what the config alone can tell and builds the tenants; it
// touches no namespace, device or socket (Run does).
func New(cfg *config.Site, d Deps) (*Server, error) {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: d.Logger, d: d, m: newMetrics(d.Registry), fail: make(chan error, 1)}
	for _, a := range cfg.Underlay.Addresses {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("site: underlay address %q: %w", a, err)
		}
		s.locals = append(s.locals, ip)
	}
	var ts []*tenant
	for i := range cfg.Tenants {
		t, err := s.newTenant(&cfg.Tenants[i])
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	s.set.Store((&tenantSet{}).with(ts))
	if cfg.HA != nil {
		if err := s.newHANode(cfg, d); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// newTenant builds a tenant with its extras.
func (s *Server) newTenant(c *config.Tenant) (*tenant, error) {
	t, err := newTenant(c, s.m)
	if err != nil {
		return nil, err
	}
	if err := s.newExtras(t, c, s.d); err != nil {
		return nil, err
	}
	return t, nil
}

// Run brings every tenant's compartment and the underlay sockets up,
// forwards until ctx ends, then removes what it made: the tunnel devices
// (and their routes with them) and the namespaces it created.
func (s *Server) Run(ctx context.Context) error {
	defer s.teardown()
	s.mu.Lock()
	s.runCtx = ctx
	for _, t := range s.set.Load().list {
		if err := s.bringUp(ctx, t); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	for _, ip := range s.locals {
		u, err := listenUnderlay(ip, &s.set, s.m, s.log, s.ha != nil, s.cfg.Underlay.Send != "ip")
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("site: %w", err)
		}
		s.unders = append(s.unders, u)
	}
	if err := s.startKernel(); err != nil {
		s.mu.Unlock()
		return err
	}
	for _, t := range s.set.Load().list {
		s.link(t, t.c())
	}
	for _, u := range s.unders {
		s.loop(u.receive)
	}
	for _, t := range s.set.Load().list {
		s.loop(func() error { return t.encapLoop(s.log) })
	}
	s.forwarding = true
	names := s.names()
	datapath := "userspace"
	stopCounters := make(chan struct{})
	if s.kp != nil {
		datapath = "kernel"
		go s.kernelCountersLoop(stopCounters)
	}
	s.mu.Unlock()
	s.log.Info("site gateway forwarding", "tenants", len(names), "underlay", s.locals, "datapath", datapath)
	s.audit("deskway site", "", "site gateway started, tenants "+strings.Join(names, ", "), http.StatusOK)
	stopHA := s.startHA(ctx)
	select {
	case <-ctx.Done():
	case <-s.fail:
		// A loop ended by itself: the device or socket failed.
	}
	stopHA()
	close(stopCounters)
	s.mu.Lock()
	s.forwarding = false
	for _, u := range s.unders {
		// The raw socket ends the receiving loop; the packet socket
		// closes once no encapsulating loop can be sending on it.
		_ = u.conn.Close()
	}
	for _, t := range s.set.Load().list {
		t.closeDevice()
	}
	s.mu.Unlock()
	s.loops.Wait()
	for _, u := range s.unders {
		u.close()
	}
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return errors.Join(s.loopErrs...)
}

// bringUp makes a tenant's namespace, device, routes and extras.
func (s *Server) bringUp(ctx context.Context, t *tenant) error {
	created, err := t.up()
	if err != nil {
		return fmt.Errorf("site: tenant %s: %w", t.name, err)
	}
	if created {
		s.log.Info("created the tenant's namespace", "tenant", t.name, "namespace", t.nsName)
	}
	if err := t.startExtras(ctx); err != nil {
		return fmt.Errorf("site: tenant %s: %w", t.name, err)
	}
	s.log.Info("tenant up", "tenant", t.name, "namespace", t.nsName, "interface", t.ifName, "key", t.key, "sites", len(t.c().sites))
	return nil
}

// link gives each of tc's sites without one the GRE link of its family.
func (s *Server) link(t *tenant, tc *tenantConf) {
	for _, st := range tc.sites {
		for _, u := range s.unders {
			if st.link == nil && u.local.Is4() == st.peer.Is4() {
				st.link = &greLink{u: u, t: t, site: st}
			}
		}
	}
}

// loop runs a forwarding loop; one that ends by itself, not closed,
// ends Run.
func (s *Server) loop(f func() error) {
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		if err := f(); err != nil && !errors.Is(err, errClosed) {
			s.errMu.Lock()
			s.loopErrs = append(s.loopErrs, err)
			s.errMu.Unlock()
			select {
			case s.fail <- err:
			default:
			}
		}
	}()
}

// names are the tenants' names in force.
func (s *Server) names() []string {
	var out []string
	for _, t := range s.set.Load().list {
		out = append(out, t.name)
	}
	return out
}

// teardown removes what Run made, whatever state it reached.
func (s *Server) teardown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kp != nil {
		s.kp.close()
	}
	for _, t := range s.set.Load().list {
		s.remove(t)
	}
	s.log.Info("site gateway stopped")
	s.audit("deskway site", "", "site gateway stopped", http.StatusOK)
}

// remove stops a tenant's extras and takes its device and the namespace
// deskway created down.
func (s *Server) remove(t *tenant) {
	if err := t.stopExtras(); err != nil {
		s.log.Error("tenant's WireGuard interface", "tenant", t.name, "error", err)
	}
	if deleted, err := t.down(); err != nil {
		s.log.Error("tenant teardown", "tenant", t.name, "error", err)
	} else if deleted {
		s.log.Info("removed the tenant's namespace deskway created", "tenant", t.name, "namespace", t.nsName)
	}
}
