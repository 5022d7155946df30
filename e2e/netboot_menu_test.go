package e2e

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestNetbootMenu: docs/netboot.md's boot menu lines, run as written,
// give collection lab's devices a menu, then pc1 a menu of two vDisks; pc2 gets the same with a long timeout.
// Two bare VMs power on: pc1's console shows the menu, nobody presses a
// key, and at the timeout it boots the default (golden); on pc2's
// console the key 2 is pressed over the serial line, and it boots the
// other vDisk. The kernel command line each VM booted names the vDisk
// it ended up on.
func TestNetbootMenu(t *testing.T) {
	// Beside tests that boot no guest (e2e/main_test.go); its guests take
	// both slots.
	guestTest(t)
	ns := newNetns(t, "tap1", "tap2")
	kernel, initrd := netbootKit(t)
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	etc := filepath.Join(dir, "etc")
	for _, d := range []string{filepath.Join(etc, "upper", "deskway"), filepath.Join(etc, "work")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	two := strings.Replace(netbootConfig, "  netboot:\n",
		"  - {name: other, base: %[3]s, kernel: %[4]s, initrd: %[5]s, cmdline: \"console=ttyS0 panic=-1 quiet no_timer_check\"}\n  netboot:\n", 1)
	cfg := filepath.Join(etc, "upper", "deskway", "deskway.yaml")
	writeFile(t, cfg, fmt.Sprintf(two, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd))
	srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	deskway := func(args ...string) string {
		t.Helper()
		return ns.run(append([]string{bin}, append(args, "-c", cfg)...)...)
	}
	deskway("device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden", "--collection", "lab")
	deskway("device", "add", "--mac", "52:54:00:77:00:02", "--name", "pc2", "--vdisk", "golden", "--collection", "lab")
	// The collection's menu, as netboot.md's text gives it, reaches both.
	if out, err := docLine(ns.name, etc, bin, "deskway collection menu lab golden other"); err != nil ||
		!strings.Contains(out, "pc1: boot menu golden, other (default golden, 10 s)\npc2: boot menu golden, other (default golden, 10 s)") {
		t.Fatalf("collection menu: %v\n%s", err, out)
	}
	if doc, _ := os.ReadFile("../docs/netboot.md"); !strings.Contains(string(doc), "`deskway collection menu lab golden other`") {
		t.Fatal("netboot.md no longer shows the collection menu line this test runs")
	}
	line := strings.TrimSpace(docBlock(t, "../docs/netboot.md", "netboot-menu"))
	if out, err := docLine(ns.name, etc, bin, line); err != nil || !strings.Contains(out, "pc1: boot menu golden, other (default golden, 5 s)") {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	if out := deskway("device", "menu", "pc2", "golden", "other", "--timeout", "120s"); !strings.Contains(out, "pc2: boot menu golden, other (default golden, 120 s)") {
		t.Fatalf("device menu pc2:\n%s", out)
	}

	menu := func(dev string) *regexp.Regexp {
		return regexp.MustCompile(`deskway: device ` + dev + `, choose what to boot`)
	}
	guests(t, 2)
	pc1, pc2 := ns.bootVM("tap1", "52:54:00:77:00:01"), ns.bootVM("tap2", "52:54:00:77:00:02")
	pc2.wait(t, menu("pc2"), 3*time.Minute)
	io.WriteString(pc2.in, "2")
	pc1.wait(t, menu("pc1"), 3*time.Minute)
	if m := pc1.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.export=(\w+)/pc1/`), 3*time.Minute); m[1] != "golden" {
		t.Fatalf("pc1, left at its menu, booted %s, want the default golden", m[1])
	}
	if m := pc2.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.export=(\w+)/pc2/`), 3*time.Minute); m[1] != "other" {
		t.Fatalf("pc2, given the key 2 at its menu, booted %s, want other", m[1])
	}
	for _, want := range []string{`msg="network boot menu" role=netboot mac=52:54:00:77:00:01 device=pc1`, `device=pc2 vdisk=other`, `device=pc1 vdisk=golden`} {
		if !strings.Contains(srv.Log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, lastLines(srv.Log.String(), 30))
		}
	}
}
