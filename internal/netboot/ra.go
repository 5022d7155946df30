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
// offers nothing (no prefix, no DHCPv6, a router lifetime of 0 so that no
// machine takes deskway as its router, and no hop limit of its own),
// which ends iPXE's wait at once. Where another router advertises on the
// network, deskway falls silent and leaves router discovery to it.

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

// raCheck is how often an idle responder makes sure its interface and
// address are still the ones it listens on (a bridge deleted and made
// again has a new index; an address can change).
const raCheck = 30 * time.Second

// raQuiet is how long deskway stays silent after hearing another
// router's advertisement.
const raQuiet = 30 * time.Minute

// ICMPv6 types (RFC 4861).
const (
	icmpRouterSolicitation  = 133
	icmpRouterAdvertisement = 134
)

// serveRouterSolicitations answers router solicitations on ifname until
// ctx ends, listening again whenever the interface or its address
// changes or the socket fails: it never ends the boot services.
func (s *Service) serveRouterSolicitations(ctx context.Context, ifname string) error {
	for said := false; ctx.Err() == nil; {
		c, addr, err := listenNDP(ifname)
		if err != nil {
			if !said {
				said = true
				s.log.Info("router solicitations are answered once the boot network's interface has an IPv6 link-local address", "interface", ifname, "reason", err)
			}
		} else {
			said = false
			s.log.Info("answering IPv6 router solicitations on the boot network (router lifetime 0: iPXE stops waiting for an IPv6 router)", "interface", ifname, "address", addr)
			err = s.answerSolicitations(ctx, c, ifname, addr)
			c.Close()
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("router solicitations: listening again", "interface", ifname, "reason", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(raRetry):
		}
	}
	return nil
}

// answerSolicitations serves one socket until it fails, the interface or
// address changes, or ctx ends.
func (s *Service) answerSolicitations(ctx context.Context, c *ndp.Conn, ifname string, addr netip.Addr) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return err
	}
	ra := &ndp.RouterAdvertisement{}
	if len(ifi.HardwareAddr) == 6 {
		ra.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Source, Addr: ifi.HardwareAddr}}
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	// One reader, one packet at a time: anyone on the boot network can
	// send solicitations, and many in a gap cost one answer.
	solicited := make(chan struct{}, 1)
	failed := make(chan error, 1)
	var quietUntil time.Time // the reader's alone
	quiet := make(chan time.Time, 1)
	go func() {
		buf := make([]byte, 1500)
		for {
			_ = c.SetReadDeadline(time.Now().Add(raCheck))
			n, cm, src, err := c.ReadRaw(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if err := sameInterface(ifname, ifi.Index, addr); err != nil {
					failed <- err
					return
				}
				continue
			}
			if err != nil {
				failed <- err
				return
			}
			// RFC 4861 §6.1: hop limit 255 (never forwarded), code 0.
			if n < 8 || buf[1] != 0 || cm == nil || cm.HopLimit != 255 || src.WithZone("") == addr.WithZone("") {
				continue
			}
			switch buf[0] {
			case icmpRouterSolicitation:
				s.m.ra.WithLabelValues("solicited").Inc()
				if time.Now().Before(quietUntil) {
					continue
				}
				select {
				case solicited <- struct{}{}:
				default:
				}
			case icmpRouterAdvertisement:
				// Another router: if it offers anything, it answers
				// solicitations itself, and ours would only contradict it.
				m, err := ndp.ParseMessage(buf[:n])
				if other, ok := m.(*ndp.RouterAdvertisement); err == nil && ok && offers(other) {
					if time.Now().After(quietUntil) {
						select {
						case quiet <- time.Now():
						default:
						}
					}
					quietUntil = time.Now().Add(raQuiet)
				}
			}
		}
	}()
	var last time.Time
	var pending <-chan time.Time
	for {
		select {
		case err := <-failed:
			return err
		case <-quiet:
			s.m.ra.WithLabelValues("other_router").Inc()
			s.log.Warn("another IPv6 router advertises on the boot network: deskway stops answering router solicitations there for a while", "interface", ifname, "quiet_for", raQuiet)
			pending = nil
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
				return fmt.Errorf("router advertisement not sent: %w", err)
			}
			s.m.ra.WithLabelValues("advertised").Inc()
		}
	}
}

// offers says an advertisement makes its sender a router or hands out
// addresses or configuration.
func offers(ra *ndp.RouterAdvertisement) bool {
	if ra.RouterLifetime > 0 || ra.ManagedConfiguration || ra.OtherConfiguration {
		return true
	}
	for _, o := range ra.Options {
		if _, ok := o.(*ndp.PrefixInformation); ok {
			return true
		}
	}
	return false
}

// sameInterface says whether ifname still has index and address addr.
func sameInterface(ifname string, index int, addr netip.Addr) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return err
	}
	if ifi.Index != index {
		return fmt.Errorf("%s was made again (index %d, was %d)", ifname, ifi.Index, index)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == addr.WithZone("") {
			return nil
		}
	}
	return fmt.Errorf("%s no longer has %s", ifname, addr)
}

// listenNDP opens an NDP socket on ifname's link-local address that
// hears router solicitations and other routers' advertisements, with
// their hop limits.
func listenNDP(ifname string) (*ndp.Conn, netip.Addr, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	c, addr, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		return nil, netip.Addr{}, err
	}
	var f ipv6.ICMPFilter
	f.SetAll(true)
	f.Accept(ipv6.ICMPTypeRouterSolicitation)
	f.Accept(ipv6.ICMPTypeRouterAdvertisement)
	for _, err := range []error{
		c.SetICMPFilter(&f),
		c.SetControlMessage(ipv6.FlagHopLimit, true),
		c.JoinGroup(netip.MustParseAddr("ff02::2")), // all routers
	} {
		if err != nil {
			c.Close()
			return nil, netip.Addr{}, err
		}
	}
	return c, addr, nil
}
