// Package netbootbench times a network boot from deskway: from a bare VM's
// power-on (qemu with no disk, -boot n) to its vDisk's init running as
// root over the kernel NBD client, beside the same VM booting the same
// vDisk the LTSP way (dnsmasq proxyDHCP and TFTP, nbd-server) and through
// qemu's own NBD client (kernel and initramfs given to qemu), one VM
// alone and several at once. Everything runs in network namespaces the
// bench makes and removes.
package netbootbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
)

// Options configure a run.
type Options struct {
	Runs int
	// Deskway is the deskway binary to run the stream role with (this
	// one by default); Helper is deskway-nbdroot (beside it by default).
	Deskway, Helper string
	Out, Command    string
	// AtOnce are the numbers of VMs booted at once through every system
	// (4 by default), and AtOnceDeskway those booted at once through
	// deskway alone (8 by default); 0 is none.
	AtOnce, AtOnceDeskway []int
	Log                   *slog.Logger
}

// config is the bench's deskway. Its VMs power off without an NBD
// disconnect, so each boot stays live for reconnect_window, a device
// boots several times a run, and every direct boot comes from the
// bench's own address: max_boots_per_client is raised above the boots
// of a few runs. Its kernels skip the IO-APIC timer check
// (no_timer_check, as cloud images do): on TCG and a loaded host, the
// check can miss the timer and panic the boot.
const config = `state_dir: %[1]s
log: {level: warn, format: text}
admin: {listen: "127.0.0.1:18999", tokens: [bench]}
stream:
  listen: "10.77.0.1:10809"
  tls: "off"
  clients: open
  max_boots_per_client: 64
  vdisks:
  - {name: golden, base: %[2]s, kernel: %[3]s, initrd: %[4]s, cmdline: "%[5]s"}
  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
`

// systems are the three ways a VM boots the vDisk, in the order of the
// first run; later runs rotate it, so each goes first as often.
var systems = []string{"deskway-pxe", "ltsp", "qemu-nbd-direct"}

// cmdline is the kernel command line of every boot, deskway's vDisk's.
const cmdline = "console=ttyS0 panic=-1 quiet no_timer_check"

