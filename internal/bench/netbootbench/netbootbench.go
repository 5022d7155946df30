// Package netbootbench times a network boot from deskway: from a bare VM's
// power-on (qemu with no disk, -boot n) to its vDisk's init running as
// root over the kernel NBD client, beside the same VM booting the same
// vDisk through qemu's own NBD client (kernel and initramfs given to
// qemu), and four VMs network-booting at once beside one alone. Everything
// runs in a network namespace the bench makes and removes.
package netbootbench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
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
	Log             *slog.Logger
}

// config is the bench's deskway. Its VMs power off without an NBD
// disconnect, so each boot stays live for reconnect_window, and one
// device boots twice a run: max_boots_per_client is raised above the
// boots of a few runs. Its kernels skip the IO-APIC timer check
// (no_timer_check, as cloud images do): on TCG and a loaded host, the
// check can miss the timer and panic the boot.
const config = `state_dir: %[1]s
log: {level: warn, format: text}
admin: {listen: "127.0.0.1:18999", tokens: [bench]}
stream:
  listen: "10.77.0.1:10809"
  tls: "off"
  clients: open
  max_boots_per_client: 16
  vdisks:
  - {name: golden, base: %[2]s, kernel: %[3]s, initrd: %[4]s, cmdline: "console=ttyS0 panic=-1 quiet no_timer_check"}
  netboot:
    interface: br0
    address: 10.77.0.1
    dhcp: full
    pool: {start: 10.77.0.100, end: 10.77.0.150}
`

