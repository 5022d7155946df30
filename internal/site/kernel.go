package site

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/deskway/deskway/internal/site/kernelgre"
)

// kernelPath is the kernel datapath (package kernelgre) beside the
// userspace one: each tenant gets a veth into its namespace, and the
// prefixes of its GRE sites that the programs can carry are routed to
// it instead of to the TUN device. The TUN device and the raw socket
// stay: they carry what the programs leave to the stack (sites over
// IPv6, tenants with GRE sequence numbers or checksums, keepalives,
// routes learnt over BGP, and every bad datagram, dropped and counted
// as without the programs).
type kernelPath struct {
	log *slog.Logger
	dp  *kernelgre.Datapath

	mu sync.Mutex
	// tenants and tunnels are the indexes given out, by tenant name and
	// by tenant and site name; kept for the process's life, so counters
	// never pass from one to another.
	tenants map[string]uint32
	tunnels map[[2]string]uint32
	veths   map[string]kernelgre.Tenant // by tenant name
	// carried are the tenant and site names the maps hold now.
	carried map[[2]string]bool
	// attached are the underlay interfaces with the decapsulating program.
	underlays map[int]bool
	// read is each tunnel's counters as last added to the site's, and
	// readNoRoute each tenant's drops.
	read        map[uint32]kernelgre.Counters
	readNoRoute map[uint32]uint64
	active      bool
}

// vethGateway is the next hop a tenant's namespace routes GRE sites'
// prefixes through: no address of the underlay namespace, only a
// permanent neighbour entry naming the veth's other end, so nothing is
// resolved and no address is spent.
var (
	vethGateway4 = net.IPv4(169, 254, 0, 1)
	vethGateway6 = net.ParseIP("fe80::1")
)

// greOverhead is what the programs put before an inner packet: an IPv4
// header and GRE with a key.
const greOverhead = 20 + 8

// vethName is tenant t's veth, the same name at both ends.
func vethName(t *tenant) string { return fmt.Sprintf("dwk%x", t.key) }

// startKernel loads the programs as the configuration asks: never for
// userspace; for kernel, or by default where the kernel takes them.
func (s *Server) startKernel() error {
	mode := s.cfg.Datapath
	if mode == "userspace" || !s.kernelEligible() {
		return nil
	}
	dp, err := kernelgre.Load()
	if err == nil {
		// tcx came with Linux 6.6: try it on the loopback device before
		// anything is made.
		if err = dp.AttachUnderlay(1); err == nil {
			err = dp.Detach(1)
		}
		if err != nil {
			_ = dp.Close()
		}
	}
	if err != nil {
		if mode == "kernel" {
			return fmt.Errorf("site: datapath kernel: this kernel does not take deskway's GRE programs (BPF, tc): %w", err)
		}
		s.log.Warn("the kernel datapath is unavailable, GRE runs in userspace", "error", err)
		return nil
	}
	s.kp = &kernelPath{log: s.log, dp: dp, tenants: map[string]uint32{}, tunnels: map[[2]string]uint32{},
		veths: map[string]kernelgre.Tenant{}, underlays: map[int]bool{}, read: map[uint32]kernelgre.Counters{}, readNoRoute: map[uint32]uint64{}}
	if err := s.kernelSync(); err != nil {
		return err
	}
	if s.ha == nil {
		return s.kp.setActive(true)
	}
	s.ha.kernel = s.kp.setActive
	return nil
}

// kernelEligible tells whether the kernel datapath has anything to
// carry: an IPv4 underlay address.
func (s *Server) kernelEligible() bool {
	for _, a := range s.locals {
		if a.Is4() {
			return true
		}
	}
	return false
}

