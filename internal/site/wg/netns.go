package wg

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"
)

// createTUN makes the TUN inside the tenant's namespace. Only the calling
// thread changes namespace, so the work runs on a goroutine locked to its
// thread; if the thread cannot be put back, the goroutine ends still
// locked and Go retires the thread instead of reusing it in the wrong
// namespace. Everything else in the process stays in the underlay.
func createTUN(nsPath, name string, mtu int) (tun.Device, error) {
	type result struct {
		dev tun.Device
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := netns.Get()
		if err != nil {
			done <- result{err: fmt.Errorf("wg: current namespace: %w", err)}
			runtime.UnlockOSThread()
			return
		}
		defer home.Close()
		target, err := netns.GetFromPath(nsPath)
		if err != nil {
			done <- result{err: fmt.Errorf("wg: open namespace %s: %w", nsPath, err)}
			runtime.UnlockOSThread()
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			done <- result{err: fmt.Errorf("wg: enter namespace %s: %w", nsPath, err)}
			runtime.UnlockOSThread()
			return
		}
		// The TUN's netlink listener and interface index are taken here,
		// in the tenant's namespace, where the interface lives.
		dev, err := tun.CreateTUN(name, mtu)
		if err := netns.Set(home); err != nil {
			if dev != nil {
				_ = dev.Close()
			}
			done <- result{err: fmt.Errorf("wg: return from namespace %s: %w", nsPath, err)}
			return // thread stays locked: Go ends it with the goroutine
		}
		runtime.UnlockOSThread()
		if err != nil {
			err = fmt.Errorf("wg: create TUN %s in %s: %w", name, nsPath, err)
		}
		done <- result{dev, err}
	}()
	r := <-done
	return r.dev, r.err
}

// nsTUN is the TUN seen from the underlay. wireguard-go asks a TUN for
// its MTU by name through a socket of the calling thread's namespace,
// where this interface does not exist; the MTU is the one we set.
type nsTUN struct {
	tun.Device
	mtu int
}

// MTU implements tun.Device.
func (t nsTUN) MTU() (int, error) { return t.mtu, nil }

// link drives the interface's addresses and routes in the tenant's
// namespace through a netlink handle bound to that namespace.
type link struct {
	h    *netlink.Handle
	link netlink.Link
}

func openLink(nsPath, name string) (*link, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("wg: open namespace %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("wg: netlink in %s: %w", nsPath, err)
	}
	l, err := h.LinkByName(name)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("wg: find %s in %s: %w", name, nsPath, err)
	}
	return &link{h: h, link: l}, nil
}

func (l *link) close() { l.h.Close() }

// up sets the interface's addresses and brings it up.
func (l *link) up(addrs []netip.Prefix) error {
	for _, a := range addrs {
		if err := l.h.AddrAdd(l.link, &netlink.Addr{IPNet: ipnet(a)}); err != nil {
			return fmt.Errorf("wg: address %s on %s: %w", a, l.link.Attrs().Name, err)
		}
	}
	if err := l.h.LinkSetUp(l.link); err != nil {
		return fmt.Errorf("wg: bring %s up: %w", l.link.Attrs().Name, err)
	}
	return nil
}

// route sends p through the interface (replacing a route to p that is
// already there, so a reload converges).
func (l *link) route(p netip.Prefix) error {
	if err := l.h.RouteReplace(l.routeTo(p)); err != nil {
		return fmt.Errorf("wg: route %s via %s: %w", p, l.link.Attrs().Name, err)
	}
	return nil
}

// unroute removes the route to p through the interface; a route already
// gone is no error.
func (l *link) unroute(p netip.Prefix) error {
	err := l.h.RouteDel(l.routeTo(p))
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("wg: remove route %s via %s: %w", p, l.link.Attrs().Name, err)
	}
	return nil
}

func (l *link) routeTo(p netip.Prefix) *netlink.Route {
	return &netlink.Route{LinkIndex: l.link.Attrs().Index, Dst: ipnet(p), Scope: netlink.SCOPE_LINK}
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
