package netboot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/mdlayher/ndp"
	"golang.org/x/net/ipv6"
)

// iPXE configures IPv4 (DHCP) and IPv6 (router discovery) together and
// waits for both before it boots: on a boot network with no IPv6 router
// its router solicitations go unanswered until it gives up, about 18 s
// of every power-on. deskway answers them with an advertisement that
// offers nothing (no prefix, no DHCPv6, a router lifetime of 0, so no
// machine takes deskway as its router), which ends iPXE's wait at once.

// raGap is the shortest time between two advertisements. RFC 4861
// §6.2.6 asks 3 s between multicast answers; a second is enough to keep
// a flood of solicitations from being amplified and short enough that
// machines powered on together are not kept waiting. Solicitations in
// the gap share the one advertisement sent when it ends.
const raGap = time.Second

// raRetry is how often the responder looks again for the interface's
// link-local address, which appears only once the link has a carrier
// (a bridge with no machine on it has none) and its duplicate address
// detection is over.
const raRetry = time.Second

// serveRouterSolicitations answers router solicitations on ifname until
// ctx ends.
func (s *Service) serveRouterSolicitations(ctx context.Context, ifname string) error {
	var c *ndp.Conn
	for said := false; ; {
		var err error
		if c, err = listenNDP(ifname); err == nil {
			break
		}
		if !said {
			said = true
			s.log.Info("router solicitations are answered once the boot network's interface has an IPv6 link-local address", "interface", ifname, "reason", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(raRetry):
		}
	}
	go func() { <-ctx.Done(); c.Close() }()
	s.log.Info("answering IPv6 router solicitations on the boot network (router lifetime 0: iPXE stops waiting for an IPv6 router)", "interface", ifname)
	ra := &ndp.RouterAdvertisement{CurrentHopLimit: 64}
	if ifi, err := net.InterfaceByName(ifname); err == nil && len(ifi.HardwareAddr) == 6 {
		ra.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}
	}
	// One reader, one packet at a time: anyone on the boot network can
	// send solicitations, and many in a gap cost one answer.
	solicited := make(chan struct{}, 1)
	failed := make(chan error, 1)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, _, err := c.ReadRaw(buf)
			if err != nil {
				failed <- err
				return
			}
			if m, err := ndp.ParseMessage(buf[:n]); err == nil {
				if _, ok := m.(*ndp.RouterSolicitation); ok {
					s.m.ra.WithLabelValues("solicited").Inc()
					select {
					case solicited <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	var last time.Time
	var pending <-chan time.Time
	for {
		select {
		case err := <-failed:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("router solicitations: %w", err)
		case <-solicited:
			if pending == nil {
				// The first solicitation after a quiet gap is answered at
				// once; the others wait for the gap's end.
				pending = time.After(max(0, time.Until(last.Add(raGap))))
			}
		case <-pending:
			pending = nil
			last = time.Now()
			if err := c.WriteTo(ra, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
				s.m.ra.WithLabelValues("failed").Inc()
				s.log.Debug("router advertisement not sent", "interface", ifname, "error", err)
				continue
			}
			s.m.ra.WithLabelValues("advertised").Inc()
		}
	}
}

// listenNDP opens an NDP socket on ifname's link-local address that
// hears router solicitations only.
func listenNDP(ifname string) (*ndp.Conn, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, err
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterSolicitation)
	if err := c.SetICMPFilter(&f); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.JoinGroup(netip.MustParseAddr("ff02::2")); err != nil { // all routers
		c.Close()
		return nil, errors.Join(errors.New("joining ff02::2"), err)
	}
	return c, nil
}
