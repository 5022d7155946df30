package e2e

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

const netbootConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "10.77.0.1:10809"
  tls: "off"
  clients: open
  vdisks:
  - {name: golden, base: %[3]s, kernel: %[4]s, initrd: %[5]s, cmdline: "console=ttyS0 panic=-1 quiet no_timer_check"}
  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
`

// TestNetbootBareVM: machines with no disk power on in a network
// namespace and boot from deskway: a DHCP lease and an iPXE script from
// deskway, the kernel and initramfs of the vDisk their device record
// names over HTTP, and a kernel command line naming their own export
// with a fresh boot id per power-on. A disabled device and an unknown
// machine do not boot and their consoles say why; enabling the device
// lets it boot at its next try, without a power cycle.
func TestNetbootBareVM(t *testing.T) {
	// Beside tests that boot no guest (e2e/main_test.go); its guests take
	// both slots.
	guestTest(t)
	ns := newNetns(t, "tap1", "tap2", "tap3")
	kernel, initrd := netbootKit(t)
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	cfg := filepath.Join(dir, "deskway.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(netbootConfig, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd)), 0o600)
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
	if out := deskway("device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden"); !strings.Contains(out, "pc1 (52:54:00:77:00:01): vDisk golden, enabled") {
		t.Fatalf("device add:\n%s", out)
	}
	deskway("device", "add", "--mac", "52:54:00:77:00:02", "--name", "pc2", "--vdisk", "golden", "--disabled")

	guests(t, 2) // three at once, as it ran alone
	pc1, pc2, stranger := ns.bootVM("tap1", "52:54:00:77:00:01"), ns.bootVM("tap2", "52:54:00:77:00:02"), ns.bootVM("tap3", "52:54:00:77:00:09")
	booted := regexp.MustCompile(`DESKWAY netboot .*deskway\.device=pc1 deskway\.export=golden/pc1/([0-9a-f]{16}) deskway\.mode=standard deskway\.servers=10\.77\.0\.1:10809`)
	first := pc1.wait(t, booted, 3*time.Minute)[1]
	pc2.wait(t, regexp.MustCompile(`deskway: device pc2 \(52:54:00:77:00:02\) is disabled by an administrator`), 2*time.Minute)
	stranger.wait(t, regexp.MustCompile(`deskway: this machine \(52:54:00:77:00:09\) is not a registered device`), 2*time.Minute)
	if !strings.Contains(pc1.out.String(), "10.77.0.1") || !regexp.MustCompile(`net0: 10\.77\.0\.1[0-5]\d/255\.255\.255\.0`).MatchString(pc1.out.String()) {
		t.Fatalf("pc1 did not get its address from deskway's pool:\n%s", lastLines(pc1.out.String(), 40))
	}

	// pc2 enabled: a key at its console tries again at once, and it boots.
	deskway("device", "enable", "pc2")
	io.WriteString(pc2.in, "\n")
	pc2.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.export=golden/pc2/[0-9a-f]{16} `), 3*time.Minute)

	// pc1 powers on again: a new boot id, so its last boot's writes are gone.
	_ = pc1.cmd.Wait()
	pc1 = ns.bootVM("tap1", "52:54:00:77:00:01")
	if again := pc1.wait(t, booted, 3*time.Minute)[1]; again == first {
		t.Fatalf("pc1's second power-on has the first one's boot id %s", first)
	}
	// A firmware PXE client's first stage comes over TFTP: iPXE from
	// Debian's ipxe package, and nothing else.
	got := filepath.Join(dir, "undionly.kpxe")
	ns.run("busybox", "tftp", "-g", "-r", "undionly.kpxe", "-l", got, "10.77.0.1")
	if fileSum(t, got) != fileSum(t, "/usr/lib/ipxe/undionly.kpxe") {
		t.Fatal("undionly.kpxe over TFTP differs from Debian's")
	}
	// Refused by the server, in so many words: a timeout or a client
	// error would not show that deskway read the request and said no.
	passwd := filepath.Join(dir, "passwd")
	out, err := exec.Command("ip", "netns", "exec", ns.name, "busybox", "tftp", "-g", "-r", "../../etc/passwd", "-l", passwd, "10.77.0.1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `tftp: server error: (1) no file "../../etc/passwd" here`) {
		t.Fatalf("TFTP asked for ../../etc/passwd: %v, want the server's refusal:\n%s", err, out)
	}
	if _, err := os.Stat(passwd); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("TFTP asked for ../../etc/passwd left %s: %v", passwd, err)
	}
	ls := deskway("device", "ls")
	if !regexp.MustCompile(`(?m)^pc1\s+52:54:00:77:00:01\s+-\s+golden\s+-\s+enabled\s+\d{4}-`).MatchString(ls) {
		t.Fatalf("device ls:\n%s", ls)
	}
	for _, want := range []string{"network boot refused", "reason=unknown", "reason=disabled", `msg="network boot" role=netboot mac=52:54:00:77:00:01 device=pc1`} {
		if !strings.Contains(srv.Log.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, lastLines(srv.Log.String(), 30))
		}
	}
}

