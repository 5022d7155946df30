package site

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/site/bgp"
	"github.com/deskway/deskway/internal/site/ha"
)

// haNode is what a gateway of a pair does when its role changes: the
// active one holds the underlay endpoint addresses and each tenant's
// inside addresses, and runs the tenants' BGP speakers.
//
// The addresses are added with a valid lifetime of twice the lease,
// renewed at each renewal of the lease, so that the kernel removes them
// by itself when the process dies without demoting (kill -9): a dead
// active fences itself.
type haNode struct {
	log      *slog.Logger
	lifetime int // seconds
	underlay []config.SiteAddress
	tenants  []*tenant
	inside   map[*tenant][]config.SiteAddress
	// speakers make each BGP tenant's speaker anew: one runs only while
	// the node is active, and a stopped speaker cannot start again.
	speakers map[*tenant]func() (*bgp.Speaker, error)
	elector  *ha.Elector

	mu      sync.Mutex
	ctx     context.Context
	running map[*tenant]*bgp.Speaker
	// kernel attaches the kernel datapath's programs on promotion and
	// detaches them on demotion; nil with the userspace datapath alone.
	kernel func(active bool) error
}

// newHANode builds the node's election; it takes the tenants' speakers
// over from their extras, to start them on promotion only.
func (s *Server) newHANode(cfg *config.Site, d Deps) error {
	h := cfg.HA
	n := &haNode{log: s.log, underlay: h.Addresses, tenants: s.set.Load().list, inside: map[*tenant][]config.SiteAddress{},
		lifetime: int(math.Ceil(2 * h.Lease.D().Seconds())), speakers: map[*tenant]func() (*bgp.Speaker, error){},
		running: map[*tenant]*bgp.Speaker{}}
	for i, t := range s.set.Load().list {
		tc := &cfg.Tenants[i]
		n.inside[t] = tc.Inside
		if t.extras.speaker != nil {
			t.extras.speaker = nil
			// Every speaker the election starts hands its routes to the
			// tenant's one sink: the lock a reload changes the WireGuard
			// device under is the one the sink reads it under. A stopped
			// speaker has taken its routes back, so the next starts from
			// none.
			sink := t.extras.sink
			n.speakers[t] = func() (*bgp.Speaker, error) {
				return bgp.New(*tc.BGP, bgp.Options{Tenant: t.name, Netns: "/run/netns/" + t.nsName,
					Sink: sink, Logger: s.log, Registry: d.Registry})
			}
		}
	}
	e, err := ha.New(context.Background(), ha.Options{DSN: h.Database.Value(), Group: h.Group, Node: h.Node, TTL: h.Lease.D(),
		Logger: s.log, Registry: d.Registry}, n)
	if err != nil {
		return fmt.Errorf("site: %w", err)
	}
	n.elector = e
	s.ha = n
	return nil
}

// run clears what a killed predecessor may have left, then takes part in
// the election until ctx ends.
func (n *haNode) run(ctx context.Context) error {
	n.mu.Lock()
	n.ctx = ctx
	n.mu.Unlock()
	n.dropAddresses()
	return n.elector.Run(ctx)
}

// startHA runs the election, if the gateway is one of a pair, until
// ctx ends or the returned stop is called; stop returns once the node
// has given its addresses up and released the lease.
func (s *Server) startHA(ctx context.Context) (stop func()) {
	if s.ha == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.ha.run(ctx); err != nil {
			s.log.Error("high availability", "error", err)
		}
	}()
	return func() { cancel(); <-done }
}

