package netbootbench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/deskway/deskway/internal/bench/report"
)

// write puts result.json and result.md in dir.
func write(res *report.Result, dir string, runs int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := res.WriteJSON(dir); err != nil {
		return err
	}
	s := res.Summary
	var b strings.Builder
	fmt.Fprintf(&b, "# Network boot: power-on to the vDisk's init\n\n`%s`\n\nMeasured %s on %d CPUs, %d GiB, Linux %s, %s.\n\n",
		res.Command, res.Started.Format("2006-01-02T15:04:05Z"), res.Machine.CPUs, res.Machine.MemBytes>>30, res.Machine.Kernel, res.Machine.Go)
	b.WriteString(report.Table{Title: "Targets", Head: []string{"target", "median run", "worst run"}, Rows: [][]string{
		{"PXE boot ≤ 1.3 × qemu's own NBD boot", fmt.Sprintf("%.2f × (%.2f s against %.2f s)", s["pxe_ratio_nbd"], s["pxe_boot_s"], s["nbd_boot_s"]), fmt.Sprintf("%.2f ×", s["pxe_ratio_nbd_worst"])},
		{"4 VMs at once ≤ 1.5 × one alone (the slowest of the four)", fmt.Sprintf("%.2f × (%.2f s)", s["pxe4_ratio_pxe1"], s["pxe4_slowest_boot_s"]), fmt.Sprintf("%.2f ×", s["pxe4_ratio_pxe1_worst"])},
		{"for comparison, not a target: 4 VMs at once through qemu's own NBD client ÷ one", fmt.Sprintf("%.2f × (%.2f s)", s["nbd4_ratio_nbd1"], s["nbd4_slowest_boot_s"]), fmt.Sprintf("%.2f ×", s["nbd4_ratio_nbd1_worst"])},
	}}.Markdown())
	rows := [][]string{}
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
		rows = append(rows, []string{fmt.Sprint(p.Params["run"]), p.Scenario, p.System, vm, fmt.Sprint(p.Params["accel"]), cell("ipxe_s"), cell("dhcp_s"), cell("script_s"), cell("kernel_s"), cell("root_s"), cell("boot_s")})
	}
	b.WriteString("\n" + report.Table{Title: "Every boot (seconds from qemu's start)", Head: []string{"run", "scenario", "system", "VM", "qemu accelerator", "iPXE up", "iPXE's DHCP", "script", "kernel's initramfs", "root disk", "vDisk init"}, Rows: rows}.Markdown())
	fmt.Fprintf(&b, `
## How it was measured

- A network namespace with a bridge (10.77.0.1/24) and four tap devices; deskway (stream role with stream.netboot: full DHCP, TFTP, HTTP) serves one ext4 vDisk whose /sbin/init prints a marker and powers off.
- deskway-pxe: qemu-system-x86_64 (256 MiB, no disk, -boot n, virtio-net with qemu's iPXE option ROM): DHCP and the iPXE script from deskway, the kernel and initramfs over HTTP, udhcpc in the initramfs, the root disk through deskway-nbdroot and the kernel's NBD client.
- qemu-nbd-direct: the same kernel given to qemu with -kernel and an initramfs that mounts /dev/vda, whose disk is qemu's own NBD client to the same export server (a boot of its own).
- Each boot is timed from qemu's start to the marker on its serial console; the steps between come from the console's lines. %d runs, the two single-VM systems taking turns to go first; then four PXE VMs at once, whose slowest boot is compared with the single PXE boot of the same run, and four direct boots at once beside one direct boot.
- *iPXE's DHCP* is when qemu's iPXE ROM starts configuring the network: the 2 s before it are the ROM's own banner ("Press Ctrl-B for the iPXE command line"), the same on every boot. The steps after it are deskway's (DHCP, the script, the kernel and initramfs over HTTP), the kernel's boot, and the root disk.
- qemu's accelerator: %s (%s). It is KVM when a guest kernel boots on this machine's /dev/kvm, TCG otherwise; every boot's row names it. On TCG a boot is mostly CPU, so four at once on this machine's %d CPUs take longer whichever way they boot; the comparison row shows by how much when deskway's boot services are not involved.
`, runs, res.SummaryText["accel"], res.SummaryText["accel_why"], res.Machine.CPUs)
	return os.WriteFile(filepath.Join(dir, "result.md"), []byte(b.String()), 0o644)
}
