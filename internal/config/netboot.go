package config

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

// Netboot is the stream role's boot services for machines with no disk:
// DHCP on the boot network, TFTP for iPXE, and HTTP for each device's
// iPXE script and its vDisk's kernel and initramfs.
type Netboot struct {
	// Interface is the boot network's interface, where DHCP listens.
	Interface string `yaml:"interface"`
	// Address is this server's IPv4 address on that network: the TFTP
	// and HTTP server devices are sent to.
	Address string `yaml:"address"`
	// HTTPPort serves the iPXE scripts, kernels and initramfs images.
	HTTPPort int `yaml:"http_port"`
	// DHCP is proxy (answer only PXE clients, beside the network's own
	// DHCP server, which hands out the addresses) or full (hand out
	// addresses from Pool on a boot network of its own).
	DHCP string       `yaml:"dhcp"`
	Pool *NetbootPool `yaml:"pool"`
	// IPXEDir holds the iPXE first stages a firmware PXE client loads
	// over TFTP: undionly.kpxe (BIOS) and ipxe.efi (UEFI), from Debian's
	// ipxe package.
	IPXEDir string `yaml:"ipxe_dir"`
	// Servers are the stream servers (host:port) a device's root disk
	// connects to, first first; empty means this one (Address and the
	// port of stream.listen).
	Servers []string `yaml:"servers"`
	// AutoAdd, when set, registers an unknown machine as a device of this
	// collection on its first boot, disabled until an administrator
	// assigns it a vDisk.
	AutoAdd string `yaml:"auto_add"`
	// RouterAdvertisements answers IPv6 router solicitations with an
	// advertisement that offers nothing (router lifetime 0), so that iPXE
	// stops waiting for an IPv6 router, about 18 s of every boot on a
	// network without one. On by default with dhcp: full (a boot network
	// of deskway's own), off with dhcp: proxy, whose network has its own
	// routers.
	RouterAdvertisements *bool `yaml:"router_advertisements"`
	// SecureBoot sends x86-64 UEFI PXE clients the chain Debian signs
	// (shim, signed by Microsoft's UEFI CA; GRUB, signed by Debian) in
	// place of ipxe.efi, which firmware with Secure Boot on refuses.
	SecureBoot bool `yaml:"secure_boot"`
	// Shim and Grub are that chain's first two stages, from Debian's
	// shim-signed and grub-efi-amd64-signed packages.
	Shim string `yaml:"shim"`
	Grub string `yaml:"grub"`
}

// NetbootPool is the addresses a full DHCP server hands out.
type NetbootPool struct {
	Start   string   `yaml:"start"`
	End     string   `yaml:"end"`
	Netmask string   `yaml:"netmask"`
	Router  string   `yaml:"router"`
	Lease   Duration `yaml:"lease"`
}

func netbootDefaults(n *Netboot) {
	setDefault(&n.HTTPPort, 8069)
	setDefault(&n.DHCP, "proxy")
	setDefault(&n.IPXEDir, "/usr/lib/ipxe")
	setDefault(&n.Shim, "/usr/lib/shim/shimx64.efi.signed")
	setDefault(&n.Grub, "/usr/lib/grub/x86_64-efi-signed/grubnetx64.efi.signed")
	if n.RouterAdvertisements == nil {
		on := n.DHCP == "full"
		n.RouterAdvertisements = &on
	}
	if n.Pool != nil {
		setDefault(&n.Pool.Netmask, "255.255.255.0")
		setDefault(&n.Pool.Lease, Duration(time.Hour))
	}
}

