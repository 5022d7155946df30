package netbootbench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/childproc"
)

// The LTSP way to network-boot, as LTSP's own `ltsp dnsmasq` and `ltsp
// nbd-server` set it up: the network's DHCP server (busybox udhcpd here)
// gives the address; dnsmasq, as proxyDHCP beside it, names the boot
// file and serves it, the kernel and the initramfs over TFTP; nbd-server
// exports the image with a copy-on-write file per client.

// udhcpdConf is the network's own DHCP server, which knows nothing of
// network boots.
const udhcpdConf = `start 10.77.0.50
end 10.77.0.70
interface br0
lease_file %[1]s/udhcpd.leases
pidfile %[1]s/udhcpd.pid
option subnet 255.255.255.0
`

// dnsmasqConf is LTSP's dnsmasq for qemu's iPXE ROM (option 175 says
// iPXE): proxyDHCP naming ltsp/ltsp.ipxe, TFTP, no DNS, bound to the
// bench's bridge alone.
const dnsmasqConf = `port=0
interface=br0
bind-interfaces
no-hosts
no-resolv
user=root
pid-file=%[1]s/dnsmasq.pid
dhcp-leasefile=%[1]s/dnsmasq.leases
dhcp-range=10.77.0.0,proxy,255.255.255.0
dhcp-match=set:iPXE,175
pxe-service=tag:iPXE,X86PC,"ltsp.ipxe",ltsp/ltsp.ipxe
enable-tftp
tftp-root=%[1]s/tftp
`

// ltspScript is the iPXE script, LTSP's ltsp.ipxe reduced to its boot
// lines: the kernel and initramfs over TFTP beside it, and the same
// command line as deskway's boot (the device named by its MAC).
const ltspScript = `#!ipxe
echo ltsp: ${mac} boots over TFTP from ${next-server}
kernel vmlinuz initrd=initrd.img %s deskway.device=${mac:hexhyp} deskway.export=golden deskway.servers=10.77.0.1:10809 BOOTIF=01-${mac:hexhyp}
initrd initrd.img
boot
`

// nbdServerConf exports the image read-only to the clients' eyes beneath
// a copy-on-write file per connection (copyonwrite), as LTSP's image.
const nbdServerConf = `[generic]
    listenaddr = 10.77.0.1
    port = 10809
    allowlist = false
[golden]
    exportname = %s
    copyonwrite = true
`

// ltspStack is the LTSP way's servers, running in ns.
type ltspStack struct {
	procs  []*childproc.Proc
	nbdPid int
}

// startLTSP starts udhcpd, dnsmasq and nbd-server in ns, with their
// files in dir, serving kernel, initrd and the image at base.
func startLTSP(ns *netns, dir, kernel, initrd, base, cmdline string) (*ltspStack, error) {
	for _, p := range []string{"dnsmasq", "nbd-server"} {
		if _, err := exec.LookPath(p); err != nil {
			return nil, fmt.Errorf("netboot bench: %s is needed for the LTSP stack (scripts/install-deps.sh installs it)", p)
		}
	}
	tftp := filepath.Join(dir, "tftp", "ltsp")
	if err := os.MkdirAll(tftp, 0o755); err != nil {
		return nil, err
	}
	files := map[string]string{
		filepath.Join(dir, "udhcpd.conf"):     fmt.Sprintf(udhcpdConf, dir),
		filepath.Join(dir, "udhcpd.leases"):   "",
		filepath.Join(dir, "dnsmasq.conf"):    fmt.Sprintf(dnsmasqConf, dir),
		filepath.Join(dir, "nbd-server.conf"): fmt.Sprintf(nbdServerConf, base),
		filepath.Join(tftp, "ltsp.ipxe"):      fmt.Sprintf(ltspScript, cmdline),
	}
	for p, s := range files {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			return nil, err
		}
	}
	for src, dst := range map[string]string{kernel: "vmlinuz", initrd: "initrd.img"} {
		if err := copyFile(src, filepath.Join(tftp, dst)); err != nil {
			return nil, err
		}
	}
	s := &ltspStack{}
	for _, args := range [][]string{
		{"busybox", "udhcpd", "-f", filepath.Join(dir, "udhcpd.conf")},
		{"dnsmasq", "--keep-in-foreground", "--conf-file=" + filepath.Join(dir, "dnsmasq.conf")},
	} {
		p, err := ns.start(args[0], args[1:]...)
		if err != nil {
			s.stop()
			return nil, fmt.Errorf("netboot bench: %s: %w", args[0], err)
		}
		s.procs = append(s.procs, p)
	}
	// nbd-server serves one client only in the foreground: it runs as the
	// daemon it is, found by its pid file.
	pidFile := filepath.Join(dir, "nbd-server.pid")
	if out, err := ns.command("nbd-server", "-C", filepath.Join(dir, "nbd-server.conf"), "-p", pidFile).CombinedOutput(); err != nil {
		s.stop()
		return nil, fmt.Errorf("netboot bench: nbd-server: %v: %s", err, out)
	}
	for deadline := time.Now().Add(10 * time.Second); s.nbdPid == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		raw, _ := os.ReadFile(pidFile)
		s.nbdPid, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
	}
	if s.nbdPid == 0 {
		s.stop()
		return nil, fmt.Errorf("netboot bench: nbd-server wrote no pid to %s", pidFile)
	}
	// Each server is ready when it listens: dnsmasq on DHCP's 67 and
	// TFTP's 69, nbd-server on 10809.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _ := ns.command("ss", "-Hlnu").Output()
		tcp, _ := ns.command("ss", "-Hlnt").Output()
		if strings.Contains(string(out), ":67 ") && strings.Contains(string(out), ":69 ") && strings.Contains(string(out), ":4011 ") && strings.Contains(string(tcp), ":10809 ") {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			var log strings.Builder
			for _, p := range s.procs {
				log.WriteString(p.Output())
			}
			return nil, fmt.Errorf("netboot bench: the LTSP stack did not start listening (udp %q, tcp %q):\n%s", out, tcp, log.String())
		}
	}
}

func (s *ltspStack) stop() {
	for _, p := range s.procs {
		p.Kill()
	}
	if s.nbdPid > 0 {
		// nbd-server's children (one per client) end with it.
		_ = syscall.Kill(s.nbdPid, syscall.SIGTERM)
	}
}
