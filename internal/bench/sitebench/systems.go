package sitebench

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/curve25519"
)

// The systems, by the names their points carry.
const (
	sysGRE    = "deskway-gre"
	sysKernel = "deskway-gre-kernel"
	sysWG     = "deskway-wireguard"
	sysWGGo   = "wireguard-go"
	sysVXLAN  = "vxlan"
	sysDirect = "direct"
)

// Systems are every system the bench measures, in the first run's order.
var Systems = []string{sysGRE, sysKernel, sysWG, sysWGGo, sysVXLAN, sysDirect}

// env is what the systems are started with.
type env struct {
	deskway string // the deskway binary
	wgGo    string // wireguard-go's program; empty when wgGoWhy says why not
	wgGoWhy string
	dir     string // scratch
}

// running is a system brought up in a rig: the gateway's process, if
// the gateway is one, and how to take the system down.
type running struct {
	gateway *proc
	office  *proc
	// admin is the gateway's admin address in its namespace, for
	// profiles, and adminCert the certificate it serves (deskway only).
	admin, adminCert, officeCert string
}

func (s *running) stop() {
	for _, p := range []*proc{s.gateway, s.office} {
		if p != nil {
			p.stop()
		}
	}
}

// start brings system name up in r.
func (e *env) start(ctx context.Context, name string, r *rig) (*running, error) {
	switch name {
	case sysDirect:
		return &running{}, r.ips(
			[]string{r.lan, "link", "add", "up0", "type", "veth", "peer", "name", "lan0", "netns", r.ro},
			[]string{r.lan, "addr", "add", "172.16.1.2/30", "dev", "up0"},
			[]string{r.ro, "addr", "add", "172.16.1.1/30", "dev", "lan0"},
			[]string{r.lan, "link", "set", "up0", "up"},
			[]string{r.ro, "link", "set", "lan0", "up"},
			[]string{r.lan, "route", "add", "10.0.0.0/24", "via", "172.16.1.1", "src", "192.168.1.10"},
			[]string{r.ro, "route", "add", "192.168.1.0/24", "via", "172.16.1.2"},
			[]string{r.ro, "route", "add", "10.0.0.0/24", "via", "198.51.100.1"},
			[]string{r.gw, "link", "add", "c0", "type", "veth", "peer", "name", "g0", "netns", r.comp},
			[]string{r.gw, "addr", "add", "172.16.2.1/30", "dev", "c0"},
			[]string{r.comp, "addr", "add", "172.16.2.2/30", "dev", "g0"},
			[]string{r.gw, "link", "set", "c0", "up"},
			[]string{r.comp, "link", "set", "g0", "up"},
			[]string{r.gw, "route", "add", "10.0.0.0/24", "via", "172.16.2.2"},
			[]string{r.gw, "route", "add", "192.168.1.0/24", "via", "198.51.100.2"},
			[]string{r.comp, "route", "add", "192.168.1.0/24", "via", "172.16.2.1"},
		)
	case sysVXLAN:
		// Each end's VXLAN device is made on the underlay and moved
		// into the LAN or the compartment: its UDP socket stays on the
		// underlay, as a tunnel's inside and outside are split in the
		// other systems.
		return &running{}, r.ips(
			[]string{r.ro, "link", "add", "vx0", "type", "vxlan", "id", "42", "local", "198.51.100.2", "remote", "198.51.100.1", "dstport", "4789", "dev", "ul0"},
			[]string{r.ro, "link", "set", "vx0", "netns", r.lan},
			[]string{r.gw, "link", "add", "vx0", "type", "vxlan", "id", "42", "local", "198.51.100.1", "remote", "198.51.100.2", "dstport", "4789", "dev", "ul0"},
			[]string{r.gw, "link", "set", "vx0", "netns", r.comp},
			[]string{r.lan, "addr", "add", "172.16.3.2/30", "dev", "vx0"},
			[]string{r.comp, "addr", "add", "172.16.3.1/30", "dev", "vx0"},
			[]string{r.lan, "link", "set", "vx0", "up"},
			[]string{r.comp, "link", "set", "vx0", "up"},
			[]string{r.lan, "route", "add", "10.0.0.0/24", "via", "172.16.3.1", "src", "192.168.1.10"},
			[]string{r.comp, "route", "add", "192.168.1.0/24", "via", "172.16.3.2"},
		)
	case sysGRE:
		return e.startDeskway(ctx, r, datapath(greGateway, "userspace"), datapath(greOffice, "userspace"))
	case sysKernel:
		return e.startDeskway(ctx, r, datapath(greGateway, "kernel"), datapath(greOffice, "kernel"))
	case sysWG:
		return e.startDeskwayWG(ctx, r)
	case sysWGGo:
		return e.startWireGuardGo(ctx, r)
	}
	return nil, fmt.Errorf("no system %q", name)
}