func (s *Server) local4() netip.Addr {
	for _, a := range s.locals {
		if a.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

// kernelSync makes every tenant's veth and routes and puts the
// programs' maps in step with the tenants in force; a reload calls it
// again.
func (s *Server) kernelSync() error {
	kp := s.kp
	if kp == nil {
		return nil
	}
	kp.mu.Lock()
	defer kp.mu.Unlock()
	var tenants []kernelgre.Tenant
	var tunnels []kernelgre.Tunnel
	var errs []error
	kp.carried = map[[2]string]bool{}
	resync := s.kernelSync
	for _, t := range s.set.Load().list {
		t.onLearnt.Store(&resync)
		tc := t.c()
		if tc.sequence || tc.checksum || t.ns < 0 {
			continue // the programs send neither
		}
		idx, ok := kp.tenants[t.name]
		if !ok {
			idx = uint32(len(kp.tenants) + 1)
			kp.tenants[t.name] = idx
		}
		v, ok := kp.veths[t.name]
		if !ok {
			var err error
			if v, err = kp.makeVeth(t, idx); err != nil {
				errs = append(errs, fmt.Errorf("site: tenant %s: %w", t.name, err))
				continue
			}
			kp.veths[t.name] = v
		}
		tenants = append(tenants, v)
		for _, st := range tc.sites {
			if !st.peer.Is4() {
				continue
			}
			rs, err := netlink.RouteGet(st.peer.AsSlice())
			if err != nil || len(rs) == 0 {
				kp.log.Warn("no route to the site's peer: its GRE runs in userspace", "tenant", t.name, "site", st.name, "error", err)
				continue
			}
			// The programs cannot fragment: a tunnel packet must fit the
			// underlay whole, or its site stays with the userspace
			// datapath, whose raw socket lets the kernel fragment.
			if ul, err := netlink.LinkByIndex(rs[0].LinkIndex); err != nil || tc.mtu+greOverhead > ul.Attrs().MTU {
				kp.log.Info("the tunnel's MTU and GRE do not fit the underlay's MTU: the site's GRE runs in userspace", "tenant", t.name, "site", st.name, "mtu", tc.mtu)
				continue
			}
			key := [2]string{t.name, st.name}
			ti, ok := kp.tunnels[key]
			if !ok {
				ti = uint32(len(kp.tunnels) + 1)
				kp.tunnels[key] = ti
			}
			if ti >= kernelgre.MaxTunnels || idx >= kernelgre.MaxTunnels {
				errs = append(errs, fmt.Errorf("site: more than %d GRE sites for the kernel datapath", kernelgre.MaxTunnels-1))
				continue
			}
			kp.carried[key] = true
			tunnels = append(tunnels, kernelgre.Tunnel{Index: ti, Tenant: idx, Local: s.local4(), Peer: st.peer, Key: t.key,
				Underlay: rs[0].LinkIndex, Sources: append(slices.Clone(st.prefixes), *st.learnt.Load()...), Routes: st.prefixes})
			if err := routeVeth(t, v, st.prefixes); err != nil {
				errs = append(errs, fmt.Errorf("site: tenant %s: %w", t.name, err))
			}
			if kp.active && !kp.underlays[rs[0].LinkIndex] {
				if err := kp.dp.AttachUnderlay(rs[0].LinkIndex); err != nil {
					errs = append(errs, fmt.Errorf("site: %w", err))
				}
			}
			kp.underlays[rs[0].LinkIndex] = true
		}
	}
	if err := kp.dp.Sync(tenants, tunnels); err != nil {
		errs = append(errs, fmt.Errorf("site: the kernel datapath's maps: %w", err))
	}
	// Attached once the maps know the veths.
	for _, v := range tenants {
		if err := kp.dp.AttachTenant(v.Ifindex); err != nil {
			errs = append(errs, fmt.Errorf("site: %w", err))
		}
	}
	return errors.Join(errs...)
}

// makeVeth makes tenant t's veth, its end in the tenant's namespace up,
// with the permanent neighbour entries its routes go through.
func (kp *kernelPath) makeVeth(t *tenant, idx uint32) (kernelgre.Tenant, error) {
	name := vethName(t)
	if old, err := netlink.LinkByName(name); err == nil {
		_ = netlink.LinkDel(old) // left by a process that was killed
	}
	la := netlink.NewLinkAttrs()
	la.Name, la.MTU = name, t.c().mtu
	v := &netlink.Veth{LinkAttrs: la, PeerName: name, PeerNamespace: netlink.NsFd(int(t.ns))}
	if err := netlink.LinkAdd(v); err != nil {
		return kernelgre.Tenant{}, fmt.Errorf("make the veth %s: %w", name, err)
	}
	local, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetUp(local)
	}
	if err != nil {
		return kernelgre.Tenant{}, fmt.Errorf("veth %s: %w", name, err)
	}
	h, err := netlink.NewHandleAt(t.ns)
	if err != nil {
		return kernelgre.Tenant{}, fmt.Errorf("netlink in namespace %s: %w", t.nsName, err)
	}
	defer h.Close()
	peer, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetMTU(peer, t.c().mtu)
	}
	if err == nil {
		err = h.LinkSetUp(peer)
	}
	if err != nil {
		return kernelgre.Tenant{}, fmt.Errorf("veth %s in namespace %s: %w", name, t.nsName, err)
	}
	for _, gw := range []net.IP{vethGateway4, vethGateway6} {
		fam := netlink.FAMILY_V4
		if gw.To4() == nil {
			fam = netlink.FAMILY_V6
		}
		n := &netlink.Neigh{LinkIndex: peer.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: local.Attrs().HardwareAddr}
		if err := h.NeighSet(n); err != nil {
			return kernelgre.Tenant{}, fmt.Errorf("neighbour %s on %s in namespace %s: %w", gw, name, t.nsName, err)
		}
	}
	return kernelgre.Tenant{Index: idx, Ifindex: local.Attrs().Index, LocalMAC: local.Attrs().HardwareAddr, PeerMAC: peer.Attrs().HardwareAddr}, nil
}