// Promote implements ha.Actions.
func (n *haNode) Promote() error {
	if err := n.holdAddresses(); err != nil {
		n.dropAddresses()
		return err
	}
	if n.kernel != nil {
		if err := n.kernel(true); err != nil {
			n.log.Error("the kernel datapath's programs did not attach: GRE runs in userspace", "error", err)
		}
	}
	for _, a := range n.underlay {
		if err := gratuitousARP(a); err != nil {
			n.log.Warn("gratuitous ARP", "address", a.Address, "error", err)
		}
	}
	for _, t := range n.tenants {
		for _, a := range n.inside[t] {
			err := inNamespace(t.ns, func() error { return gratuitousARP(a) })
			if err != nil {
				n.log.Warn("gratuitous ARP", "tenant", t.name, "address", a.Address, "error", err)
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for t, mk := range n.speakers {
		sp, err := mk()
		if err == nil {
			err = sp.Start(n.ctx)
		}
		if err != nil {
			n.log.Error("the tenant's BGP speaker did not start", "tenant", t.name, "error", err)
			continue
		}
		n.running[t] = sp
	}
	return nil
}

// Refresh implements ha.Actions: the addresses live on.
func (n *haNode) Refresh() error { return n.holdAddresses() }

// Demote implements ha.Actions.
func (n *haNode) Demote() {
	n.mu.Lock()
	for t, sp := range n.running {
		sp.Stop()
		delete(n.running, t)
	}
	n.mu.Unlock()
	if n.kernel != nil {
		if err := n.kernel(false); err != nil {
			n.log.Error("detaching the kernel datapath's programs", "error", err)
		}
	}
	n.dropAddresses()
}

// Status is the node's role for the admin API.
func (n *haNode) Status() ha.Status { return n.elector.Status() }

// holdAddresses adds (or renews) every address with its lifetime.
func (n *haNode) holdAddresses() error {
	var errs []error
	for _, a := range n.underlay {
		errs = append(errs, n.addr(nil, a, true))
	}
	for _, t := range n.tenants {
		for _, a := range n.inside[t] {
			errs = append(errs, n.addr(t, a, true))
		}
	}
	return errors.Join(errs...)
}

// dropAddresses removes every address this node may hold; one that is
// not there is no error.
func (n *haNode) dropAddresses() {
	for _, a := range n.underlay {
		if err := n.addr(nil, a, false); err != nil {
			n.log.Error("remove an underlay address", "address", a.Address, "error", err)
		}
	}
	for _, t := range n.tenants {
		for _, a := range n.inside[t] {
			if err := n.addr(t, a, false); err != nil {
				n.log.Error("remove an inside address", "tenant", t.name, "address", a.Address, "error", err)
			}
		}
	}
}

// addr adds (or renews) or removes address a on its interface, in
// tenant t's namespace or, t nil, the underlay's (the process's own).
func (n *haNode) addr(t *tenant, a config.SiteAddress, add bool) error {
	var h *netlink.Handle
	var err error
	if t != nil {
		h, err = netlink.NewHandleAt(t.ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(a.Interface)
	if err != nil {
		return fmt.Errorf("interface %s: %w", a.Interface, err)
	}
	p := a.Prefix()
	na := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if !add {
		err = h.AddrDel(link, na)
		if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
	} else {
		na.ValidLft, na.PreferedLft = n.lifetime, n.lifetime
		err = h.AddrReplace(link, na)
	}
	if err != nil {
		return fmt.Errorf("%s on %s: %w", a.Address, a.Interface, err)
	}
	return nil
}

// gratuitousARP announces a's address with its interface's hardware
// address, from the calling thread's namespace: neighbours that had the
// other gateway's address for it change at once rather than after their
// entry ages out. It is an ARP request for the address itself, which
// Linux applies even to entries it updated a moment ago.
func gratuitousARP(a config.SiteAddress) error {
	ifi, err := net.InterfaceByName(a.Interface)
	if err != nil {
		return fmt.Errorf("interface %s: %w", a.Interface, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil // no Ethernet, no ARP
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	ip := a.Prefix().Addr().As4()
	frame := make([]byte, 28)
	binary.BigEndian.PutUint16(frame[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(frame[2:], 0x0800) // IPv4
	frame[4], frame[5] = 6, 4
	binary.BigEndian.PutUint16(frame[6:], 1) // request
	copy(frame[8:], ifi.HardwareAddr)
	copy(frame[14:], ip[:])
	copy(frame[24:], ip[:]) // target hardware address left zero
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifi.Index, Halen: 6,
		Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}}
	if err := unix.Sendto(fd, frame, 0, to); err != nil {
		return fmt.Errorf("send on %s: %w", a.Interface, err)
	}
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// freebind lets a raw socket bind to an address the node does not hold
// yet: a passive gateway's underlay sockets wait on the endpoint address
// the active holds.
func freebind(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if network == "ip6" || network == "ip6:47" {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_FREEBIND, 1)
		}
	})
	return errors.Join(err, serr)
}
