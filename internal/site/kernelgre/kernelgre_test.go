package kernelgre

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// end is one side of a test tunnel: an underlay namespace holding the
// programs and a tenant namespace behind a veth.
type end struct {
	ul, ten string
	dp      *Datapath
}

func ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// inNS runs f on a thread in namespace name, thrown away after.
func inNS(t *testing.T, name string, f func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		h, err := netns.GetFromName(name)
		if err == nil {
			defer h.Close()
			err = netns.Set(h)
		}
		if err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

func newNS(t *testing.T, prefix string) string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	n := prefix + hex.EncodeToString(b[:])
	ip(t, "netns", "add", n)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	ip(t, "-n", n, "link", "set", "lo", "up")
	return n
}

func mac(t *testing.T, ns, dev string) net.HardwareAddr {
	t.Helper()
	f := strings.Fields(ip(t, "-n", ns, "-o", "link", "show", dev))
	for i, w := range f {
		if w == "link/ether" {
			m, err := net.ParseMAC(f[i+1])
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Fatalf("no hardware address on %s in %s", dev, ns)
	return nil
}

func ifindex(t *testing.T, ns, dev string) int {
	t.Helper()
	var i int
	if err := inNS(t, ns, func() error {
		l, err := net.InterfaceByName(dev)
		if err == nil {
			i = l.Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return i
}

// pair makes two ends joined by an underlay veth: end a (198.51.100.2,
// tenant 192.168.1.0/24, the host 192.168.1.10) and end b (198.51.100.1,
// tenant 10.0.0.0/24, the host 10.0.0.10), GRE key 1001 between them.
func pair(t *testing.T) (a, b *end) {
	a = &end{ul: newNS(t, "kga-"), ten: newNS(t, "kgA-")}
	b = &end{ul: newNS(t, "kgb-"), ten: newNS(t, "kgB-")}
	ip(t, "-n", a.ul, "link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", b.ul)
	ip(t, "-n", a.ul, "addr", "add", "198.51.100.2/24", "dev", "ul0")
	ip(t, "-n", b.ul, "addr", "add", "198.51.100.1/24", "dev", "ul0")
	ip(t, "-n", a.ul, "link", "set", "ul0", "up")
	ip(t, "-n", b.ul, "link", "set", "ul0", "up")
	setup := func(e *end, local, peer, own, host, remote string) {
		ip(t, "-n", e.ul, "link", "add", "dwk1", "mtu", "1476", "type", "veth", "peer", "name", "dwk1", "mtu", "1476", "netns", e.ten)
		ip(t, "-n", e.ul, "link", "set", "dwk1", "up")
		ip(t, "-n", e.ten, "link", "set", "dwk1", "up")
		ip(t, "-n", e.ten, "addr", "add", host+"/32", "dev", "dwk1")
		lm := mac(t, e.ul, "dwk1")
		ip(t, "-n", e.ten, "neigh", "add", "169.254.0.1", "lladdr", lm.String(), "dev", "dwk1", "nud", "permanent")
		ip(t, "-n", e.ten, "route", "add", remote, "via", "169.254.0.1", "dev", "dwk1", "onlink")
		var err error
		if err = inNS(t, e.ul, func() error {
			e.dp, err = Load()
			return err
		}); err != nil {
			t.Fatalf("load: %v", err)
		}
		t.Cleanup(func() { _ = e.dp.Close() })
		veth, ul := ifindex(t, e.ul, "dwk1"), ifindex(t, e.ul, "ul0")
		if err := inNS(t, e.ul, func() error {
			if err := e.dp.AttachUnderlay(ul); err != nil {
				return err
			}
			return e.dp.AttachTenant(veth)
		}); err != nil {
			t.Fatalf("attach: %v", err)
		}
		err = e.dp.Sync([]Tenant{{Index: 1, Ifindex: veth, LocalMAC: lm, PeerMAC: mac(t, e.ten, "dwk1")}},
			[]Tunnel{{Index: 7, Tenant: 1, Local: netip.MustParseAddr(local), Peer: netip.MustParseAddr(peer), Key: 1001, Underlay: ul,
				Sources: []netip.Prefix{netip.MustParsePrefix(remote)}, Routes: []netip.Prefix{netip.MustParsePrefix(remote)}}})
		if err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	setup(a, "198.51.100.2", "198.51.100.1", "192.168.1.0/24", "192.168.1.10", "10.0.0.0/24")
	setup(b, "198.51.100.1", "198.51.100.2", "10.0.0.0/24", "10.0.0.10", "192.168.1.0/24")
	return a, b
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes network namespaces and loads BPF programs")
	}
}

// TestKernelGRETCP sends 8 MiB over TCP from one tenant's host to the
// other's through the programs and checks every byte and the counters.
func TestKernelGRETCP(t *testing.T) {
	needRoot(t)
	t.Parallel()
	a, b := pair(t)
	var ln net.Listener
	if err := inNS(t, b.ten, func() (err error) {
		ln, err = net.Listen("tcp", "10.0.0.10:5001")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := make([]byte, 8<<20)
	_, _ = rand.Read(want)
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	if err := inNS(t, a.ten, func() error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("192.168.1.10")}}
		c, err := d.Dial("tcp", "10.0.0.10:5001")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(want)
		return err
	}); err != nil {
		t.Fatalf("send: %v", err)
	}
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("received %d bytes, not the %d sent", len(g), len(want))
	}
	ca, err := a.dp.Counters(7)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.dp.Counters(7)
	if err != nil {
		t.Fatal(err)
	}
	if ca.BytesOut < uint64(len(want)) || cb.BytesIn < uint64(len(want)) || cb.PktsOut == 0 || ca.PktsIn == 0 {
		t.Fatalf("counters: sending end %+v, receiving end %+v", ca, cb)
	}
}
