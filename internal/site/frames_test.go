package site

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/ipv4"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/proto/gre"
)

// TestGRESentAsFrames: over an Ethernet underlay with the site's next
// hop resolved, a tenant's GRE datagrams leave as frames on the packet
// socket, not through the kernel's IP output (its OutRequests counter
// does not move for them), and the far end receives every one as a
// well-formed IPv4 GRE datagram: header checksum, DF, TTL, addresses,
// the tenant's key and the inner packet as it was. With
// site.underlay.send: ip every datagram goes through the IP output
// (where the underlay's netfilter rules apply), as well-formed.
func TestGRESentAsFrames(t *testing.T) {
	t.Run("frames", func(t *testing.T) { testGRESent(t, true) })
	t.Run("ip", func(t *testing.T) { testGRESent(t, false) })
}

func testGRESent(t *testing.T, frames bool) {
	office, gw := testNamespace(t, "dwfro"), testNamespace(t, "dwfrg")
	for _, args := range [][]string{
		{"netns", "add", office}, {"netns", "add", gw},
		{"-n", office, "link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", gw},
		{"-n", office, "addr", "add", "198.51.100.2/24", "dev", "ul0"},
		{"-n", gw, "addr", "add", "198.51.100.1/24", "dev", "ul0"},
		{"-n", office, "link", "set", "ul0", "up"}, {"-n", gw, "link", "set", "ul0", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	oh, err := netns.GetFromName(office)
	if err != nil {
		t.Fatal(err)
	}
	defer oh.Close()
	gh, err := netns.GetFromName(gw)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.Close()
	tn, err := newTenant(&config.Tenant{Name: "office", Key: 1001, MTU: 1400, Sites: []config.TenantSite{
		{Name: "gateway", Peer: "198.51.100.1", Prefixes: []string{"10.0.0.0/24"}},
	}}, newMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	var u *underlay
	var recv net.PacketConn
	if err := inNamespace(oh, func() error {
		set := &atomic.Pointer[tenantSet]{}
		set.Store(&tenantSet{byKey: map[uint32]*tenant{}})
		u, err = listenUnderlay(netip.MustParseAddr("198.51.100.2"), set, newMetrics(nil), slog.New(slog.DiscardHandler), false, frames)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer u.close()
	if !frames && u.frames != nil {
		t.Fatal("with send: ip the underlay opened a packet socket for frames")
	}
	if err := inNamespace(gh, func() error {
		if recv, err = net.ListenPacket("ip4:47", "198.51.100.1"); err != nil {
			return err
		}
		// Room for every datagram the test sends before it reads.
		return growBuffers(recv)
	}); err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	link := &greLink{u: u, t: tn, site: tn.c().sites[0]}

	const batchLen, batches = 50, 20
	bufs := make([][]byte, batchLen)
	inner := func(i int) []byte {
		p := ipv4Packet(t, "c0a8010a", "0a00000a", 1000, true)
		binary.BigEndian.PutUint32(p[20:], uint32(i))
		return p
	}
	send := func(first int) {
		t.Helper()
		for i := range bufs {
			bufs[i] = append(make([]byte, headroom), inner(first+i)...)
		}
		if err := link.Send(bufs, headroom); err != nil {
			t.Fatal(err)
		}
	}
	// The first batch goes through the kernel, which resolves the next
	// hop; frames follow once the kernel has it.
	send(0)
	deadline := time.Now().Add(10 * time.Second)
	// Through the IP output, counting starts once the kernel has
	// resolved the next hop: its queue for an unresolved one holds a few.
	for !frames && !neighbourKnown(t, office, "198.51.100.1") {
		if time.Now().After(deadline) {
			t.Fatal("the gateway's hardware address was not found within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for frames && link.frames.path == nil {
		if time.Now().After(deadline) {
			t.Fatal("the gateway's hardware address was not found within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
		link.frames.checked = time.Time{}
		send(0)
	}
	before := outRequests(t, office)
	var changes0 uint64
	if frames {
		changes0 = u.frames.changes.Load()
	}
	began := time.Now()
	for b := range batches {
		send(1 + b*batchLen)
	}
	n := outRequests(t, office) - before
	// The batch after each reading of the path goes through the kernel
	// (frameSender.route): one every pathCheck, and one after each change
	// of the kernel's neighbours. On a busy machine the batches take
	// longer than pathCheck; the rest go as frames.
	if frames {
		checks := 1 + int(time.Since(began)/pathCheck) + int(u.frames.changes.Load()-changes0)
		if n > checks*batchLen || n >= batches*batchLen {
			t.Fatalf("the kernel's IP output sent %d of %d datagrams, more than the %d batches after a reading of the path: the frames were not used", n, batches*batchLen, checks)
		}
	}
	if !frames && n < batches*batchLen {
		t.Fatalf("the kernel's IP output sent %d of %d datagrams with send: ip", n, batches*batchLen)
	}

	// Every datagram arrives, checked the way the receiving kernel and
	// the gateway would.
	seen := map[uint32]bool{}
	// Read as the underlay reads: with the IP header (net's ReadFrom
	// strips it).
	rc := ipv4.NewPacketConn(recv)
	msg := []ipv4.Message{{Buffers: [][]byte{make([]byte, 2048)}}}
	for len(seen) < batches*batchLen {
		_ = recv.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := rc.ReadBatch(msg, 0)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("%d of %d datagrams arrived", len(seen), batches*batchLen)
		}
		if err != nil {
			t.Fatal(err)
		}
		n := msg[0].N
		ip := msg[0].Buffers[0][:n]
		if ip[0] != 0x45 || sum(ip[:20], 0) != 0xffff || ip[6]&0x40 == 0 || ip[8] != outerTTL || ip[9] != 47 ||
			netip.AddrFrom4([4]byte(ip[12:16])).String() != "198.51.100.2" || netip.AddrFrom4([4]byte(ip[16:20])).String() != "198.51.100.1" ||
			int(binary.BigEndian.Uint16(ip[2:])) != n {
			t.Fatalf("a malformed outer header: %x", ip[:20])
		}
		var p gre.Packet
		if err := p.Decode(ip[20:]); err != nil || !p.HasKey || p.Key != 1001 || p.Protocol != gre.ProtoIPv4 {
			t.Fatalf("GRE %+v, %v: want key 1001 carrying IPv4", p, err)
		}
		i := binary.BigEndian.Uint32(p.Payload[20:])
		if string(p.Payload) != string(inner(int(i))) {
			t.Fatalf("inner packet %d changed on the way", i)
		}
		if i > 0 {
			seen[i] = true
		}
	}
}

// neighbourKnown tells whether namespace ns has a hardware address for ip.
func neighbourKnown(t *testing.T, ns, ip string) bool {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "neigh", "show", ip).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(out), "lladdr")
}

// outRequests is the IPv4 OutRequests counter of namespace ns: the
// datagrams its IP output path sent.
func outRequests(t *testing.T, ns string) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Ip:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, name := range names {
			if name == "OutRequests" && i < len(f) {
				n, err := strconv.Atoi(f[i])
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
	}
	t.Fatalf("no Ip OutRequests in /proc/net/snmp:\n%s", out)
	return 0
}
