package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// RouteSink receives the routes a tenant's routers taught the gateway:
// the best path of each prefix, once per change. Calls come from one
// goroutine at a time.
type RouteSink interface {
	// Add installs prefix via nextHop, replacing any earlier next hop.
	Add(prefix netip.Prefix, nextHop netip.Addr)
	// Remove drops prefix: withdrawn, its peer lost, or the speaker stopped.
	Remove(prefix netip.Prefix)
}

// Options are what the caller supplies beside the tenant's Config.
type Options struct {
	// Tenant names the tenant in logs and metrics.
	Tenant string
	// Netns is the path of the tenant's network namespace, such as
	// /run/netns/tenant-a; empty means the caller's own namespace.
	Netns string
	// Sink receives the learnt routes.
	Sink RouteSink
	// Logger receives the speaker's and GoBGP's logs.
	Logger *slog.Logger
	// Registry receives the metrics; nil means none are kept.
	Registry prometheus.Registerer
}

// Speaker is one tenant's BGP speaker. Construct it with New, then Start
// and Stop it once.
type Speaker struct {
	cfg      Config
	opt      Options
	log      *slog.Logger
	announce []netip.Prefix
	accept   []netip.Prefix

	srv    *server.BgpServer
	m      *metrics
	served chan struct{} // closed when GoBGP's Serve returns
	cancel context.CancelFunc
	kick   chan struct{} // a change in the RIB or a peer's state: reconcile the sink

	established map[netip.Addr]bool // owned by GoBGP's watcher goroutine (peerEvent)
	done        chan struct{}       // closed when the reconciler has emptied the sink
	stop        sync.Once
}

// New checks cfg and opt and builds a Speaker without starting anything.
func New(cfg Config, opt Options) (*Speaker, error) {
	if err := cfg.Validate("bgp"); err != nil {
		return nil, fmt.Errorf("bgp: tenant %s: %w", opt.Tenant, err)
	}
	if opt.Sink == nil {
		return nil, errors.New("bgp: no route sink")
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	return &Speaker{
		cfg:         cfg,
		opt:         opt,
		log:         opt.Logger.With("tenant", opt.Tenant),
		announce:    prefixes(cfg.Announce),
		accept:      prefixes(cfg.Accept),
		kick:        make(chan struct{}, 1),
		established: map[netip.Addr]bool{},
		done:        make(chan struct{}),
		served:      make(chan struct{}),
	}, nil
}

// Start runs GoBGP inside the tenant's namespace, opens the listeners,
// configures the peers and announces the prefixes. The speaker runs until
// ctx ends or Stop is called.
func (s *Speaker) Start(ctx context.Context) error {
	m, err := newMetrics(s.opt.Registry, s.opt.Tenant)
	if err != nil {
		return fmt.Errorf("bgp: tenant %s: metrics: %w", s.opt.Tenant, err)
	}
	s.m = m
	lvl := new(slog.LevelVar)
	lvl.Set(slog.LevelInfo)
	s.srv = server.NewBgpServer(server.LoggerOption(s.log.With("component", "gobgp"), lvl))

	// A socket belongs to the namespace of the thread that created it.
	// GoBGP creates its listeners in StartBgp, which runs on the goroutine
	// that called Serve; that goroutine is wired to a thread moved into
	// the tenant's namespace. GoBGP's dials come from goroutines of its
	// own, on any thread, so peers are passive (see addPeers).
	ready := make(chan error, 1)
	go func() {
		defer close(s.served)
		// Never unlocked: a thread left in another namespace must not run
		// other goroutines, so the runtime ends it when this one returns.
		runtime.LockOSThread()
		if err := enterNetns(s.opt.Netns); err != nil {
			ready <- err
			return
		}
		ready <- nil
		s.srv.Serve()
	}()
	if err := <-ready; err != nil {
		s.m.unregister()
		return fmt.Errorf("bgp: tenant %s: enter namespace %s: %w", s.opt.Tenant, s.opt.Netns, err)
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if err := s.configure(runCtx); err != nil {
		cancel()
		s.srv.Stop()
		<-s.served
		s.m.unregister()
		return fmt.Errorf("bgp: tenant %s: %w", s.opt.Tenant, err)
	}
	s.cancel = cancel
	go s.reconcileLoop(runCtx)
	go func() {
		select {
		case <-ctx.Done():
			s.Stop()
		case <-runCtx.Done():
		}
	}()
	s.log.Info("bgp speaker started", "listen", s.cfg.Listen, "port", s.cfg.port(), "peers", len(s.cfg.Peers), "announce", len(s.announce))
	return nil
}

// configure brings up the global settings, policies, watchers, peers and
// announcements, in the order GoBGP needs them.
func (s *Speaker) configure(ctx context.Context) error {
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:             s.cfg.ASN,
		RouterId:        s.cfg.RouterID,
		ListenPort:      int32(s.cfg.port()),
		ListenAddresses: s.cfg.Listen,
	}}); err != nil {
		return fmt.Errorf("start on %v port %d: %w", s.cfg.Listen, s.cfg.port(), err)
	}
	if err := s.setPolicies(ctx); err != nil {
		return err
	}
	if err := s.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{
		OnBestPath:   func([]*apiutil.Path, time.Time) { s.poke() },
		OnPeerUpdate: s.peerEvent,
	}, server.WatchBestPath(true), server.WatchPeer()); err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	if err := s.addPeers(ctx); err != nil {
		return err
	}
	return s.announcePrefixes()
}

