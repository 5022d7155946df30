// Package site is the site gateway: it terminates tenants' tunnels from
// their offices and forwards between each office network and the networks
// hosted for the tenant, as the RAS Gateway does in multitenant mode.
//
// Each tenant is a network namespace of its own (its compartment), so two
// tenants may use the same addresses. In the namespace a TUN device
// (wireguard-go's tun package, with its GSO/GRO offloads) is the tunnel's
// inside, and routes send the sites' prefixes to it. The datapath is in
// userspace, because the kernels it targets have no ip_gre: GRE over raw
// IP sockets (protocol 47), read and written in batches (recvmmsg and
// sendmmsg). On the way in the GRE key names the tenant, the outer source
// must be one of the tenant's sites and the inner source one of that
// site's prefixes; on the way out the inner destination picks the site.
package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/deskway/deskway/internal/config"
)

// Deps are what the role needs from the process.
type Deps struct {
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// Server is the site gateway's datapath for every configured tenant.
type Server struct {
	cfg *config.Site
	log *slog.Logger
	m   *metrics
	// tenants and byKey are set by New and read-only after.
	tenants []*tenant
	byKey   map[uint32]*tenant
	locals  []netip.Addr
	// ha is the election of a pair of gateways, nil for a gateway alone.
	ha *haNode
}

// New checks what the config alone can tell and builds the tenants; it
// touches no namespace, device or socket (Run does).
func New(cfg *config.Site, d Deps) (*Server, error) {
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, m: newMetrics(d.Registry), byKey: map[uint32]*tenant{}}
	for _, a := range cfg.Underlay.Addresses {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, fmt.Errorf("site: underlay address %q: %w", a, err)
		}
		s.locals = append(s.locals, ip)
	}
	for i := range cfg.Tenants {
		t, err := newTenant(&cfg.Tenants[i], s.m)
		if err != nil {
			return nil, err
		}
		if err := s.newExtras(t, &cfg.Tenants[i], d); err != nil {
			return nil, err
		}
		s.tenants = append(s.tenants, t)
		s.byKey[t.key] = t
	}
	if cfg.HA != nil {
		if err := s.newHANode(cfg, d); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run brings every tenant's compartment and the underlay sockets up,
// forwards until ctx ends, then removes what it made: the tunnel devices
// (and their routes with them) and the namespaces it created.
func (s *Server) Run(ctx context.Context) error {
	defer s.teardown()
	for _, t := range s.tenants {
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
		s.log.Info("tenant up", "tenant", t.name, "namespace", t.nsName, "interface", t.ifName, "key", t.key, "sites", len(t.sites))
	}
	var unders []*underlay
	for _, ip := range s.locals {
		u, err := listenUnderlay(ip, s.byKey, s.m, s.log, s.ha != nil)
		if err != nil {
			for _, u := range unders {
				u.close()
			}
			return fmt.Errorf("site: %w", err)
		}
		unders = append(unders, u)
	}
	for _, t := range s.tenants {
		for _, st := range t.sites {
			for _, u := range unders {
				if u.local.Is4() == st.peer.Is4() {
					st.link = &greLink{u: u, t: t, site: st}
				}
			}
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(unders)+len(s.tenants))
	for _, u := range unders {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- u.receive() }()
	}
	for _, t := range s.tenants {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- t.encapLoop(s.log) }()
	}
	s.log.Info("site gateway forwarding", "tenants", len(s.tenants), "underlay", s.locals)
	stopHA := s.startHA(ctx)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errs:
		// A loop ended by itself: the device or socket failed.
	}
	stopHA()
	for _, u := range unders {
		u.close()
	}
	for _, t := range s.tenants {
		t.closeDevice()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		if !errors.Is(e, errClosed) {
			err = errors.Join(err, e)
		}
	}
	return err
}

// teardown removes what Run made, whatever state it reached.
func (s *Server) teardown() {
	for _, t := range s.tenants {
		if err := t.stopExtras(); err != nil {
			s.log.Error("tenant's WireGuard interface", "tenant", t.name, "error", err)
		}
		if deleted, err := t.down(); err != nil {
			s.log.Error("tenant teardown", "tenant", t.name, "error", err)
		} else if deleted {
			s.log.Info("removed the tenant's namespace deskway created", "tenant", t.name, "namespace", t.nsName)
		}
	}
	s.log.Info("site gateway stopped")
}