func validateNetboot(n *Netboot, st *Stream, bad func(string, string, ...any)) {
	if n.Interface == "" {
		bad("stream.netboot.interface", "name the boot network's interface (DHCP listens there)")
	}
	addr, err := netip.ParseAddr(n.Address)
	if err != nil || !addr.Is4() {
		bad("stream.netboot.address", "%q is not this server's IPv4 address on the boot network", n.Address)
	}
	if n.HTTPPort < 1 || n.HTTPPort > 65535 {
		bad("stream.netboot.http_port", "%d is not a port", n.HTTPPort)
	}
	switch n.DHCP {
	case "proxy":
		if n.Pool != nil {
			bad("stream.netboot.pool", "is for dhcp: full; a proxy leaves addresses to the network's DHCP server")
		}
	case "full":
		if n.Pool == nil {
			bad("stream.netboot.pool", "dhcp: full hands out addresses: give pool.start and pool.end")
			break
		}
		validatePool(n.Pool, addr, bad)
	default:
		bad("stream.netboot.dhcp", "%q is not proxy or full", n.DHCP)
	}
	for i, s := range n.Servers {
		checkDial(bad, fmt.Sprintf("stream.netboot.servers[%d]", i), s)
	}
	if len(n.Servers) > 1 && !st.SharedCache {
		// Another server would not know a boot it never saw, and would
		// serve it the vDisk with none of its writes.
		bad("stream.netboot.servers", "a device moves to the next server when its own is lost, and keeps its writes only if every server keeps write caches on one store: set stream.shared_cache, with stream.store on storage the servers share")
	}
	if len(n.Servers) == 0 {
		if host, _, err := net.SplitHostPort(st.Listen); err == nil && host != "" {
			if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() && a.String() != n.Address {
				bad("stream.netboot.servers", "stream.listen (%s) is not on %s, so devices could not reach it: list the servers, or listen on the boot network", st.Listen, n.Address)
			}
		}
	}
	if n.SecureBoot {
		for _, f := range []struct{ key, path, pkg string }{{"shim", n.Shim, "shim-signed"}, {"grub", n.Grub, "grub-efi-amd64-signed"}} {
			if fi, err := os.Stat(f.path); err != nil || !fi.Mode().IsRegular() {
				bad("stream.netboot."+f.key, "%s is not a readable file: secure_boot needs Debian's %s package installed, or the path of that file", f.path, f.pkg)
			}
		}
	}
	if st.Clients == "certificate" {
		bad("stream.clients", "a network-booted device holds no client certificate: stream.netboot needs stream.clients: open (see the trust model in docs/netboot.md)")
	}
	for i, v := range st.VDisks {
		if (v.Kernel == "") != (v.Initrd == "") {
			bad(fmt.Sprintf("stream.vdisks[%d]", i), "give both kernel and initrd, or neither (a vDisk without them does not network-boot)")
		}
		for _, f := range []struct{ key, path string }{{"kernel", v.Kernel}, {"initrd", v.Initrd}} {
			if f.path == "" {
				continue
			}
			if fi, err := os.Stat(f.path); err != nil || !fi.Mode().IsRegular() {
				bad(fmt.Sprintf("stream.vdisks[%d].%s", i, f.key), "%s is not a readable file", f.path)
			}
		}
	}
}

func validatePool(p *NetbootPool, server netip.Addr, bad func(string, string, ...any)) {
	start, err1 := netip.ParseAddr(p.Start)
	end, err2 := netip.ParseAddr(p.End)
	if err1 != nil || err2 != nil || !start.Is4() || !end.Is4() || end.Less(start) {
		bad("stream.netboot.pool", "start %q and end %q must be IPv4 addresses, start first", p.Start, p.End)
		return
	}
	mask := net.ParseIP(p.Netmask).To4()
	if mask == nil {
		bad("stream.netboot.pool.netmask", "%q is not an IPv4 netmask", p.Netmask)
		return
	}
	ones, bits := net.IPMask(mask).Size()
	if bits == 0 {
		bad("stream.netboot.pool.netmask", "%q is not a contiguous netmask", p.Netmask)
		return
	}
	pfx := netip.PrefixFrom(server, ones).Masked()
	if server.IsValid() && (!pfx.Contains(start) || !pfx.Contains(end)) {
		bad("stream.netboot.pool", "%s-%s is not in %s, the server's network", p.Start, p.End, pfx)
	}
	if server.IsValid() && !server.Less(start) && !end.Less(server) {
		bad("stream.netboot.pool", "the range %s-%s holds the server's own address %s", p.Start, p.End, server)
	}
	if p.Router != "" {
		if r, err := netip.ParseAddr(p.Router); err != nil || !r.Is4() {
			bad("stream.netboot.pool.router", "%q is not an IPv4 address", p.Router)
		}
	}
	if p.Lease.D() < time.Minute {
		bad("stream.netboot.pool.lease", "must be at least 1m")
	}
}
