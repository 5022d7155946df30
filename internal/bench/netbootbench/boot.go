package netbootbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/childproc"
)

// boot is one VM's boot, the seconds from qemu's start to each step its
// console showed.
type boot struct {
	total                                        float64
	ipxe, banner, dhcp, script, kernelUp, rooted float64 // -1 where a step was not seen
}

func (b boot) metrics() map[string]float64 {
	m := map[string]float64{"boot_s": report.Round(b.total, 2)}
	for k, v := range map[string]float64{"ipxe_s": b.ipxe, "banner_s": b.banner, "dhcp_s": b.dhcp, "script_s": b.script, "kernel_s": b.kernelUp, "root_s": b.rooted} {
		if v >= 0 {
			m[k] = report.Round(v, 2)
		}
	}
	return m
}

// bannerPrompt is the end of the banner qemu's iPXE ROM shows for 2 s
// before it boots (a wait compiled into Debian's iPXE); any key but
// Ctrl-B ends the wait, and SeaBIOS passes the serial console's input
// through to it. The ROM's earlier "Press Ctrl-B to configure iPXE",
// while SeaBIOS initialises it, is not this one.
const bannerPrompt = "Ctrl-B for the iPXE command line"

// timeBoot starts cmd and times its console up to Marker+name. A key
// (a space) goes to its serial console when iPXE's banner asks for one,
// so that the ROM's fixed wait is not counted, whoever serves the boot.
func timeBoot(ctx context.Context, cmd *exec.Cmd, name string) (boot, error) {
	b := boot{ipxe: -1, banner: -1, dhcp: -1, script: -1, kernelUp: -1, rooted: -1}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return b, err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return b, err
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return b, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// Long enough for emulated VMs on a loaded machine: four at once
	// on two busy cores have taken over 200 s.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	go func() { <-ctx.Done(); _ = cmd.Process.Kill() }()
	// The prompt ends in no newline while iPXE waits: it is watched for
	// in the bytes, not the lines.
	watch := &promptWatcher{r: out, prompt: []byte(bannerPrompt), seen: func() {
		b.banner = time.Since(start).Seconds()
		_, _ = in.Write([]byte(" "))
	}}
	sc := bufio.NewScanner(watch)
	var tail []string
	for sc.Scan() {
		line := sc.Text()
		at := time.Since(start).Seconds()
		tail = append(tail[max(0, len(tail)-30):], line)
		switch {
		case strings.Contains(line, "iPXE initialising devices") && b.ipxe < 0:
			b.ipxe = at
		case strings.Contains(line, "Configuring (net0") && b.dhcp < 0:
			// iPXE's banner is over: it starts DHCP.
			b.dhcp = at
		case (strings.Contains(line, "deskway: device ") || strings.Contains(line, "ltsp: ")) && b.script < 0:
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

// promptWatcher passes r through and calls seen, once, when prompt has
// gone by.
type promptWatcher struct {
	r      io.Reader
	prompt []byte
	seen   func()
	tail   []byte
	done   bool
}

func (p *promptWatcher) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if !p.done && n > 0 {
		p.tail = append(p.tail, b[:n]...)
		if bytes.Contains(p.tail, p.prompt) {
			p.done = true
			p.seen()
		}
		if len(p.tail) > len(p.prompt) {
			p.tail = p.tail[len(p.tail)-len(p.prompt):] // a prompt split across reads
		}
	}
	return n, err
}

// netns is a network namespace of the bench: a bridge br0 at
// 10.77.0.1/24 with tap devices, reaching nothing outside.
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

// start runs a server in n, in a process group of its own, keeping what
// it prints.
func (n *netns) start(name string, args ...string) (*childproc.Proc, error) {
	return childproc.Start(nil, "ip", append([]string{"netns", "exec", n.name, name}, args...)...)
}

func (n *netns) close() { _ = exec.Command("ip", "netns", "del", n.name).Run() }