// Run measures and writes the results to o.Out.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	if o.Runs == 0 {
		o.Runs = 3
	}
	if o.AtOnce == nil {
		o.AtOnce = []int{4}
	}
	if o.AtOnceDeskway == nil {
		o.AtOnceDeskway = []int{8}
	}
	// 0 stands for none.
	o.AtOnce = slices.DeleteFunc(o.AtOnce, func(n int) bool { return n == 0 })
	o.AtOnceDeskway = slices.DeleteFunc(o.AtOnceDeskway, func(n int) bool { return n == 0 })
	sizes := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(o.AtOnce), o.AtOnceDeskway...))))
	most := slices.Max(append(sizes, 1))
	if slices.Min(append(sizes, 2)) < 2 || most > 9 {
		return nil, errors.New("netboot bench: VMs at once are from 2 to 9")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("netboot bench: run as root (it makes network namespaces with a bridge and tap devices)")
	}
	for _, p := range []string{"ip", "ss", "qemu-system-x86_64", "busybox", "mkfs.ext4", "dnsmasq", "nbd-server"} {
		if _, err := exec.LookPath(p); err != nil {
			return nil, fmt.Errorf("netboot bench: %s is needed (scripts/install-deps.sh installs it)", p)
		}
	}
	if o.Deskway == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		o.Deskway = exe
	}
	if o.Helper == "" {
		o.Helper = filepath.Join(filepath.Dir(o.Deskway), "deskway-nbdroot")
	}
	if _, err := os.Stat(o.Helper); err != nil {
		return nil, fmt.Errorf("netboot bench: deskway-nbdroot (make build puts it beside deskway): %w", err)
	}
	dir, err := os.MkdirTemp("", "netbootbench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	kernel, _, err := Kernel()
	if err != nil {
		return nil, err
	}
	accel := ProbeAccelerator(ctx, kernel)
	o.Log.Info("qemu accelerator", "accel", accel.Name, "why", accel.Why)
	for _, d := range []string{"pxe", "disk", "ltsp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	pxeInitrd, err := RootInitramfs(filepath.Join(dir, "pxe"), o.Helper)
	if err != nil {
		return nil, err
	}
	diskInitrd, err := DiskInitramfs(filepath.Join(dir, "disk"))
	if err != nil {
		return nil, err
	}
	base := filepath.Join(dir, "golden.img")
	if err := VDisk(base); err != nil {
		return nil, err
	}
	var taps []string
	for i := 1; i <= most; i++ {
		taps = append(taps, fmt.Sprintf("tap%d", i))
	}
	// deskway and the LTSP stack each have a namespace of their own, the
	// same addresses in both: each is the only boot service its VMs see.
	ns, err := newNetns(taps...)
	if err != nil {
		return nil, err
	}
	defer ns.close()
	lns, err := newNetns(taps...)
	if err != nil {
		return nil, err
	}
	defer lns.close()
	stop, err := startDeskway(ns, o.Deskway, dir, base, kernel, pxeInitrd, most)
	if err != nil {
		return nil, err
	}
	defer stop()
	ltsp, err := startLTSP(lns, filepath.Join(dir, "ltsp"), kernel, pxeInitrd, base, cmdline)
	if err != nil {
		return nil, err
	}
	defer ltsp.stop()
	res := &report.Result{Bench: "netboot", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(), Summary: map[string]float64{},
		SummaryText: map[string]string{"accel": accel.Name, "accel_why": accel.Why}}
	qemu := func(n *netns, args ...string) *exec.Cmd {
		return n.command("qemu-system-x86_64", append(append(accel.Args(), "-m", "256", "-smp", "1", "-nographic", "-monitor", "none", "-no-reboot"), args...)...)
	}
	pxe := func(n *netns, vm int) *exec.Cmd {
		return qemu(n, "-boot", "n", "-netdev", fmt.Sprintf("tap,id=n0,ifname=tap%d,script=no,downscript=no", vm),
			"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:77:00:0%d", vm))
	}
	// bootOne boots VM vm (1…) of n at once through sys, a boot of its
	// own in run.
	bootOne := func(sys string, run, n, vm int) (boot, error) {
		switch sys {
		case "deskway-pxe":
			return timeBoot(ctx, pxe(ns, vm), fmt.Sprintf("pc%d", vm))
		case "ltsp":
			return timeBoot(ctx, pxe(lns, vm), fmt.Sprintf("52-54-00-77-00-0%d", vm))
		}
		id := fmt.Sprintf("direct%d-%d", n, vm)
		return timeBoot(ctx, qemu(ns, "-kernel", kernel, "-initrd", diskInitrd, "-append", cmdline+" deskway.id="+id,
			"-drive", fmt.Sprintf("file=nbd://10.77.0.1:10809/golden/%s/run%d,format=raw,if=virtio,cache=none", id, run)), id)
	}
	one := map[string][]float64{}
	crowd := map[string][]float64{} // by system and number of VMs, the slowest boot of each run
	for run := 1; run <= o.Runs; run++ {
		order := append(slices.Clone(systems[(run-1)%len(systems):]), systems[:(run-1)%len(systems)]...)
		for _, sys := range order {
			b, err := bootOne(sys, run, 1, 1)
			if err != nil {
				return nil, fmt.Errorf("run %d, %s: %w", run, sys, err)
			}
			res.Points = append(res.Points, report.Point{Scenario: "boot-one", System: sys, Params: map[string]any{"run": run}, Metrics: b.metrics()})
			o.Log.Info("boot", "system", sys, "run", run, "seconds", report.Round(b.total, 2))
			one[sys] = append(one[sys], b.total)
		}
		// Several at once through each system: on a machine whose VMs are
		// emulated the boots share the CPUs, and qemu's own NBD client
		// says how much of the time is that.
		for _, n := range sizes {
			for _, sys := range order {
				if !slices.Contains(o.AtOnce, n) && sys != "deskway-pxe" {
					continue
				}
				var wg sync.WaitGroup
				boots := make([]boot, n)
				errs := make([]error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						boots[i], errs[i] = bootOne(sys, run, n, i+1)
					}()
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					return nil, fmt.Errorf("run %d, %d at once, %s: %w", run, n, sys, err)
				}
				slowest := 0.0
				for i, b := range boots {
					slowest = max(slowest, b.total)
					res.Points = append(res.Points, report.Point{Scenario: fmt.Sprintf("boot-%d", n), System: sys, Params: map[string]any{"run": run, "vm": i + 1}, Metrics: b.metrics()})
				}
				crowd[fmt.Sprintf("%s/%d", sys, n)] = append(crowd[fmt.Sprintf("%s/%d", sys, n)], slowest)
				o.Log.Info("boot at once", "system", sys, "vms", n, "run", run, "slowest_seconds", report.Round(slowest, 2))
			}
		}
	}
	summarize(res, one, crowd)
	for _, p := range res.Points {
		p.Params["accel"] = accel.Name // every boot says what it ran on
	}
	res.SummaryText["load_avg"] = report.LoadAverage()
	if o.Out != "" {
		if err := write(res, o.Out, o.Runs, o.AtOnce, o.AtOnceDeskway); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// startDeskway runs deskway's stream role with its boot services in ns
// and adds devices pc1…pcN for the VMs' MACs; stop ends it.
func startDeskway(ns *netns, deskway, dir, base, kernel, initrd string, n int) (stop func(), err error) {
	cfg := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(config, filepath.Join(dir, "state"), base, kernel, initrd, cmdline)), 0o600); err != nil {
		return nil, err
	}
	srv, err := ns.start(deskway, "run", "-c", cfg)
	if err != nil {
		return nil, err
	}
	stop = srv.Kill
	add := func(i int) error {
		b, err := ns.command(deskway, "device", "add", "--mac", fmt.Sprintf("52:54:00:77:00:0%d", i), "--name", fmt.Sprintf("pc%d", i), "--vdisk", "golden", "-c", cfg).CombinedOutput()
		if err != nil {
			return fmt.Errorf("device add: %v: %s", err, b)
		}
		return nil
	}
	// The first device is added once deskway answers.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if err = add(1); err == nil {
			break
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("netboot bench: deskway did not start (%w):\n%s", err, srv.Output())
		}
	}
	for i := 2; i <= n; i++ {
		if err := add(i); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}
