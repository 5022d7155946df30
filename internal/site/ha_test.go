package site

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/deskway/deskway/internal/config"
)

// TestSiteGratuitousARP: a neighbour whose entry for an address names
// another hardware address (the gateway that was active) has this one's
// as soon as it announces the address, without asking.
func TestSiteGratuitousARP(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	gw, nb := "dwga-"+hex.EncodeToString(b[:]), "dwgn-"+hex.EncodeToString(b[:])
	ip := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for _, n := range []string{gw, nb} {
		ip("netns", "add", n)
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n).Run() })
	}
	ip("-n", gw, "link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", nb)
	ip("-n", gw, "link", "set", "ul0", "up")
	ip("-n", nb, "link", "set", "ul0", "up")
	ip("-n", gw, "addr", "add", "198.51.100.1/24", "dev", "ul0")
	ip("-n", nb, "addr", "add", "198.51.100.2/24", "dev", "ul0")
	ip("-n", nb, "neigh", "add", "198.51.100.1", "lladdr", "02:00:00:00:00:01", "dev", "ul0", "nud", "reachable")
	mac := strings.TrimSpace(ip("-n", gw, "-br", "link", "show", "ul0"))
	mac = strings.Fields(mac)[2]

	h, err := netns.GetFromName(gw)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := inNamespace(h, func() error {
		return gratuitousARP(config.SiteAddress{Address: "198.51.100.1/24", Interface: "ul0"})
	}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if out := ip("-n", nb, "neigh", "show", "198.51.100.1"); strings.Contains(out, mac) {
			return
		}
	}
	t.Fatalf("the neighbour's entry still names another address: %s (want %s)", ip("-n", nb, "neigh", "show", "198.51.100.1"), mac)
}
