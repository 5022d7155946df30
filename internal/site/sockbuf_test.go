package site

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// TestUnderlayHoldsBurst: a burst of GRE datagrams that arrives while
// the receiving loop is not reading waits in the raw socket; none is
// dropped. 2000 datagrams of 1400 bytes are what a few TCP superpackets
// split into; the kernel's default receive buffer held about a tenth of
// them.
func TestUnderlayHoldsBurst(t *testing.T) {
	name := testNamespace(t, "dwsbuf")
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var u *underlay
	var send net.PacketConn
	if err := inNamespace(h, func() error {
		var err error
		set := &atomic.Pointer[tenantSet]{}
		set.Store(&tenantSet{byKey: map[uint32]*tenant{}})
		if u, err = listenUnderlay(netip.MustParseAddr("127.0.0.1"), set, newMetrics(nil), slog.New(slog.DiscardHandler), false, true); err != nil {
			return err
		}
		send, err = net.ListenPacket("ip4:47", "127.0.0.2")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer u.close()
	defer send.Close()
	const burst = 2000
	payload := make([]byte, 1400)
	to := &net.IPAddr{IP: net.IPv4(127, 0, 0, 1)}
	for range burst {
		if _, err := send.WriteTo(payload, to); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 2048)
	got := 0
	for got < burst {
		_ = u.conn.SetReadDeadline(time.Now().Add(time.Second))
		if _, _, err := u.conn.ReadFrom(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			t.Fatal(err)
		}
		got++
	}
	if got != burst {
		t.Fatalf("the underlay's raw socket kept %d of a burst of %d datagrams", got, burst)
	}
}