const netbootRootConfig = `state_dir: %[1]s
log: {level: debug, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "10.77.0.1:10809"
  tls: "off"
  clients: open
  vdisks:
  - {name: golden, base: %[3]s, kernel: %[4]s, initrd: %[5]s, cmdline: "console=ttyS0 panic=-1 quiet"}
  - {name: personal, mode: private, base: %[3]s, kernel: %[4]s, initrd: %[5]s, cmdline: "console=ttyS0 panic=-1 quiet", clients: [pc3]}
  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
`

// TestNetbootRootOverNBD: bare VMs boot from deskway over PXE and run
// from their vDisk, mounted as root through the kernel's NBD client. Two
// standard-mode devices boot at once from one vDisk and neither sees the
// other's file; a standard-mode device's file is gone at its next
// power-on; a private-mode device's file is still there.
func TestNetbootRootOverNBD(t *testing.T) {
	// Beside tests that boot no guest (e2e/main_test.go); its guests take
	// both slots.
	guestTest(t)
	ns := newNetns(t, "tap1", "tap2", "tap3")
	kernel, initrd := netbootRootKit(t)
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	rootImage(t, base)
	cfg := filepath.Join(dir, "deskway.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(netbootRootConfig, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd)), 0o600)
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
	deskway("device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden")
	deskway("device", "add", "--mac", "52:54:00:77:00:02", "--name", "pc2", "--vdisk", "golden")
	deskway("device", "add", "--mac", "52:54:00:77:00:03", "--name", "pc3", "--vdisk", "personal")

	written := func(v *vm, dev string) {
		t.Helper()
		v.wait(t, regexp.MustCompile(`DESKWAY root `+dev+`: golden image v1 files: `), 4*time.Minute)
		v.wait(t, regexp.MustCompile(`DESKWAY written `+dev), time.Minute)
	}
	after := func(v *vm, dev string) string {
		t.Helper()
		io.WriteString(v.in, "go\n")
		return v.wait(t, regexp.MustCompile(`DESKWAY after `+dev+`: ([^\r\n]*)[\r\n]`), time.Minute)[1]
	}
	// Two standard-mode devices at once: each has written and synced
	// before either lists the disk as the server has it.
	guests(t, 2)
	pc1, pc2 := ns.bootVM("tap1", "52:54:00:77:00:01"), ns.bootVM("tap2", "52:54:00:77:00:02")
	written(pc1, "pc1")
	written(pc2, "pc2")
	if got := after(pc1, "pc1"); !strings.Contains(got, "pc1.txt") || strings.Contains(got, "pc2.txt") {
		t.Fatalf("pc1 sees %q: its own file, and not pc2's, expected", got)
	}
	if got := after(pc2, "pc2"); !strings.Contains(got, "pc2.txt") || strings.Contains(got, "pc1.txt") {
		t.Fatalf("pc2 sees %q", got)
	}
	_ = pc1.cmd.Wait()
	_ = pc2.cmd.Wait()
	// pc1 again: a new boot, its file is gone. pc3 (private) twice: kept.
	pc1 = ns.bootVM("tap1", "52:54:00:77:00:01")
	pc3 := ns.bootVM("tap3", "52:54:00:77:00:03")
	written(pc1, "pc1")
	written(pc3, "pc3")
	if first := pc1.wait(t, regexp.MustCompile(`DESKWAY root pc1: golden image v1 files: ([^\r\n]*)[\r\n]`), time.Second)[1]; strings.Contains(first, "pc1.txt") {
		t.Fatalf("pc1's second power-on found its first boot's file: %q", first)
	}
	after(pc1, "pc1")
	after(pc3, "pc3")
	_ = pc3.cmd.Wait()
	pc3 = ns.bootVM("tap3", "52:54:00:77:00:03")
	if first := pc3.wait(t, regexp.MustCompile(`DESKWAY root pc3: golden image v1 files: ([^\r\n]*)[\r\n]`), 4*time.Minute)[1]; !strings.Contains(first, "pc3.txt") {
		t.Fatalf("private-mode pc3 lost its file across a power-off: %q", first)
	}
}

// TestNetbootProxyDHCP: on a network whose addresses come from its own
// DHCP server (busybox udhcpd here), deskway in proxyDHCP mode answers
// only the boot options: the machine takes its address from udhcpd and
// its boot file from deskway, and boots.
func TestNetbootProxyDHCP(t *testing.T) {
	guestTest(t)
	ns := newNetns(t, "tap1")
	kernel, initrd := netbootKit(t)
	bin := build(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "udhcpd.conf")
	os.WriteFile(conf, []byte("start 10.77.0.50\nend 10.77.0.60\ninterface br0\nlease_file "+filepath.Join(dir, "udhcpd.leases")+"\noption subnet 255.255.255.0\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "udhcpd.leases"), nil, 0o600)
	testkit.Start(t, nil, "ip", "netns", "exec", ns.name, "busybox", "udhcpd", "-f", conf)
	base := filepath.Join(dir, "golden.img")
	os.WriteFile(base, nil, 0o600)
	os.Truncate(base, 16<<20)
	cfg := filepath.Join(dir, "deskway.yaml")
	proxy := strings.Replace(netbootConfig, "    dhcp: full\n    pool: {start: 10.77.0.100, end: 10.77.0.150}\n", "    dhcp: proxy\n", 1)
	os.WriteFile(cfg, []byte(fmt.Sprintf(proxy, filepath.Join(dir, "state"), testkit.FreePort(t), base, kernel, initrd)), 0o600)
	srv := testkit.Start(t, nil, "ip", "netns", "exec", ns.name, bin, "run", "-c", cfg)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(srv.Log.String(), "network boot services listening"); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the boot services did not start:\n%s", srv.Log.String())
		}
	}
	ns.run(bin, "device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden", "-c", cfg)
	guests(t, 1)
	pc1 := ns.bootVM("tap1", "52:54:00:77:00:01")
	pc1.wait(t, regexp.MustCompile(`DESKWAY netboot .*deskway\.device=pc1 deskway\.export=golden/pc1/[0-9a-f]{16} `), 3*time.Minute)
	if !regexp.MustCompile(`net0: 10\.77\.0\.(5\d|60)/`).MatchString(pc1.out.String()) {
		t.Fatalf("pc1's address is not udhcpd's:\n%s", lastLines(pc1.out.String(), 40))
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "netboot-leases.json")); err == nil {
		t.Fatal("a proxy recorded leases of its own")
	}
}