// datapath is a GRE config with site.datapath set to dp: the same
// tunnels through deskway's userspace datapath or its tc programs.
func datapath(cfg, dp string) string {
	return strings.Replace(cfg, "site:\n", "site:\n  datapath: "+dp+"\n", 1)
}

// The gateway and the office router for GRE: deskway site at both ends
// (the kernel has no ip_gre), with their tenants' namespaces being the
// compartment and the LAN the rig made.
const greGateway = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["%[3]s"]}
site:
  underlay: {addresses: [198.51.100.1]}
  tenants:
  - name: a
    key: 1001
    namespace: %[2]s
    prefixes: [10.0.0.0/24]
    sites:
    - {name: office, peer: 198.51.100.2, prefixes: [192.168.1.0/24]}
`

const greOffice = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["%[3]s"]}
site:
  underlay: {addresses: [198.51.100.2]}
  tenants:
  - name: office
    key: 1001
    namespace: %[2]s
    prefixes: [192.168.1.0/24]
    sites:
    - {name: gateway, peer: 198.51.100.1, prefixes: [10.0.0.0/24]}
`

// adminToken opens the bench's deskways' admin APIs (loopback in their
// own namespaces), for CPU profiles.
const adminToken = "sitebench-admin-token"

func (e *env) startDeskway(ctx context.Context, r *rig, gwCfg, officeCfg string) (*running, error) {
	s := &running{admin: "127.0.0.1:9443"}
	for _, side := range []struct {
		name, cfg, ns, tenantNS string
		p                       **proc
	}{{"gateway", gwCfg, r.gw, r.comp, &s.gateway}, {"office", officeCfg, r.ro, r.lan, &s.office}} {
		path := filepath.Join(e.dir, r.sfx+"-"+side.name+".yaml")
		state := filepath.Join(e.dir, r.sfx+"-"+side.name+"-state")
		if side.name == "gateway" {
			s.adminCert = filepath.Join(state, "tls.crt")
		} else {
			s.officeCert = filepath.Join(state, "tls.crt")
		}
		body := fmt.Sprintf(side.cfg, state, side.tenantNS, adminToken)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			s.stop()
			return nil, err
		}
		p, err := startProc(ctx, side.ns, e.deskway, "site", "-c", path)
		if err != nil {
			s.stop()
			return nil, err
		}
		*side.p = p
		if err := p.waitFor(`"msg":"site gateway forwarding"`, 30*time.Second); err != nil {
			s.stop()
			return nil, fmt.Errorf("deskway site (%s): %w", side.name, err)
		}
	}
	return s, nil
}

// The WireGuard gateway and office: deskway site with a WireGuard
// tenant at both ends, the office calling the gateway.
const wgGateway = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["%[3]s"]}
site:
  tenants:
  - name: a
    key: 1001
    namespace: %[2]s
    prefixes: [10.0.0.0/24]
    wireguard:
      listen_port: 51820
      private_key: file:%[4]s
      sites:
      - {name: office, public_key: "%[5]s", prefixes: [192.168.1.0/24]}
`

const wgOffice = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["%[3]s"]}
site:
  tenants:
  - name: office
    key: 1001
    namespace: %[2]s
    prefixes: [192.168.1.0/24]
    wireguard:
      listen_port: 51820
      private_key: file:%[4]s
      sites:
      - {name: gateway, public_key: "%[5]s", endpoint: "198.51.100.1:51820", prefixes: [10.0.0.0/24]}
`

func (e *env) startDeskwayWG(ctx context.Context, r *rig) (*running, error) {
	gwKey, gwPub, err := e.wgKey(r.sfx + "-gateway")
	if err != nil {
		return nil, err
	}
	offKey, offPub, err := e.wgKey(r.sfx + "-office")
	if err != nil {
		return nil, err
	}
	// The keys' paths and the peer's public key go in as the fourth and
	// fifth arguments; the first three are startDeskway's.
	gw := strings.NewReplacer("%[4]s", gwKey, "%[5]s", offPub).Replace(wgGateway)
	off := strings.NewReplacer("%[4]s", offKey, "%[5]s", gwPub).Replace(wgOffice)
	return e.startDeskway(ctx, r, gw, off)
}

// wgKey writes a new private key as wg genkey would and returns its
// path and its public key.
func (e *env) wgKey(name string) (path, public string, err error) {
	k, pub, err := newKeyPair()
	if err != nil {
		return "", "", err
	}
	path = filepath.Join(e.dir, name+".key")
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(k[:])+"\n"), 0o600); err != nil {
		return "", "", err
	}
	return path, base64.StdEncoding.EncodeToString(pub[:]), nil
}

