package netboot

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// pxeStages are the iPXE builds a firmware's PXE client loads over
// TFTP, by its architecture (RFC 4578 option 93; IANA's processor
// architecture types); a client without option 93 is a BIOS one.
// undionly.kpxe and ipxe.efi are Debian's ipxe package's names,
// ipxe-arm64.efi the usual one for iPXE's bin-arm64-efi/ipxe.efi.
var pxeStages = map[iana.Arch]string{
	iana.INTEL_X86PC: "undionly.kpxe",
	iana.EFI_X86_64:  "ipxe.efi",
	// 9 is x86-64 UEFI in RFC 4578 as published (errata 4354 and IANA
	// swap 7 and 9); firmware of both readings is in use.
	iana.EFI_BC:    "ipxe.efi",
	iana.EFI_ARM64: "ipxe-arm64.efi",
}

// httpBootStages are the iPXE builds a UEFI HTTP Boot client loads
// over HTTP, by its architecture (the "boot from HTTP" types).
var httpBootStages = map[iana.Arch]string{
	iana.EFI_X86_64_HTTP: "ipxe.efi",
	iana.EFI_ARM64_HTTP:  "ipxe-arm64.efi",
}

// pxeNoDiscovery is option 43 with PXE_DISCOVERY_CONTROL (sub-option 6)
// bit 3 set: "the boot file in this offer is the one to load", in a full
// DHCP server's answers to PXE clients. Without it, a UEFI PXE client
// (EDK2) takes an offer with class PXEClient for a BINL offer and asks
// port 4011 for its boot file, where no full DHCP server listens.
var pxeNoDiscovery = []byte{6, 1, 8, 255}

// boot is what the DHCP answers tell a PXE client to load.
type boot struct {
	server   net.IP // TFTP and HTTP server
	httpPort int
	// secureBoot sends x86-64 UEFI PXE clients shim, not ipxe.efi.
	secureBoot bool
}

// isPXE says the client is a network-boot firmware or iPXE.
func isPXE(m *dhcpv4.DHCPv4) bool {
	return strings.HasPrefix(m.ClassIdentifier(), "PXEClient")
}

// isHTTPBoot says the client is a UEFI HTTP Boot firmware, which loads
// its boot file from the URL the answer names.
func isHTTPBoot(m *dhcpv4.DHCPv4) bool {
	return strings.HasPrefix(m.ClassIdentifier(), "HTTPClient")
}

// isIPXE says the client is iPXE, which fetches its script over HTTP; a
// firmware PXE client first loads iPXE over TFTP.
func isIPXE(m *dhcpv4.DHCPv4) bool {
	return bytes.Contains(m.Options.Get(dhcpv4.OptionUserClassInformation), []byte("iPXE"))
}

// file is the boot file for m: the iPXE script's URL for iPXE, the iPXE
// first stage of its architecture for a firmware (a URL for HTTP Boot),
// and "" for an architecture deskway has no first stage for.
func (b boot) file(m *dhcpv4.DHCPv4) string {
	if isIPXE(m) {
		return fmt.Sprintf("http://%s:%d/netboot/boot.ipxe", b.server, b.httpPort)
	}
	arch := iana.INTEL_X86PC
	if a := m.ClientArch(); len(a) > 0 {
		arch = a[0]
	}
	if isHTTPBoot(m) {
		if name, ok := httpBootStages[arch]; ok {
			return fmt.Sprintf("http://%s:%d/netboot/%s", b.server, b.httpPort, name)
		}
		return ""
	}
	if b.secureBoot && (arch == iana.EFI_X86_64 || arch == iana.EFI_BC) {
		return sbShim
	}
	return pxeStages[arch]
}

// class is the vendor class (option 60) an answer to m carries: the
// client's own kind, which EDK2 requires of an answer it boots from.
func class(m *dhcpv4.DHCPv4) string {
	if isHTTPBoot(m) {
		return "HTTPClient"
	}
	return "PXEClient"
}

// proxyReply answers m as a proxyDHCP server (RFC 4578, PXE 2.1): boot
// options only, no address, for PXE and UEFI HTTP Boot clients only;
// nil means no answer. Port 67 gets DISCOVERs, port 4011 REQUESTs (PXE
// clients ask there; HTTP Boot clients take the offer as it is).
func (b boot) proxyReply(m *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	if !isPXE(m) && !isHTTPBoot(m) {
		return nil
	}
	file := b.file(m)
	if file == "" {
		return nil
	}
	var t dhcpv4.MessageType
	switch m.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		t = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest, dhcpv4.MessageTypeInform:
		t = dhcpv4.MessageTypeAck
	default:
		return nil
	}
	r, err := dhcpv4.NewReplyFromRequest(m, dhcpv4.WithMessageType(t), dhcpv4.WithServerIP(b.server),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(b.server)), dhcpv4.WithOption(dhcpv4.OptClassIdentifier(class(m))))
	if err != nil {
		return nil
	}
	r.YourIPAddr = net.IPv4zero
	r.BootFileName = file
	return r
}

// Pool hands out the addresses of a full DHCP server, one per MAC, and
// keeps them in a file so that a restarted server gives no device's
// address to another.
type Pool struct {
	path       string
	start, end netip.Addr
	lease      time.Duration
	mu         sync.Mutex
	leases     map[string]lease // by MAC
	// offers hold an offered address for its MAC a little while, so
	// that machines powered on together are not offered the same one.
	offers map[string]lease
}

// offerHold is how long an offered address waits for its REQUEST.
const offerHold = 30 * time.Second

type lease struct {
	IP      netip.Addr `json:"ip"`
	Expires time.Time  `json:"expires"`
}