// routeVeth routes prefixes to the veth in t's namespace, replacing
// their routes to the TUN device.
func routeVeth(t *tenant, v kernelgre.Tenant, prefixes []netip.Prefix) error {
	h, err := netlink.NewHandleAt(t.ns)
	if err != nil {
		return fmt.Errorf("netlink in namespace %s: %w", t.nsName, err)
	}
	defer h.Close()
	peer, err := h.LinkByName(vethName(t))
	if err != nil {
		return fmt.Errorf("veth in namespace %s: %w", t.nsName, err)
	}
	for _, p := range prefixes {
		gw := vethGateway4
		if p.Addr().Is6() {
			gw = vethGateway6
		}
		r := &netlink.Route{LinkIndex: peer.Attrs().Index, Dst: prefixNet(p), Gw: gw, Flags: int(netlink.FLAG_ONLINK)}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s to the veth: %w", p, err)
		}
	}
	return nil
}

// setActive attaches decapsulation to the underlay (the gateway is
// the active one, or alone) or detaches it (passive). Encapsulation stays
// attached to the tenants' veths throughout: what a tenant sends is
// never left to the underlay namespace's stack, and a passive gateway
// sends what reaches it as the userspace datapath does.
func (kp *kernelPath) setActive(on bool) error {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	kp.active = on
	var errs []error
	for i := range kp.underlays {
		if on {
			errs = append(errs, kp.dp.AttachUnderlay(i))
		} else {
			errs = append(errs, kp.dp.Detach(i))
		}
	}
	return errors.Join(errs...)
}

// forget deletes a removed tenant's veth (its namespace may stay).
func (kp *kernelPath) forget(t *tenant) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	v, ok := kp.veths[t.name]
	if !ok {
		return
	}
	delete(kp.veths, t.name)
	_ = kp.dp.Detach(v.Ifindex)
	if l, err := netlink.LinkByIndex(v.Ifindex); err == nil {
		_ = netlink.LinkDel(l)
	}
}

// counters adds what the programs counted since the last call to the
// sites' counters and the tenants' metrics.
func (s *Server) kernelCounters() {
	kp := s.kp
	if kp == nil {
		return
	}
	kp.mu.Lock()
	defer kp.mu.Unlock()
	now := time.Now().UnixNano()
	for _, t := range s.set.Load().list {
		if ti, ok := kp.tenants[t.name]; ok {
			if n, err := kp.dp.NoRoute(ti); err == nil {
				t.m.dropN(dropNoRoute, n-kp.readNoRoute[ti])
				kp.readNoRoute[ti] = n
			}
		}
		for _, st := range t.c().sites {
			ti, ok := kp.tunnels[[2]string{t.name, st.name}]
			if !ok {
				continue
			}
			c, err := kp.dp.Counters(ti)
			if err != nil {
				continue
			}
			last := kp.read[ti]
			kp.read[ti] = c
			d := kernelgre.Counters{PktsIn: c.PktsIn - last.PktsIn, BytesIn: c.BytesIn - last.BytesIn,
				PktsOut: c.PktsOut - last.PktsOut, BytesOut: c.BytesOut - last.BytesOut}
			if d.PktsIn > 0 {
				st.lastIn.Store(now)
			}
			st.pktsIn.Add(d.PktsIn)
			st.bytesIn.Add(d.BytesIn)
			st.pktsOut.Add(d.PktsOut)
			st.bytesOut.Add(d.BytesOut)
			t.m.pktsIn.Add(float64(d.PktsIn))
			t.m.bytesIn.Add(float64(d.BytesIn))
			t.m.pktsOut.Add(float64(d.PktsOut))
			t.m.bytesOut.Add(float64(d.BytesOut))
		}
	}
}

// close detaches the programs and deletes the veths (a namespace
// deskway created takes its end along).
func (kp *kernelPath) close() {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	for name, v := range kp.veths {
		if l, err := netlink.LinkByIndex(v.Ifindex); err == nil {
			_ = netlink.LinkDel(l)
		}
		delete(kp.veths, name)
	}
	if err := kp.dp.Close(); err != nil {
		kp.log.Warn("closing the kernel datapath", "error", err)
	}
}

// kernelCountersLoop adds the programs' counts to the metrics every
// second until stop closes (the admin API adds them when it reads them
// too).
func (s *Server) kernelCountersLoop(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			s.mu.Lock()
			s.kernelCounters()
			s.mu.Unlock()
		}
	}
}

// kernelCarries is "kernel" while the programs carry site st of t
// (its traffic in once the gateway is active), else "userspace".
func (s *Server) kernelCarries(t *tenant, st *peerSite) string {
	kp := s.kp
	if kp == nil {
		return "userspace"
	}
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.carried[[2]string{t.name, st.name}] {
		return "kernel"
	}
	return "userspace"
}