// newKeyPair makes a WireGuard key pair: a random Curve25519 private
// key, clamped as wg genkey clamps it, and its public key.
func newKeyPair() (priv, pub [32]byte, err error) {
	_, _ = rand.Read(priv[:])
	priv[0] &= 248
	priv[31] = (priv[31] & 127) | 64
	p, err := curve25519.X25519(priv[:], curve25519.Basepoint)
	if err != nil {
		return priv, pub, fmt.Errorf("WireGuard key: %w", err)
	}
	copy(pub[:], p)
	return priv, pub, nil
}

// startWireGuardGo runs wireguard-go's own program at both ends, each in
// the underlay's namespace (its UDP socket there) with its TUN device
// moved into the LAN or the compartment, as deskway's WireGuard tenant
// places them.
func (e *env) startWireGuardGo(ctx context.Context, r *rig) (*running, error) {
	if e.wgGo == "" {
		return nil, fmt.Errorf("%w: %s", errSkip, e.wgGoWhy)
	}
	var keys, pubs [2][32]byte
	for i := range keys {
		var err error
		if keys[i], pubs[i], err = newKeyPair(); err != nil {
			return nil, err
		}
	}
	s := &running{}
	ends := []struct {
		ns, inner, ifname, peerEndpoint, allowed string
		p                                        **proc
	}{
		{r.gw, r.comp, "wbg" + r.sfx, "", "192.168.1.0/24", &s.gateway},
		{r.ro, r.lan, "wbo" + r.sfx, "198.51.100.1:51820", "10.0.0.0/24", &s.office},
	}
	for i, end := range ends {
		p, err := startProc(ctx, end.ns, e.wgGo, "-f", end.ifname)
		if err != nil {
			s.stop()
			return nil, err
		}
		*end.p = p
		sock := "/var/run/wireguard/" + end.ifname + ".sock"
		if err := waitPath(p, sock, 20*time.Second); err != nil {
			s.stop()
			return nil, err
		}
		cfg := fmt.Sprintf("set=1\nprivate_key=%s\nlisten_port=51820\nreplace_peers=true\npublic_key=%s\nreplace_allowed_ips=true\nallowed_ip=%s\n",
			hex.EncodeToString(keys[i][:]), hex.EncodeToString(pubs[1-i][:]), end.allowed)
		if end.peerEndpoint != "" {
			cfg += "endpoint=" + end.peerEndpoint + "\n"
		}
		if err := uapiSet(sock, cfg); err != nil {
			s.stop()
			return nil, err
		}
		if err := r.ips(
			[]string{end.ns, "link", "set", end.ifname, "netns", end.inner},
			[]string{end.inner, "link", "set", end.ifname, "up"},
			[]string{end.inner, "route", "add", end.allowed, "dev", end.ifname},
		); err != nil {
			s.stop()
			return nil, err
		}
	}
	return s, nil
}

// uapiSet sends a set operation to wireguard-go's configuration socket
// (the protocol wg speaks) and checks its answer.
func uapiSet(sock, cfg string) error {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return fmt.Errorf("wireguard-go's socket: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(cfg + "\n")); err != nil {
		return fmt.Errorf("configure wireguard-go: %w", err)
	}
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		return fmt.Errorf("configure wireguard-go: %w", err)
	}
	if ans := strings.TrimSpace(string(buf[:n])); ans != "errno=0" {
		return fmt.Errorf("configure wireguard-go: it answered %q", ans)
	}
	return nil
}

// proc is a program the bench runs in a namespace, its output kept.
type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	out    strings.Builder
	exited chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.out.String()
	if len(s) > 3000 {
		s = s[len(s)-3000:]
	}
	return s
}

// startProc runs name in namespace ns through nsenter, which enters the
// network namespace alone (ip netns exec would give the program a mount
// namespace of its own) and then becomes the program, so the process's
// PID is the program's.
func startProc(ctx context.Context, ns, name string, args ...string) (*proc, error) {
	p := &proc{exited: make(chan struct{})}
	p.cmd = exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + ns, name}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	return p, nil
}

// stop ends the program with SIGTERM, and SIGKILL if it is still there
// 10 seconds later.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// waitFor waits for text in the program's output.
func (p *proc) waitFor(text string, limit time.Duration) error {
	return p.waitUntil(limit, "no "+text+" in its output", func() bool { return strings.Contains(p.output(), text) })
}

func waitPath(p *proc, path string, limit time.Duration) error {
	return p.waitUntil(limit, "no "+path, func() bool { _, err := os.Stat(path); return err == nil })
}

// waitUntil polls ok until it holds, the program exits or limit passes.
func (p *proc) waitUntil(limit time.Duration, what string, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for !ok() {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited: %s", filepath.Base(p.cmd.Args[2]), p.output())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s after %s: %s", what, limit, p.output())
		}
	}
	return nil
}
