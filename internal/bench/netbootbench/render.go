package netbootbench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

// verdict says whether a target of at most limit was met in the median
// run and in the worst.
func verdict(median, worst, limit float64) string {
	if median <= limit && worst <= limit {
		return "met"
	}
	return "not met"
}

// write puts result.json and result.md in dir.
func write(res *report.Result, dir string, runs int, atOnce, atOnceDeskway []int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	s := res.Summary
	accel := res.SummaryText["accel"]
	var b strings.Builder
	fmt.Fprintf(&b, "# Network boot: power-on to the vDisk's init\n\n`%s`\n\nMeasured %s on %d CPUs, %d GiB, Linux %s, %s; load average at the end %s; qemu's accelerator %s.\n\n",
		res.Command, res.Started.Format("2006-01-02T15:04:05Z"), res.Machine.CPUs, res.Machine.MemBytes>>30, res.Machine.Kernel, res.Machine.Go, res.SummaryText["load_avg"], accel)
	b.WriteString(report.Table{Title: fmt.Sprintf("One VM, %d runs", runs), Head: []string{"system", "median run", "min", "max"}, Rows: [][]string{
		{"deskway-pxe (deskway's DHCP, iPXE script, HTTP, NBD)", fmt.Sprintf("%.2f s", s["pxe_boot_s"]), fmt.Sprintf("%.2f s", s["pxe_boot_s_min"]), fmt.Sprintf("%.2f s", s["pxe_boot_s_max"])},
		{"ltsp (udhcpd, dnsmasq proxyDHCP and TFTP, nbd-server copyonwrite)", fmt.Sprintf("%.2f s", s["ltsp_boot_s"]), fmt.Sprintf("%.2f s", s["ltsp_boot_s_min"]), fmt.Sprintf("%.2f s", s["ltsp_boot_s_max"])},
		{"qemu-nbd-direct (kernel given to qemu, qemu's own NBD client)", fmt.Sprintf("%.2f s", s["nbd_boot_s"]), fmt.Sprintf("%.2f s", s["nbd_boot_s_min"]), fmt.Sprintf("%.2f s", s["nbd_boot_s_max"])},
	}}.Markdown())
	kvm4 := verdict(s["pxe4_ratio_pxe1"], s["pxe4_ratio_pxe1_worst"], 1.3)
	if accel != "kvm" {
		kvm4 = "not met: measured on " + accel + ", the target is set with KVM"
	}
	rows := [][]string{
		{"deskway ≤ 1.0 × the LTSP stack", fmt.Sprintf("%.2f ×", s["pxe_ratio_ltsp"]), fmt.Sprintf("%.2f ×", s["pxe_ratio_ltsp_worst"]), verdict(s["pxe_ratio_ltsp"], s["pxe_ratio_ltsp_worst"], 1.0)},
		{"deskway ≤ 1.15 × qemu's own NBD client", fmt.Sprintf("%.2f ×", s["pxe_ratio_nbd"]), fmt.Sprintf("%.2f ×", s["pxe_ratio_nbd_worst"]), verdict(s["pxe_ratio_nbd"], s["pxe_ratio_nbd_worst"], 1.15)},
	}
	if _, ok := s["pxe4_ratio_pxe1"]; ok {
		rows = append(rows, []string{"4 VMs at once through deskway ≤ 1.3 × one (the slowest of the four), with KVM", fmt.Sprintf("%.2f ×", s["pxe4_ratio_pxe1"]), fmt.Sprintf("%.2f ×", s["pxe4_ratio_pxe1_worst"]), kvm4})
	}
	rows = append(rows, []string{"not a target: the LTSP stack ÷ qemu's own NBD client", fmt.Sprintf("%.2f ×", s["ltsp_ratio_nbd"]), fmt.Sprintf("%.2f ×", s["ltsp_ratio_nbd_worst"]), ""})
	b.WriteString("\n" + report.Table{Title: "Targets (ratios of the same run)", Head: []string{"target", "median run", "worst run", "verdict"}, Rows: rows}.Markdown())
	rows = nil
	for _, n := range append(slices.Clone(atOnce), atOnceDeskway...) {
		for _, sys := range systems {
			k := short[sys]
			key := fmt.Sprintf("%s%d_ratio_%s1", k, n, k)
			if _, ok := s[key]; !ok {
				continue
			}
			rows = append(rows, []string{fmt.Sprint(n), sys, fmt.Sprintf("%.2f s", s[fmt.Sprintf("%s%d_slowest_boot_s", k, n)]), fmt.Sprintf("%.2f ×", s[key]), fmt.Sprintf("%.2f ×", s[key+"_worst"])})
		}
	}
	b.WriteString("\n" + report.Table{Title: "Several VMs at once (the slowest boot ÷ the same system's one VM of the same run)", Head: []string{"VMs", "system", "slowest, median run", "ratio, median run", "worst run"}, Rows: rows}.Markdown())
	rows = nil
	for _, p := range res.Points {
		cell := func(k string) string {
			if v, ok := p.Metrics[k]; ok {
				return fmt.Sprintf("%.2f", v)
			}
			return "–"
		}
		vm := ""
		if v, ok := p.Params["vm"]; ok {
			vm = fmt.Sprint(v)
		}
		rows = append(rows, []string{fmt.Sprint(p.Params["run"]), p.Scenario, p.System, vm, fmt.Sprint(p.Params["accel"]), cell("ipxe_s"), cell("banner_s"), cell("dhcp_s"), cell("script_s"), cell("kernel_s"), cell("root_s"), cell("boot_s")})
	}
	b.WriteString("\n" + report.Table{Title: "Every boot (seconds from qemu's start)", Head: []string{"run", "scenario", "system", "VM", "qemu accelerator", "iPXE up", "key sent at the banner", "iPXE's DHCP", "script", "kernel's initramfs", "root disk", "vDisk init"}, Rows: rows}.Markdown())
	fmt.Fprintf(&b, `
## How it was measured

- Two network namespaces, each with a bridge (10.77.0.1/24) and tap devices, the same addresses in both: deskway in one, the LTSP stack in the other, so each is the only boot service its VMs see. One ext4 vDisk image, whose /sbin/init prints a marker and powers off, is served by both.
- deskway-pxe: qemu-system-x86_64 (256 MiB, no disk, -boot n, virtio-net with qemu's iPXE option ROM); deskway's stream role with stream.netboot (full DHCP): DHCP and the iPXE script from deskway, the kernel and initramfs over HTTP, the root disk from deskway's NBD server through deskway-nbdroot and the kernel's NBD client.
- ltsp: the same VM; busybox udhcpd gives the address, dnsmasq (proxyDHCP, TFTP, no DNS, bound to the bridge) names ltsp/ltsp.ipxe to iPXE and serves it, the same kernel and the same initramfs over TFTP; nbd-server exports the same image with copyonwrite = true. The script's kernel command line is deskway's, naming nbd-server's export.
- qemu-nbd-direct: the same kernel given to qemu with -kernel and an initramfs that mounts /dev/vda, whose disk is qemu's own NBD client to deskway's NBD server: the floor.
- qemu's iPXE ROM shows a banner and waits 2 s ("Press Ctrl-B for the iPXE command line"); the bench sends a space on the serial console when the banner appears, for deskway and LTSP alike, which ends the wait.
- Each boot is timed from qemu's start to the marker on its serial console; the steps between come from the console's lines. %d runs, the three systems taking turns to go first; in each run, then, %v VMs at once through each system and %v through deskway alone, whose slowest boot is compared with the same system's single boot of the same run.
- qemu's accelerator: %s (%s). It is KVM when a guest kernel boots on this machine's /dev/kvm, TCG otherwise; every boot's row names it. On TCG a boot is mostly CPU, so VMs at once on this machine's %d CPUs take longer whichever way they boot; qemu's own NBD client shows by how much when no boot service is involved.
`, runs, atOnce, atOnceDeskway, accel, res.SummaryText["accel_why"], res.Machine.CPUs)
	return os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644)
}