// Run measures and writes the results to o.Out.
func Run(ctx context.Context, o Options) (*report.Result, error) {
	if o.Runs == 0 {
		o.Runs = 3
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("netboot bench: run as root (it makes a network namespace with a bridge and tap devices)")
	}
	for _, p := range []string{"ip", "qemu-system-x86_64", "busybox", "mkfs.ext4"} {
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
	if err := os.MkdirAll(filepath.Join(dir, "pxe"), 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(dir, "disk"), 0o755); err != nil {
		return nil, err
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
	ns, err := newNetns("tap1", "tap2", "tap3", "tap4")
	if err != nil {
		return nil, err
	}
	defer ns.close()
	cfg := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(config, filepath.Join(dir, "state"), base, kernel, pxeInitrd)), 0o600); err != nil {
		return nil, err
	}
	srv := ns.command(o.Deskway, "run", "-c", cfg)
	srvLog := &strings.Builder{}
	var slmu sync.Mutex
	srv.Stdout, srv.Stderr = lockedWriter{&slmu, srvLog}, lockedWriter{&slmu, srvLog}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var added bool
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && !added; time.Sleep(200 * time.Millisecond) {
		added = ns.command(o.Deskway, "device", "add", "--mac", "52:54:00:77:00:01", "--name", "pc1", "--vdisk", "golden", "-c", cfg).Run() == nil
	}
	if !added {
		slmu.Lock()
		defer slmu.Unlock()
		return nil, fmt.Errorf("netboot bench: deskway did not start:\n%s", srvLog.String())
	}
	for i := 2; i <= 4; i++ {
		if b, err := ns.command(o.Deskway, "device", "add", "--mac", fmt.Sprintf("52:54:00:77:00:0%d", i), "--name", fmt.Sprintf("pc%d", i), "--vdisk", "golden", "-c", cfg).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("device add: %v: %s", err, b)
		}
	}
	res := &report.Result{Bench: "netboot", Command: o.Command, Started: time.Now().UTC(), Machine: report.ThisMachine(), Summary: map[string]float64{},
		SummaryText: map[string]string{"accel": accel.Name, "accel_why": accel.Why}}
	qemu := func(args ...string) *exec.Cmd {
		return ns.command("qemu-system-x86_64", append(append(accel.Args(), "-m", "256", "-smp", "1", "-nographic", "-monitor", "none", "-no-reboot"), args...)...)
	}
	pxe := func(tap int) *exec.Cmd {
		return qemu("-boot", "n", "-netdev", fmt.Sprintf("tap,id=n0,ifname=tap%d,script=no,downscript=no", tap),
			"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:77:00:0%d", tap))
	}
	// direct boots the VM named id with qemu's own NBD client, a boot of
	// its own in run.
	direct := func(run int, id string) *exec.Cmd {
		return qemu("-kernel", kernel, "-initrd", diskInitrd, "-append", "console=ttyS0 panic=-1 quiet no_timer_check deskway.id="+id,
			"-drive", fmt.Sprintf("file=nbd://10.77.0.1:10809/golden/%s/run%d,format=raw,if=virtio,cache=none", id, run))
	}
	var pxe1, nbd1, pxe4, nbd4 []float64
	for run := 1; run <= o.Runs; run++ {
		order := []string{"pxe", "nbd"}
		if run%2 == 0 {
			order = []string{"nbd", "pxe"}
		}
		for _, sys := range order {
			var b boot
			if sys == "pxe" {
				b, err = timeBoot(ctx, pxe(1), "pc1")
			} else {
				b, err = timeBoot(ctx, direct(run, "direct"), "direct")
			}
			if err != nil {
				return nil, fmt.Errorf("run %d, %s: %w", run, sys, err)
			}
			name := map[string]string{"pxe": "deskway-pxe", "nbd": "qemu-nbd-direct"}[sys]
			res.Points = append(res.Points, report.Point{Scenario: "boot-one", System: name, Params: map[string]any{"run": run}, Metrics: b.metrics()})
			o.Log.Info("boot", "system", name, "run", run, "seconds", report.Round(b.total, 2))
			if sys == "pxe" {
				pxe1 = append(pxe1, b.total)
			} else {
				nbd1 = append(nbd1, b.total)
			}
		}
		// Four at once through deskway, then four through qemu's own NBD
		// client: on a machine whose VMs are emulated, four boots share
		// the CPUs, and the second says how much of the first is that.
		for _, sys := range []string{"deskway-pxe", "qemu-nbd-direct"} {
			var wg sync.WaitGroup
			boots := make([]boot, 4)
			errs := make([]error, 4)
			for i := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if sys == "deskway-pxe" {
						boots[i], errs[i] = timeBoot(ctx, pxe(i+1), fmt.Sprintf("pc%d", i+1))
					} else {
						id := fmt.Sprintf("direct%d", i+1)
						boots[i], errs[i] = timeBoot(ctx, direct(run, id), id)
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return nil, fmt.Errorf("run %d, four at once, %s: %w", run, sys, err)
			}
			slowest := 0.0
			for i, b := range boots {
				slowest = max(slowest, b.total)
				res.Points = append(res.Points, report.Point{Scenario: "boot-four", System: sys, Params: map[string]any{"run": run, "vm": i + 1}, Metrics: b.metrics()})
			}
			if sys == "deskway-pxe" {
				pxe4 = append(pxe4, slowest)
			} else {
				nbd4 = append(nbd4, slowest)
			}
			o.Log.Info("boot four at once", "system", sys, "run", run, "slowest_seconds", report.Round(slowest, 2))
		}
	}
	summarize(res, pxe1, nbd1, pxe4, nbd4)
	for _, p := range res.Points {
		p.Params["accel"] = accel.Name // every boot says what it ran on
	}
	if o.Out != "" {
		if err := write(res, o.Out, o.Runs); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// boot is one VM's boot, the seconds from qemu's start to each step its
// console showed.
type boot struct {
	total                                float64
	ipxe, dhcp, script, kernelUp, rooted float64 // -1 where a step was not seen
}

func (b boot) metrics() map[string]float64 {
	m := map[string]float64{"boot_s": report.Round(b.total, 2)}
	for k, v := range map[string]float64{"ipxe_s": b.ipxe, "dhcp_s": b.dhcp, "script_s": b.script, "kernel_s": b.kernelUp, "root_s": b.rooted} {
		if v >= 0 {
			m[k] = report.Round(v, 2)
		}
	}
	return m
}

// timeBoot starts cmd and times its console up to Marker+name.
func timeBoot(ctx context.Context, cmd *exec.Cmd, name string) (boot, error) {
	b := boot{ipxe: -1, dhcp: -1, script: -1, kernelUp: -1, rooted: -1}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return b, err
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return b, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	go func() { <-ctx.Done(); _ = cmd.Process.Kill() }()
	sc := bufio.NewScanner(out)
	var tail []string
	for sc.Scan() {
		line := sc.Text()
		at := time.Since(start).Seconds()
		tail = append(tail[max(0, len(tail)-30):], line)
		switch {
		case strings.Contains(line, "iPXE initialising devices") && b.ipxe < 0:
			b.ipxe = at
		case strings.Contains(line, "Configuring (net0") && b.dhcp < 0:
			// iPXE's own banner wait is over: it starts DHCP.
			b.dhcp = at
		case strings.Contains(line, "deskway: device ") && b.script < 0:
			b.script = at
		case (strings.Contains(line, "udhcpc: started") || strings.Contains(line, "Run /init")) && b.kernelUp < 0:
			b.kernelUp = at
		case strings.Contains(line, "deskway: root disk") && b.rooted < 0:
			b.rooted = at
		case strings.Contains(line, Marker+name):
			b.total = at
			return b, nil
		}
	}
	return b, fmt.Errorf("%s never showed %q; its console ended with:\n%s", name, Marker+name, strings.Join(tail, "\n"))
}

func summarize(res *report.Result, pxe1, nbd1, pxe4, nbd4 []float64) {
	var ratio, ratio4, nbdRatio4 []float64
	for i := range pxe1 {
		ratio = append(ratio, pxe1[i]/nbd1[i])
		ratio4 = append(ratio4, pxe4[i]/pxe1[i])
		nbdRatio4 = append(nbdRatio4, nbd4[i]/nbd1[i])
	}
	s := res.Summary
	s["pxe_boot_s"], s["pxe_boot_s_min"], s["pxe_boot_s_max"] = report.Round(median(pxe1), 2), report.Round(slices.Min(pxe1), 2), report.Round(slices.Max(pxe1), 2)
	s["nbd_boot_s"], s["nbd_boot_s_min"], s["nbd_boot_s_max"] = report.Round(median(nbd1), 2), report.Round(slices.Min(nbd1), 2), report.Round(slices.Max(nbd1), 2)
	s["pxe_ratio_nbd"], s["pxe_ratio_nbd_worst"] = report.Round(median(ratio), 2), report.Round(slices.Max(ratio), 2)
	s["pxe4_ratio_pxe1"], s["pxe4_ratio_pxe1_worst"] = report.Round(median(ratio4), 2), report.Round(slices.Max(ratio4), 2)
	s["pxe4_slowest_boot_s"] = report.Round(median(pxe4), 2)
	s["nbd4_ratio_nbd1"], s["nbd4_ratio_nbd1_worst"] = report.Round(median(nbdRatio4), 2), report.Round(slices.Max(nbdRatio4), 2)
	s["nbd4_slowest_boot_s"] = report.Round(median(nbd4), 2)
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

// netns is the bench's network namespace: a bridge br0 at 10.77.0.1/24
// with tap devices, reaching nothing outside.
type netns struct{ name string }

func newNetns(taps ...string) (*netns, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	n := &netns{name: "dwbench-" + hex.EncodeToString(b[:])}
	if out, err := exec.Command("ip", "netns", "add", n.name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	steps := [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "link", "add", "br0", "type", "bridge"},
		{"ip", "addr", "add", "10.77.0.1/24", "dev", "br0"}, {"ip", "link", "set", "br0", "up"}}
	for _, t := range taps {
		steps = append(steps, []string{"ip", "tuntap", "add", t, "mode", "tap"}, []string{"ip", "link", "set", t, "master", "br0", "up"})
	}
	for _, s := range steps {
		if out, err := n.command(s[0], s[1:]...).CombinedOutput(); err != nil {
			n.close()
			return nil, fmt.Errorf("%s: %v: %s", strings.Join(s, " "), err, out)
		}
	}
	return n, nil
}

func (n *netns) command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.name, name}, args...)...)
}

func (n *netns) close() { _ = exec.Command("ip", "netns", "del", n.name).Run() }

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
