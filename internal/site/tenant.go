package site

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gaissmai/bart"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/deskway/deskway/internal/config"
)

// tenant is one routing domain. name, nsName, ifName, key and m are
// set by newTenant and never change; conf is swapped whole by a reload;
// ns, dev and created belong to up and down, which run before and after
// the forwarding goroutines.
type tenant struct {
	name, nsName, ifName string
	key                  uint32
	conf                 atomic.Pointer[tenantConf]
	// cfg is the configuration in force, read and written by New and
	// the reload alone.
	cfg config.Tenant
	// routes maps inner destinations to sites; learn swaps in a new
	// table whole, so the encapsulating loop reads it without a lock.
	routes atomic.Pointer[bart.Table[*peerSite]]
	// routeMu serializes learn's changes to routes and learnt prefixes.
	routeMu sync.Mutex
	m       *tenantMetrics
	extras  extras
	// onLearnt, set while the kernel datapath runs, puts what a route
	// source learnt into its maps.
	onLearnt atomic.Pointer[func() error]

	ns  netns.NsHandle
	dev tun.Device
	// gsoConn is dev's file when dev takes virtio-net headers (its
	// offloads are on), for superpackets (gso.go); else nil.
	gsoConn   syscall.RawConn
	linkIndex int // the device's, in ns
	created   bool
	devOnce   sync.Once
	closing   atomic.Bool
}

// tenantConf is what a reload may change in a running tenant: the
// forwarding loops read it without a lock, and a reload swaps it whole.
type tenantConf struct {
	mtu                int
	sequence, checksum bool
	sites              []*peerSite
	byPeer             map[netip.Addr]*peerSite
	// own are the tenant's hosted networks.
	own []netip.Prefix
}

// c is the tenant's configuration in force.
func (t *tenant) c() *tenantConf { return t.conf.Load() }

// peerSite is one of a tenant's sites. A reload that changes the site
// replaces it with another sharing its counters.
type peerSite struct {
	name     string
	peer     netip.Addr
	prefixes []netip.Prefix
	// learnt are the prefixes a route source learnt behind the site,
	// swapped whole by learn.
	learnt atomic.Pointer[[]netip.Prefix]
	// link carries packets to the site; set before the site is in force.
	link Link
	*siteCounters
}

// siteCounters are a site's, written by the forwarding loops and read by
// the admin API; they outlive a reload that changes the site.
type siteCounters struct {
	seq                                atomic.Uint32
	pktsIn, bytesIn, pktsOut, bytesOut atomic.Uint64
	keepalives                         atomic.Uint64 // GRE keepalives sent back
	lastIn                             atomic.Int64  // unix nanoseconds
}

// Link carries a tenant's packets to one of its sites: GRE over the
// underlay is one kind; an encrypted tunnel is another.
type Link interface {
	// Send sends the inner packets bufs[i][offset:]; the offset bytes
	// before each are the link's to write headers into.
	Send(bufs [][]byte, offset int) error
}

func newTenant(c *config.Tenant, m *metrics) (*tenant, error) {
	t := &tenant{name: c.Name, nsName: c.Namespace, ifName: c.Interface, key: c.Key, cfg: *c, m: m.tenant(c.Name), ns: -1}
	tc, err := newConf(c, nil)
	if err != nil {
		return nil, err
	}
	t.conf.Store(tc)
	t.routes.Store(t.table())
	return t, nil
}

// newConf reads a tenant's changeable configuration. A site of old that
// c keeps under the same name, peer and prefixes is kept as it is (its
// link, learnt prefixes and counters); one that changed keeps its
// counters.
func newConf(c *config.Tenant, old *tenantConf) (*tenantConf, error) {
	tc := &tenantConf{mtu: c.MTU, sequence: c.Sequence, checksum: c.Checksum, byPeer: map[netip.Addr]*peerSite{}}
	for _, p := range c.Prefixes {
		pf, err := netip.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("site: tenant %s: prefix %q: %w", c.Name, p, err)
		}
		tc.own = append(tc.own, pf)
	}
	for _, sc := range c.Sites {
		ip, err := netip.ParseAddr(sc.Peer)
		if err != nil {
			return nil, fmt.Errorf("site: tenant %s: peer %q: %w", c.Name, sc.Peer, err)
		}
		st := &peerSite{name: sc.Name, peer: ip, siteCounters: &siteCounters{}}
		st.learnt.Store(&[]netip.Prefix{})
		if st.name == "" {
			st.name = ip.String()
		}
		for _, p := range sc.Prefixes {
			pf, err := netip.ParsePrefix(p)
			if err != nil {
				return nil, fmt.Errorf("site: tenant %s: prefix %q: %w", c.Name, p, err)
			}
			st.prefixes = append(st.prefixes, pf)
		}
		if prev := old.site(st.name); prev != nil {
			if prev.peer == st.peer && slices.Equal(prev.prefixes, st.prefixes) {
				st = prev
			} else {
				st.siteCounters = prev.siteCounters
				st.learnt.Store(prev.learnt.Load())
			}
		}
		tc.sites = append(tc.sites, st)
		tc.byPeer[ip] = st
	}
	return tc, nil
}