// addPeers configures each router as a passive neighbour with its prefix
// limits. Passive: the router opens the session towards the gateway's
// listener in the tenant's namespace. An active dial would come from a
// GoBGP goroutine on a thread in the gateway's own namespace, where the
// tenant's address may be unreachable or, worse, another network's.
func (s *Speaker) addPeers(ctx context.Context) error {
	for i, p := range s.cfg.Peers {
		hold := uint64(p.holdTime().Seconds())
		limit := p.maxPrefixes()
		family := func(afi api.Family_Afi) *api.AfiSafi {
			f := &api.Family{Afi: afi, Safi: api.Family_SAFI_UNICAST}
			return &api.AfiSafi{
				Config:       &api.AfiSafiConfig{Family: f, Enabled: true},
				PrefixLimits: &api.PrefixLimit{Family: f, MaxPrefixes: limit},
			}
		}
		peer := &api.Peer{
			Conf: &api.PeerConf{
				NeighborAddress: p.Address,
				PeerAsn:         p.ASN,
				AuthPassword:    string(p.Password),
			},
			Timers: &api.Timers{Config: &api.TimersConfig{
				HoldTime:          hold,
				KeepaliveInterval: max(hold/3, 1),
				ConnectRetry:      5,
			}},
			Transport: &api.Transport{PassiveMode: true},
			AfiSafis:  []*api.AfiSafi{family(api.Family_AFI_IP), family(api.Family_AFI_IP6)},
		}
		if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: peer}); err != nil {
			return fmt.Errorf("peers[%d] %s: %w", i, p.Address, err)
		}
		s.m.peerUp.WithLabelValues(p.Address).Set(0)
	}
	return nil
}

// announcePrefixes originates the configured prefixes; GoBGP puts its own
// session address in as next hop towards each external peer.
func (s *Speaker) announcePrefixes() error {
	paths := make([]*apiutil.Path, 0, len(s.announce))
	for _, p := range s.announce {
		nlri, err := bgp.NewIPAddrPrefix(p)
		if err != nil {
			return fmt.Errorf("announce %s: %w", p, err)
		}
		attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
		if p.Addr().Is4() {
			nh, err := bgp.NewPathAttributeNextHop(netip.IPv4Unspecified())
			if err != nil {
				return fmt.Errorf("announce %s: %w", p, err)
			}
			attrs = append(attrs, nh)
		} else {
			mp, err := bgp.NewPathAttributeMpReachNLRI(bgp.RF_IPv6_UC, []bgp.PathNLRI{{NLRI: nlri}}, netip.IPv6Unspecified())
			if err != nil {
				return fmt.Errorf("announce %s: %w", p, err)
			}
			attrs = append(attrs, mp)
		}
		paths = append(paths, &apiutil.Path{Family: familyOf(p), Nlri: nlri, Attrs: attrs})
	}
	if len(paths) == 0 {
		return nil
	}
	if _, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: paths}); err != nil {
		return fmt.Errorf("announce %v: %w", s.announce, err)
	}
	s.m.announced.Set(float64(len(paths)))
	return nil
}

func familyOf(p netip.Prefix) bgp.Family {
	if p.Addr().Is4() {
		return bgp.RF_IPv4_UC
	}
	return bgp.RF_IPv6_UC
}

func (s *Speaker) poke() {
	select {
	case s.kick <- struct{}{}:
	default: // a reconcile is already due and will see this change too
	}
}

// peerEvent runs on GoBGP's watcher goroutine, the only one that
// touches s.established.
func (s *Speaker) peerEvent(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
	if ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	addr := ev.Peer.State.NeighborAddress
	if !addr.IsValid() {
		addr = ev.Peer.Conf.NeighborAddress
	}
	state := ev.Peer.State.SessionState
	up := state == bgp.BGP_FSM_ESTABLISHED
	s.poke()
	if up == s.established[addr] {
		s.log.Debug("bgp peer state", "peer", addr, "state", state.String())
		return
	}
	s.established[addr] = up
	if up {
		s.m.peerUp.WithLabelValues(addr.String()).Set(1)
		s.log.Info("bgp session established", "peer", addr)
		return
	}
	s.m.peerUp.WithLabelValues(addr.String()).Set(0)
	s.log.Info("bgp session down", "peer", addr, "reason", ev.Peer.State.DisconnectMessage)
}

// Stop removes every learnt route from the sink, closes every session
// with a Cease notification, closes the listeners and waits for all of
// it. It is safe to call more than once, and does nothing for a speaker
// that never started.
func (s *Speaker) Stop() {
	s.stop.Do(func() {
		if s.cancel == nil {
			return
		}
		// The reconciler goes first: it would otherwise read a RIB that
		// GoBGP is tearing down and report each failure.
		s.cancel()
		<-s.done
		s.srv.Stop()
		<-s.served
		s.m.unregister()
		s.log.Info("bgp speaker stopped")
	})
}

func enterNetns(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}
