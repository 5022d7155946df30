package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/testkit"
)

const netbootOpsConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "10.77.0.1:10809"
  tls: "off"
  clients: open
  vdisks:
  - {name: golden, base: %[3]s}
  - {name: personal, mode: private, base: %[3]s}
  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
`

// TestNetbootOpsDocs runs docs/netboot.md's collection, version and
// private image lines exactly as written, as an administrator on the
// stream server would (the deskway of the default config file, which
// the test puts at /etc/deskway/deskway.yaml in a mount namespace of
// its own), against a running server in a network namespace, with a
// device booted (its export open) meanwhile: what each line answers, the
// refusals that name the device running a version, a private device
// refused before its image is made and booting after, and the audit
// trail's record of each change.
func TestNetbootOpsDocs(t *testing.T) {
	ns := newNetns(t)
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
	cfg := filepath.Join(etc, "upper", "deskway", "deskway.yaml")
	writeFile(t, cfg, fmt.Sprintf(netbootOpsConfig, filepath.Join(dir, "state"), testkit.FreePort(t), base))
	srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	doc := func(line string) (string, error) { return docLine(ns.name, etc, bin, line) }
	lines := func(block string) []string {
		t.Helper()
		return strings.Split(strings.TrimSpace(docBlock(t, "../docs/netboot.md", block)), "\n")
	}
	run := func(line string, want ...string) string {
		t.Helper()
		out, err := doc(line)
		if err != nil {
			t.Fatalf("%s: %v\n%s\nserver:\n%s", line, err, out, lastLines(srv.Log.String(), 20))
		}
		for _, w := range want {
			if !regexp.MustCompile(w).MatchString(out) {
				t.Fatalf("%s answered:\n%s\nwant a match for %q", line, out, w)
			}
		}
		return out
	}
	refused := func(line, want string) {
		t.Helper()
		out, err := doc(line)
		if err == nil || !strings.Contains(out, want) {
			t.Fatalf("%s: %v\n%s\nwant refused with %q", line, err, out, want)
		}
	}

	// Collections.
	col := lines("netboot-collections")
	if len(col) != 6 {
		t.Fatalf("the netboot-collections block has %d lines, the test checks 6", len(col))
	}
	run(col[0], `lab1 \(52:54:00:77:00:11\): vDisk -, disabled`)
	run(col[1], `lab2 \(52:54:00:77:00:12\): vDisk -, disabled`)
	run(col[2], `(?m)^lab: lab1: vDisk golden \(test\), disabled$`, `(?m)^lab: lab2: vDisk golden \(test\), disabled$`)
	run(col[3], `(?m)^lab: lab1: vDisk golden \(test\), enabled$`, `(?m)^lab: lab2: vDisk golden \(test\), enabled$`)
	run(col[4], `(?m)^lab\s+2\s+2\s+0$`)
	run(col[5], `(?m)^lab: lab1: vDisk golden \(test\), disabled$`, `(?m)^lab: lab2: vDisk golden \(test\), disabled$`)
	refused("deskway collection enable kiosk", `no device is in collection "kiosk"`)

	// Versions: version 1 in production, running on pc1.
	for _, l := range []string{"deskway vdisk version new golden", "deskway vdisk version promote golden 1", "deskway vdisk version promote golden 1",
		"deskway device add --mac 52:54:00:77:00:01 --name pc1 --vdisk golden"} {
		run(l)
	}
	boot, err := dialIn(ns.name, "10.77.0.1:10809")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { boot.Close() })
	if _, _, err := nbdclient.Handshake(boot, "golden/pc1/0123456789abcdef", nbdclient.Options{}); err != nil {
		t.Fatalf("pc1's boot: %v", err)
	}
	ver := lines("netboot-versions")
	if len(ver) != 6 {
		t.Fatalf("the netboot-versions block has %d lines, the test checks 6", len(ver))
	}
	run(ver[0], `(?m)^golden version 2: maintenance$`)
	run(ver[1], `(?m)^golden version 2: test$`)
	run(ver[2], `(?m)^golden version 2: production$`)
	run(ver[3], `(?m)^VERSION\s+STAGE\s+MADE\s+RUNNING ON\s+NOTE$`, `(?m)^0\s+production\s+-\s+-\s+base image `,
		`(?m)^1\s+production\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+pc1\s+-$`, `(?m)^2\s+production\s+\S+ \S+\s+-\s+November updates$`)
	run("deskway device ls", `(?m)^pc1\s+52:54:00:77:00:01\s+-\s+golden\s+-\s+enabled\s+-\s+golden v1$`)
	refused("deskway vdisk version delete golden 1", "device pc1 is running version 1 of golden; it can be deleted once it has shut down or booted another version")
	run(ver[4], `(?m)^golden version 2: test$`)
	refused("deskway vdisk version demote golden 1", "version 1 is the only production version of golden: demoting it would send production devices back to the base image. Promote the version they should boot to production first")
	refused("deskway vdisk version delete golden 1", "version 1 is what production clients of golden boot (device pc1 (production)): demote it first")
	run("deskway device assign pc1 --vdisk golden --stage test")
	refused("deskway vdisk version delete golden 2", "devices lab1 (test), lab2 (test), pc1 (test) are assigned to vDisk golden at the stage that boots version 2: assign them another vDisk or stage first")
	run("deskway device assign pc1 --vdisk golden")
	run("deskway collection assign lab --vdisk golden", `(?m)^lab: lab1: vDisk golden, disabled$`)
	run(ver[5], `(?m)^golden version 2: deleted$`)
	run(ver[3], `(?m)^1\s+production\s+\S+ \S+\s+pc1\s+-$`)
	if out := run(ver[3]); strings.Contains(out, "November updates") {
		t.Fatalf("version 2 is still listed after its delete:\n%s", out)
	}

	// Private images: refused before the image is made, in words that
	// name the command; booted after.
	open := func(export string) error {
		t.Helper()
		c, err := dialIn(ns.name, "10.77.0.1:10809")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_, _, err = nbdclient.Handshake(c, export, nbdclient.Options{})
		return err
	}
	var oe *nbdclient.OptionError
	if err := open("personal/pc3"); !errors.As(err, &oe) || !strings.Contains(oe.Message, "client pc3 has no private image of personal: make it with deskway vdisk private create personal --client pc3") {
		t.Fatalf("pc3 before its image is made: %v", err)
	}
	prv := lines("netboot-private")
	run(prv[0], `(?m)^pc3: private image of personal ready$`)
	run(prv[1], `pc3 \(52:54:00:77:00:03\): vDisk personal, enabled`)
	if err := open("personal/pc3"); err != nil {
		t.Fatalf("pc3 after its image is made: %v", err)
	}
	if err := open("personal/pc3"); !errors.As(err, &oe) || !strings.Contains(oe.Message, "a machine that powered off without disconnecting holds it until the server drops its connection, within 25 s") {
		t.Fatalf("pc3 again while its image is open: %v", err)
	}
	run(prv[0], `(?m)^pc3: the private image of personal exists and is in use`)

	// Each change is in the audit trail (the admin's log of it).
	for _, action := range []string{"POST /api/v1/stream/collections/lab/assign", "POST /api/v1/stream/collections/lab/disable",
		"POST /api/v1/stream/vdisks/golden/versions/2/demote", "DELETE /api/v1/stream/vdisks/golden/versions/2", "POST /api/v1/stream/vdisks/personal/private/pc3"} {
		if !strings.Contains(srv.Log.String(), `action="`+action+`"`) {
			t.Errorf("the audit trail lacks %s:\n%s", action, lastLines(srv.Log.String(), 30))
		}
	}
}

// docLine runs a documented line as written, in network namespace ns:
// deskway (bin) on the PATH, and its default config file
// ETC/upper/deskway/deskway.yaml, through an overlay of /etc (upper and
// work directories under etc) in a mount namespace of its own.
func docLine(ns, etc, bin, line string) (string, error) {
	script := fmt.Sprintf("mount -t overlay overlay -o lowerdir=/etc,upperdir=%s,workdir=%s /etc\nexport PATH=%s:$PATH\n%s\n",
		filepath.Join(etc, "upper"), filepath.Join(etc, "work"), filepath.Dir(bin), line)
	out, err := exec.Command("ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "sh", "-ec", script).CombinedOutput()
	return string(out), err
}