// site is the site named name, or nil.
func (tc *tenantConf) site(name string) *peerSite {
	if tc == nil {
		return nil
	}
	for _, st := range tc.sites {
		if st.name == name {
			return st
		}
	}
	return nil
}

// onThread runs f on a thread of its own and then moves that thread
// back to the namespace it started in, whatever f did with it. A thread
// that could not be moved back is left locked, so that it ends with its
// goroutine instead of serving others in the wrong namespace.
func onThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("this thread's namespace: %w", err)
			return
		}
		defer orig.Close()
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// inNamespace runs f on a thread in ns: what f creates (a TUN device,
// a socket) belongs to ns.
func inNamespace(ns netns.NsHandle, f func() error) error {
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return fmt.Errorf("enter namespace: %w", err)
		}
		return f()
	})
}

// up opens (or creates) the namespace, creates the TUN device in it,
// turns forwarding on there and routes the sites' prefixes to the device.
func (t *tenant) up() (created bool, err error) {
	ns, err := netns.GetFromName(t.nsName)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("open namespace %s: %w", t.nsName, err)
		}
		// NewNamed moves the calling thread into the new namespace.
		err = onThread(func() error {
			ns, err = netns.NewNamed(t.nsName)
			return err
		})
		if err != nil {
			return false, fmt.Errorf("create namespace %s: %w", t.nsName, err)
		}
		t.created = true
	}
	t.ns = ns
	err = inNamespace(ns, func() error {
		dev, err := tun.CreateTUN(t.ifName, t.c().mtu)
		if err != nil {
			return fmt.Errorf("create TUN device %s: %w", t.ifName, err)
		}
		t.dev = dev
		// wireguard-go batches only when the device's offloads are on,
		// and so its packets carry virtio-net headers.
		if f, ok := dev.(fileDevice); ok && dev.BatchSize() > 1 {
			if t.gsoConn, err = f.File().SyscallConn(); err != nil {
				return fmt.Errorf("TUN device %s: %w", t.ifName, err)
			}
		}
		// The device reports up, down and MTU changes on a channel it
		// blocks on when full; the datapath needs none of them.
		go func() {
			for range dev.Events() {
			}
		}()
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte("1"), 0); err != nil {
				return fmt.Errorf("turn forwarding on: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return t.created, err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return t.created, fmt.Errorf("netlink in namespace %s: %w", t.nsName, err)
	}
	defer h.Close()
	if t.created {
		if lo, err := h.LinkByName("lo"); err == nil {
			_ = h.LinkSetUp(lo)
		}
	}
	link, err := h.LinkByName(t.ifName)
	if err != nil {
		return t.created, fmt.Errorf("find %s: %w", t.ifName, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return t.created, fmt.Errorf("set %s up: %w", t.ifName, err)
	}
	t.routeMu.Lock()
	t.linkIndex = link.Attrs().Index
	t.routeMu.Unlock()
	for _, st := range t.c().sites {
		for _, p := range st.prefixes {
			r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixNet(p), Scope: netlink.SCOPE_LINK}
			if err := h.RouteReplace(r); err != nil {
				return t.created, fmt.Errorf("route %s to %s: %w", p, t.ifName, err)
			}
		}
	}
	return t.created, nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// closeDevice closes the TUN device, which ends the encapsulating loop's
// read; the kernel removes the device and its routes with it.
func (t *tenant) closeDevice() {
	t.devOnce.Do(func() {
		t.closing.Store(true)
		if t.dev != nil {
			_ = t.dev.Close()
		}
	})
}

// down closes the device and deletes the namespace if up created it.
func (t *tenant) down() (deleted bool, err error) {
	t.routeMu.Lock()
	t.linkIndex = 0 // the device's routes go with it
	t.routeMu.Unlock()
	t.closeDevice()
	if t.ns >= 0 {
		t.ns.Close()
		t.ns = -1
	}
	if !t.created {
		return false, nil
	}
	if err := netns.DeleteNamed(t.nsName); err != nil {
		return false, fmt.Errorf("delete namespace %s: %w", t.nsName, err)
	}
	t.created = false
	return true, nil
}

// state is the site's state for the admin API: GRE has no handshake, so
// a site is up while its packets keep coming.
func (st *peerSite) state(now time.Time) string {
	last := st.lastIn.Load()
	if last == 0 || now.Sub(time.Unix(0, last)) > upWindow {
		return "down"
	}
	return "up"
}

// upWindow is how long a site stays up after its last packet.
const upWindow = 60 * time.Second