// TestNetbootBenchSmoke runs `deskway bench netboot` once, and two VMs
// at once through deskway (several at once is one code path for every
// system; each boot under TCG costs half a minute), and checks the result's shape: every boot through deskway, the
// LTSP stack (dnsmasq, nbd-server) and qemu's own NBD client reached the
// vDisk's init, each step was timed, iPXE's banner was answered with a
// key for deskway and LTSP alike, and every boot names the qemu
// accelerator it ran on.
func TestNetbootBenchSmoke(t *testing.T) {
	// Its figures are only checked to be there, its namespaces are its
	// own; it boots one guest at a time, then two: both slots.
	guestTest(t)
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "ss", "qemu-system-x86_64", "busybox", "mkfs.ext4", "dnsmasq", "nbd-server")
	out := t.TempDir()
	nbdroot := buildNbdroot(t)
	guests(t, 2)
	res := runBench(t, out, "netboot", "--runs", "1", "--at-once", "0", "--at-once-deskway", "2", "--nbdroot", nbdroot)
	for _, k := range []string{"pxe_boot_s", "ltsp_boot_s", "nbd_boot_s", "pxe_ratio_nbd", "pxe_ratio_ltsp", "pxe2_ratio_pxe1"} {
		if v, ok := res.Summary[k]; !ok || v <= 0 {
			t.Errorf("summary %s = %v", k, v)
		}
	}
	if a := res.SummaryText["accel"]; a != "kvm" && a != "tcg" || res.SummaryText["accel_why"] == "" {
		t.Errorf("the result does not say which qemu accelerator its VMs had, and why: %v", res.SummaryText)
	}
	seen := map[string]int{}
	for _, p := range res.Points {
		seen[p.Scenario+"/"+p.System]++
		if p.Params["accel"] != res.SummaryText["accel"] {
			t.Errorf("point %+v does not name its accelerator %q", p, res.SummaryText["accel"])
		}
		m := p.Metrics
		if m["boot_s"] <= 0 || p.System != "qemu-nbd-direct" && (m["banner_s"] <= 0 || m["dhcp_s"] < m["banner_s"] || m["script_s"] <= m["dhcp_s"] || m["root_s"] <= m["script_s"]) {
			t.Errorf("point %+v", p)
		}
	}
	for _, sys := range []string{"deskway-pxe", "ltsp", "qemu-nbd-direct"} {
		if seen["boot-one/"+sys] != 1 {
			t.Fatalf("points %v", seen)
		}
	}
	if seen["boot-2/deskway-pxe"] != 2 || len(seen) != 4 {
		t.Fatalf("points %v", seen)
	}
	if md, err := os.ReadFile(filepath.Join(out, "result.md")); err != nil || !strings.Contains(string(md), "qemu's accelerator: "+res.SummaryText["accel"]) {
		t.Errorf("result.md does not name the accelerator (%v)", err)
	}
}
