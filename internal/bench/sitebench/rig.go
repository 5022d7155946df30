package sitebench

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// rig is one system's world, five network namespaces with a random
// suffix: the office's LAN (the sender, 192.168.1.10), the office's
// router, the gateway, the tenant's compartment behind the gateway and
// the hosted desktop (the receiver, 10.0.0.10). The underlay joins the
// router and the gateway (198.51.100.2 and .1 on a veth); the
// compartment routes to the desktop over a veth. What joins the LAN to
// the router and the gateway to the compartment is the system's: a
// tunnel's inside, or plain veths.
type rig struct {
	sfx                     string
	lan, ro, gw, comp, desk string
	made                    []string
}

// newRig makes the namespaces and the links every system shares.
func newRig() (r *rig, err error) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	sfx := hex.EncodeToString(b[:])
	r = &rig{sfx: sfx, lan: "dwbl-" + sfx, ro: "dwbo-" + sfx, gw: "dwbg-" + sfx, comp: "dwbc-" + sfx, desk: "dwbd-" + sfx}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
		}
	}()
	for _, n := range []string{r.lan, r.ro, r.gw, r.comp, r.desk} {
		if err := run("ip", "netns", "add", n); err != nil {
			return r, err
		}
		r.made = append(r.made, n)
		if err := r.ip(n, "link", "set", "lo", "up"); err != nil {
			return r, err
		}
	}
	for _, n := range []string{r.ro, r.gw, r.comp} {
		if err := inNS(n, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0)
		}); err != nil {
			return r, fmt.Errorf("forwarding in %s: %w", n, err)
		}
	}
	steps := [][]string{
		{r.ro, "link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", r.gw},
		{r.ro, "addr", "add", "198.51.100.2/24", "dev", "ul0"},
		{r.gw, "addr", "add", "198.51.100.1/24", "dev", "ul0"},
		{r.ro, "link", "set", "ul0", "up"},
		{r.gw, "link", "set", "ul0", "up"},
		{r.comp, "link", "add", "hosted", "type", "veth", "peer", "name", "eth0", "netns", r.desk},
		{r.comp, "addr", "add", "10.0.0.1/24", "dev", "hosted"},
		{r.desk, "addr", "add", "10.0.0.10/24", "dev", "eth0"},
		{r.comp, "link", "set", "hosted", "up"},
		{r.desk, "link", "set", "eth0", "up"},
		{r.desk, "route", "add", "default", "via", "10.0.0.1"},
		{r.lan, "addr", "add", "192.168.1.10/32", "dev", "lo"},
	}
	for _, s := range steps {
		if err := r.ip(s[0], s[1:]...); err != nil {
			return r, err
		}
	}
	// The underlay's veths receive as a NIC does, every system alike.
	for _, n := range []string{r.ro, r.gw} {
		if err := CoalesceReceive(n, "ul0"); err != nil {
			return r, err
		}
	}
	return r, nil
}

// CoalesceReceive makes the veth dev in namespace ns receive and queue
// as a NIC does: coalescing what it receives (GRO, on by default in NICs) in a
// NAPI context of its own, a kernel thread, as a NIC's interrupt is
// apart from the sender. A veth's receiving otherwise runs in the
// sender's system call, one packet at a time, with nothing to coalesce;
// and it takes a packet a socket sent to NAPI, where GRO runs, only
// with rx-udp-gro-forwarding on too.
func CoalesceReceive(ns, dev string) error {
	if err := inNS(ns, func() error { return setGRO(dev) }); err != nil {
		return fmt.Errorf("GRO on %s in %s: %w", dev, ns, err)
	}
	// A veth has no queue of its own (noqueue) and drops what its peer's
	// ring cannot take; with one, as a NIC has (pfifo_fast, the kernel's
	// default), a full ring stops the queue instead.
	if err := run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "pfifo_fast"); err != nil {
		return fmt.Errorf("a queue on %s in %s: %w", dev, ns, err)
	}
	// /sys shows a namespace's devices only where it is mounted for it,
	// as ip netns exec does.
	if err := run("ip", "netns", "exec", ns, "sh", "-c", "echo 1 > /sys/class/net/"+dev+"/threaded"); err != nil {
		return fmt.Errorf("threaded NAPI on %s in %s: %w", dev, ns, err)
	}
	return nil
}