// OpenPool reads the leases at path (none when missing) for the range
// start-end.
func OpenPool(path string, start, end netip.Addr, leaseTime time.Duration) (*Pool, error) {
	p := &Pool{path: path, start: start, end: end, lease: leaseTime, leases: map[string]lease{}, offers: map[string]lease{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netboot: leases %s: %w", path, err)
	}
	if err := json.Unmarshal(b, &p.leases); err != nil {
		return nil, fmt.Errorf("netboot: leases %s is not what deskway writes (%w): move it away to start with no leases", path, err)
	}
	for m, l := range p.leases {
		if !p.inRange(l.IP) {
			delete(p.leases, m) // the pool was narrowed
		}
	}
	return p, nil
}

func (p *Pool) inRange(a netip.Addr) bool { return !a.Less(p.start) && !p.end.Less(a) }

// errPoolFull says every address is leased and none has expired.
var errPoolFull = errors.New("every address of the pool is leased")

// offer returns the address for mac: its lease's, or the lowest free
// one (an expired lease's address is free).
func (p *Pool) offer(mac string, now time.Time) (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.leases[mac]; ok && p.inRange(l.IP) {
		return l.IP, nil
	}
	if o, ok := p.offers[mac]; ok && o.Expires.After(now) {
		return o.IP, nil
	}
	used := map[netip.Addr]bool{}
	for _, m := range []map[string]lease{p.leases, p.offers} {
		for _, l := range m {
			if l.Expires.After(now) {
				used[l.IP] = true
			}
		}
	}
	for a := p.start; !p.end.Less(a); a = a.Next() {
		if !used[a] {
			for m, o := range p.offers {
				if !o.Expires.After(now) {
					delete(p.offers, m)
				}
			}
			p.offers[mac] = lease{IP: a, Expires: now.Add(offerHold)}
			return a, nil
		}
	}
	return netip.Addr{}, errPoolFull
}

// bind leases ip to mac until now plus the lease time, if ip is in the
// range and no other MAC holds it.
func (p *Pool) bind(mac string, ip netip.Addr, now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.inRange(ip) {
		return fmt.Errorf("%s is not in the pool", ip)
	}
	for m, l := range p.leases {
		if m != mac && l.IP == ip {
			if l.Expires.After(now) {
				return fmt.Errorf("%s is leased to %s", ip, m)
			}
			delete(p.leases, m)
		}
	}
	for m, o := range p.offers {
		if m != mac && o.IP == ip && o.Expires.After(now) {
			return fmt.Errorf("%s is offered to %s", ip, m)
		}
	}
	delete(p.offers, mac)
	// Every binding is written, renewals too: a restarted server must
	// know a running machine's lease has not expired.
	p.leases[mac] = lease{IP: ip, Expires: now.Add(p.lease)}
	return p.save()
}

// release frees mac's address when the RELEASE names the address mac
// holds: a RELEASE carries no secret, but one that does not know the
// address frees nothing.
func (p *Pool) release(mac string, ip net.IP) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, _ := netip.AddrFromSlice(ip.To4())
	if l, ok := p.leases[mac]; ok && l.IP == a {
		delete(p.leases, mac)
		_ = p.save()
	}
}

// save writes the leases whole: a file written, synced and renamed over
// the old one, so a crash leaves one or the other.
func (p *Pool) save() error {
	b, _ := json.Marshal(p.leases)
	if err := writeFileAtomic(p.path, b); err != nil {
		return fmt.Errorf("netboot: leases: %w", err)
	}
	return nil
}

// full is a DHCP server that owns the boot network's addresses.
type full struct {
	boot
	pool    *Pool
	netmask net.IPMask
	router  net.IP
}

// reply answers m; nil means no answer.
func (f *full) reply(m *dhcpv4.DHCPv4, now time.Time) (*dhcpv4.DHCPv4, error) {
	mac := m.ClientHWAddr.String()
	mods := []dhcpv4.Modifier{dhcpv4.WithServerIP(f.server), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(f.server)),
		dhcpv4.WithNetmask(f.netmask), dhcpv4.WithLeaseTime(uint32(f.pool.lease.Seconds()))}
	if f.router != nil {
		mods = append(mods, dhcpv4.WithRouter(f.router))
	}
	var ip netip.Addr
	switch m.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		var err error
		if ip, err = f.pool.offer(mac, now); err != nil {
			return nil, err
		}
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer))
	case dhcpv4.MessageTypeRequest:
		if sid := m.ServerIdentifier(); sid != nil && !sid.Equal(f.server) {
			return nil, nil // the client took another server's offer
		}
		want := m.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = m.ClientIPAddr
		}
		a, ok := netip.AddrFromSlice(want.To4())
		if !ok {
			return nil, nil
		}
		if err := f.pool.bind(mac, a, now); err != nil {
			nak, _ := dhcpv4.NewReplyFromRequest(m, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(f.server)), dhcpv4.WithOption(dhcpv4.OptMessage(err.Error())))
			return nak, nil
		}
		ip = a
		mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeAck))
	case dhcpv4.MessageTypeRelease:
		if sid := m.ServerIdentifier(); sid == nil || sid.Equal(f.server) {
			f.pool.release(mac, m.ClientIPAddr)
		}
		return nil, nil
	default:
		return nil, nil
	}
	r, err := dhcpv4.NewReplyFromRequest(m, append(mods, dhcpv4.WithYourIP(ip.AsSlice()))...)
	if err != nil {
		return nil, err
	}
	if file := f.file(m); file != "" && (isPXE(m) || isHTTPBoot(m)) {
		r.BootFileName = file
		r.UpdateOption(dhcpv4.OptClassIdentifier(class(m)))
		if isPXE(m) {
			r.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation, pxeNoDiscovery))
		}
	}
	return r, nil
}
