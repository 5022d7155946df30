// Package kernelgre is deskway site's kernel datapath for GRE: two tc
// programs (gre.c, compiled by bpf2go into gre_bpfel.o) that encapsulate
// what a tenant routes to a site and decapsulate what a site sends, so
// the kernel segments a TCP superpacket once and no packet crosses into
// userspace. The package loads the programs, attaches them (tcx) and
// keeps their maps in step with the tenants' configuration.
package kernelgre

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// Datapath is the programs and their maps, loaded in the calling
// thread's network namespace (the underlay's).
type Datapath struct {
	objs  greObjects
	links map[attachPoint]link.Link
}

type attachPoint struct {
	ifindex int
	encap   bool
}

// Tunnel is one site of one tenant as the programs see it.
type Tunnel struct {
	// Index names the tunnel's counters and its site's prefixes; below
	// MaxTunnels, unique.
	Index uint32
	// Tenant is the tenant's index, as in Tenant.Index.
	Tenant uint32
	Local  netip.Addr // this gateway's underlay address (IPv4)
	Peer   netip.Addr // the site's (IPv4)
	Key    uint32
	// Underlay is the interface the peer is reached on.
	Underlay int
	// Sources are the inner sources the site may send from; Routes the
	// inner destinations the tenant routes to it.
	Sources, Routes []netip.Prefix
}

// Tenant is a tenant's veth as the programs see it: Ifindex is the
// underlay namespace's end, LocalMAC its hardware address and PeerMAC
// the tenant's end's.
type Tenant struct {
	Index             uint32
	Ifindex           int
	LocalMAC, PeerMAC net.HardwareAddr
}

// MaxTunnels bounds Tunnel.Index and Tenant.Index (the maps' sizes).
const MaxTunnels = 4096

// Counters are a tunnel's packets and bytes through the programs;
// packets count the segments a superpacket carries.
type Counters struct {
	PktsIn, BytesIn, PktsOut, BytesOut uint64
}

// Load loads the programs and makes their maps, empty.
func Load() (*Datapath, error) {
	// Kernels before 5.11 charge maps to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("lift the locked-memory limit: %w", err)
	}
	d := &Datapath{links: map[attachPoint]link.Link{}}
	if err := loadGreObjects(&d.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load the GRE programs: %+v", ve)
		}
		return nil, fmt.Errorf("load the GRE programs: %w", err)
	}
	return d, nil
}

// Close detaches the programs and frees the maps.
func (d *Datapath) Close() error {
	errs := []error{d.DetachAll()}
	errs = append(errs, d.objs.Close())
	return errors.Join(errs...)
}

// AttachUnderlay attaches decapsulation at the ingress of the underlay
// interface ifindex; AttachTenant attaches encapsulation at the ingress
// of a tenant's veth. Attaching twice is a no-op.
func (d *Datapath) AttachUnderlay(ifindex int) error { return d.attach(ifindex, false) }

// AttachTenant: see AttachUnderlay.
func (d *Datapath) AttachTenant(ifindex int) error { return d.attach(ifindex, true) }

func (d *Datapath) attach(ifindex int, encap bool) error {
	ap := attachPoint{ifindex, encap}
	if d.links[ap] != nil {
		return nil
	}
	prog := d.objs.Decap
	if encap {
		prog = d.objs.Encap
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Errorf("attach to interface %d: %w", ifindex, err)
	}
	d.links[ap] = l
	return nil
}

// Detach detaches whatever is attached to ifindex (an interface that
// went away takes its attachments with it).
func (d *Datapath) Detach(ifindex int) error {
	var errs []error
	for ap, l := range d.links {
		if ap.ifindex == ifindex {
			errs = append(errs, l.Close())
			delete(d.links, ap)
		}
	}
	return errors.Join(errs...)
}

// DetachAll detaches every program: packets take the stack's way (the
// userspace datapath's) from then on.
func (d *Datapath) DetachAll() error {
	var errs []error
	for ap, l := range d.links {
		errs = append(errs, l.Close())
		delete(d.links, ap)
	}
	return errors.Join(errs...)
}

// NoRoute sums over the CPUs what tenant index sent to no site
// (dropped).
func (d *Datapath) NoRoute(index uint32) (uint64, error) {
	var per []uint64
	if err := d.objs.NoRoute.Lookup(index, &per); err != nil {
		return 0, fmt.Errorf("drops of tenant %d: %w", index, err)
	}
	var n uint64
	for _, p := range per {
		n += p
	}
	return n, nil
}

// Counters sums tunnel index's counters over the CPUs.
func (d *Datapath) Counters(index uint32) (Counters, error) {
	var per []greCounters
	if err := d.objs.TunnelCounters.Lookup(index, &per); err != nil {
		return Counters{}, fmt.Errorf("counters of tunnel %d: %w", index, err)
	}
	var c Counters
	for _, p := range per {
		c.PktsIn += p.PktsIn
		c.BytesIn += p.BytesIn
		c.PktsOut += p.PktsOut
		c.BytesOut += p.BytesOut
	}
	return c, nil
}