// setGRO turns rx-gro and rx-udp-gro-forwarding on for the interface
// dev in the calling thread's namespace (ethtool -K dev gro on
// rx-udp-gro-forwarding on).
func setGRO(dev string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ethtool := func(cmd unsafe.Pointer) error {
		// struct ifreq: the name, then ifr_data pointing at the command.
		var ifr struct {
			name [unix.IFNAMSIZ]byte
			data unsafe.Pointer
			_    [16]byte
		}
		copy(ifr.name[:], dev)
		ifr.data = cmd
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
			return e
		}
		return nil
	}
	const ethSSFeatures, ethGStringLen = 4, 32
	info := struct {
		cmd, _, mask uint32
		_            uint32
		count        uint32
	}{cmd: unix.ETHTOOL_GSSET_INFO, mask: 1 << ethSSFeatures}
	if err := ethtool(unsafe.Pointer(&info)); err != nil {
		return fmt.Errorf("ETHTOOL_GSSET_INFO: %w", err)
	}
	n := int(info.count)
	strs := make([]byte, 12+n*ethGStringLen)
	binary.NativeEndian.PutUint32(strs[0:], unix.ETHTOOL_GSTRINGS)
	binary.NativeEndian.PutUint32(strs[4:], ethSSFeatures)
	binary.NativeEndian.PutUint32(strs[8:], uint32(n))
	if err := ethtool(unsafe.Pointer(&strs[0])); err != nil {
		return fmt.Errorf("ETHTOOL_GSTRINGS: %w", err)
	}
	words := (n + 31) / 32
	set := make([]uint32, 2+2*words)
	set[0], set[1] = unix.ETHTOOL_SFEATURES, uint32(words)
	found := 0
	for i := range n {
		name := string(bytes.TrimRight(strs[12+i*ethGStringLen:12+(i+1)*ethGStringLen], "\x00"))
		if name == "rx-gro" || name == "rx-udp-gro-forwarding" {
			set[2+2*(i/32)] |= 1 << (i % 32)   // valid
			set[2+2*(i/32)+1] |= 1 << (i % 32) // requested
			found++
		}
	}
	if found != 2 {
		return fmt.Errorf("%s has no rx-gro or rx-udp-gro-forwarding feature", dev)
	}
	if err := ethtool(unsafe.Pointer(&set[0])); err != nil {
		return fmt.Errorf("ETHTOOL_SFEATURES: %w", err)
	}
	return nil
}

// close deletes every namespace the rig made. A deletion is tried
// again for a few seconds: while another program runs under ip netns
// exec, its mount namespace holds a copy of /run/netns, and removing a
// name fails with EBUSY until it ends.
func (r *rig) close() error {
	var errs []error
	for _, n := range r.made {
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if err = run("ip", "netns", "del", n); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	r.made = nil
	return errors.Join(errs...)
}

func (r *rig) ip(ns string, args ...string) error {
	return run("ip", append([]string{"-n", ns}, args...)...)
}

// ips runs several ip commands in namespaces, each line's first word
// naming the namespace, and stops at the first that fails.
func (r *rig) ips(lines ...[]string) error {
	for _, l := range lines {
		if err := r.ip(l[0], l[1:]...); err != nil {
			return err
		}
	}
	return nil
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// inNS runs f on a thread in the namespace name: the sockets f opens
// live there. The thread is never moved back; it ends with its
// goroutine, so no other goroutine runs in the namespace by accident.
func inNS(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := netns.GetFromName(name)
		if err != nil {
			errc <- fmt.Errorf("namespace %s: %w", name, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter namespace %s: %w", name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// errSkip marks a system that cannot run here: it is reported as a
// skipped point, not a failure of the bench.
var errSkip = errors.New("skipped")
