package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// TestNetbootPersonality: docs/netboot.md's personality line, run as
// written, gives pc1 a personality; a bare VM boots from deskway with
// root over NBD, and the vDisk's own init finds it in
// /etc/deskway/personality, which deskway's initramfs wrote, and on the
// kernel command line.
func TestNetbootPersonality(t *testing.T) {
	guestTest(t)
	ns := newNetns(t, "tap1")
	kernel, initrd := netbootRootKit(t)
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	vdiskWithInit(t, base, map[string]string{"golden.txt": "golden\n"}, `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
echo "DESKWAY personality file: $(tr '\n' ' ' </etc/deskway/personality)"
echo "DESKWAY personality cmdline: $(tr ' ' '\n' </proc/cmdline | grep '^deskway\.p\.' | tr '\n' ' ')"
poweroff -f
`)
	etc := filepath.Join(dir, "etc")
	for _, d := range []string{filepath.Join(etc, "upper", "deskway"), filepath.Join(etc, "work")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(etc, "upper", "deskway", "deskway.yaml")
	writeFile(t, cfg, fmt.Sprintf(netbootRootConfig, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd))
	srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden", "-c", cfg)
	line := strings.TrimSpace(docBlock(t, "../docs/netboot.md", "netboot-personality"))
	if out, err := docLine(ns.name, etc, bin, line); err != nil || !strings.Contains(out, "pc1: personality host_name=pc1 role=kiosk site=north") {
		t.Fatalf("%s: %v\n%s", line, err, out)
	}
	guests(t, 1)
	pc1 := ns.bootVM("tap1", "52:54:00:77:00:01")
	if got := pc1.wait(t, regexp.MustCompile(`DESKWAY personality file: ([^\r\n]*)[\r\n]`), 4*time.Minute)[1]; strings.TrimSpace(got) != "host_name=pc1 role=kiosk site=north" {
		t.Fatalf("/etc/deskway/personality on pc1's root disk holds %q", got)
	}
	if got := pc1.wait(t, regexp.MustCompile(`DESKWAY personality cmdline: ([^\r\n]*)[\r\n]`), time.Minute)[1]; strings.TrimSpace(got) != "deskway.p.host_name=pc1 deskway.p.role=kiosk deskway.p.site=north" {
		t.Fatalf("pc1's kernel command line carries %q", got)
	}
}
