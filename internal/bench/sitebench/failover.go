package sitebench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/deskway/deskway/internal/pgcluster"
)

// The failover scenario's pair: two deskway site gateways over GRE
// electing the active one through a lease in PostgreSQL (lease 1 s), the
// office's deskway calling the pair's endpoint address 198.51.100.1,
// which the active holds on the underlay bridge beside 10.0.0.1 on the
// desktops' bridge.
const (
	// failoverConns is how many TCP connections stream across the kill.
	failoverConns = 8
	// haLease is the pair's lease: the passive takes over once it has
	// expired.
	haLease = "1s"
	// failoverTarget is the target for failover_s.
	failoverTarget = 3 * time.Second
	// probeEvery is the probes' pace, the failover time's resolution.
	probeEvery = 50 * time.Millisecond
)

// haGateway is one gateway of the pair: %[1]s its state, %[2]s the
// file holding the database's DSN, %[3]s its node name, %[4]s its
// tenant's namespace.
const haGateway = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:9443", tokens: ["` + adminToken + `"]}
site:
  underlay: {addresses: [198.51.100.1]}
  ha:
    database: file:%[2]s
    group: pair
    node: %[3]s
    lease: ` + haLease + `
    addresses:
    - {address: 198.51.100.1/24, interface: ul0}
  tenants:
  - name: a
    key: 1001
    namespace: %[4]s
    prefixes: [10.0.0.0/24]
    inside:
    - {address: 10.0.0.1/24, interface: hosted}
    sites:
    - {name: office, peer: 198.51.100.2, prefixes: [192.168.1.0/24]}
`

// haRig is the failover scenario's world: the rig's office LAN, office
// router and desktop, with the desktop on a bridge (hbr) rather than a
// veth, an underlay bridge (br0) in a namespace of its own, and two
// gateways, each with an underlay namespace (198.51.100.11 and .12 of
// their own) and a tenant's namespace on the desktops' bridge.
type haRig struct {
	*rig
	ul       string
	gw, comp [2]string
}

// newHARig makes the namespaces and links; the office router's underlay
// veth joins the bridge rather than a gateway.
func newHARig() (h *haRig, err error) {
	r, err := newRig()
	if err != nil {
		return nil, err
	}
	h = &haRig{rig: r, ul: "dwbu-" + r.sfx}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
		}
	}()
	// The rig's own gateway and compartment are the first gateway's.
	h.gw, h.comp = [2]string{r.gw, "dwbh-" + r.sfx}, [2]string{r.comp, "dwbk-" + r.sfx}
	for _, n := range []string{h.ul, h.gw[1], h.comp[1]} {
		if err := run("ip", "netns", "add", n); err != nil {
			return h, err
		}
		r.made = append(r.made, n)
		if err := r.ip(n, "link", "set", "lo", "up"); err != nil {
			return h, err
		}
	}
	for _, n := range []string{h.gw[1], h.comp[1]} {
		if err := inNS(n, func() error {
			return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0)
		}); err != nil {
			return h, fmt.Errorf("forwarding in %s: %w", n, err)
		}
	}
	// Undo the rig's point-to-point links: here the underlay and the
	// desktops' network are bridges.
	steps := [][]string{
		{r.gw, "link", "del", "ul0"},
		{r.comp, "link", "del", "hosted"},
		{h.ul, "link", "add", "br0", "type", "bridge"},
		{h.ul, "link", "set", "br0", "up"},
		{r.ro, "link", "add", "ul0", "type", "veth", "peer", "name", "of0", "netns", h.ul},
		{r.ro, "addr", "add", "198.51.100.2/24", "dev", "ul0"},
		{r.ro, "link", "set", "ul0", "up"},
		{h.ul, "link", "set", "of0", "master", "br0"},
		{h.ul, "link", "set", "of0", "up"},
		{r.desk, "link", "add", "hbr", "type", "bridge"},
		{r.desk, "link", "set", "hbr", "up"},
		{r.desk, "addr", "add", "10.0.0.10/24", "dev", "hbr"},
		{r.desk, "route", "add", "default", "via", "10.0.0.1"},
	}
	for i := range 2 {
		u, c := fmt.Sprintf("g%d0", i+1), fmt.Sprintf("c%d0", i+1)
		steps = append(steps,
			[]string{h.gw[i], "link", "add", "ul0", "type", "veth", "peer", "name", u, "netns", h.ul},
			[]string{h.gw[i], "addr", "add", fmt.Sprintf("198.51.100.%d/24", 11+i), "dev", "ul0"},
			[]string{h.gw[i], "link", "set", "ul0", "up"},
			[]string{h.ul, "link", "set", u, "master", "br0"},
			[]string{h.ul, "link", "set", u, "up"},
			[]string{h.comp[i], "link", "add", "hosted", "type", "veth", "peer", "name", c, "netns", r.desk},
			[]string{h.comp[i], "link", "set", "hosted", "up"},
			[]string{r.desk, "link", "set", c, "master", "hbr"},
			[]string{r.desk, "link", "set", c, "up"},
		)
	}
	// The rig's desktop veth went with the compartment's end.
	return h, r.ips(steps...)
}

// failoverSample is one failover run's figures.
type failoverSample struct {
	// seconds from the kill to the answer to the first probe sent
	// after the active had ended, which came through the passive.
	seconds float64
	// reset counts the connections that got a reset or another error;
	// stalled those whose bytes did not continue after the failover.
	reset, stalled int
	// bytesAfter is the least any connection delivered after the
	// failover.
	bytesAfter int64
}

// lost is how many connections did not survive.
func (s failoverSample) lost() int { return s.reset + s.stalled }

// failoverEnv is what every failover run shares: one PostgreSQL
// cluster, started at the first run, a database each run.
type failoverEnv struct {
	pg *pgcluster.Cluster
	n  int
}

func (f *failoverEnv) close() {
	if f.pg != nil {
		_ = f.pg.Stop()
	}
}

// measureFailover brings the pair up, streams failoverConns connections
// office → desktop while probing every probeEvery, kills the active with
// SIGKILL and measures.
func (e *env) measureFailover(ctx context.Context, o Options, f *failoverEnv) (failoverSample, error) {
	if f.pg == nil {
		if !pgcluster.Available() {
			return failoverSample{}, fmt.Errorf("%w: the gateways' lease lives in PostgreSQL, and it is not installed (the postgresql package)", errSkip)
		}
		pg, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			return failoverSample{}, fmt.Errorf("PostgreSQL for the gateways' lease: %w", err)
		}
		f.pg = pg
	}
	f.n++
	db := fmt.Sprintf("failover%d", f.n)
	if _, err := f.pg.CreateDB(ctx, db, ""); err != nil {
		return failoverSample{}, err
	}
	// The gateways' loopback is their namespaces' own: they reach the
	// server over its Unix socket.
	dsn := f.pg.SocketDSN(db)
	h, err := newHARig()
	if err != nil {
		return failoverSample{}, err
	}
	defer func() {
		if err := h.close(); err != nil {
			o.Log.Error("a namespace of the bench's is left behind: delete it with ip netns del", "error", err)
		}
	}()
	dsnFile := filepath.Join(e.dir, h.sfx+"-dsn")
	if err := os.WriteFile(dsnFile, []byte(dsn), 0o600); err != nil {
		return failoverSample{}, err
	}
	var gws [2]*proc
	defer func() {
		for _, p := range gws {
			if p != nil {
				p.stop()
			}
		}
	}()
	for i, want := range []string{`"msg":"took over as the active gateway"`, `"msg":"high availability: passive, watching the lease"`} {
		node := fmt.Sprintf("gw-%d", i+1)
		cfg := filepath.Join(e.dir, h.sfx+"-"+node+".yaml")
		body := fmt.Sprintf(haGateway, filepath.Join(e.dir, h.sfx+"-"+node+"-state"), dsnFile, node, h.comp[i])
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			return failoverSample{}, err
		}
		if gws[i], err = startProc(ctx, h.gw[i], e.deskway, "site", "-c", cfg); err != nil {
			return failoverSample{}, err
		}
		if err := gws[i].waitFor(want, 30*time.Second); err != nil {
			return failoverSample{}, fmt.Errorf("deskway site (%s): %w", node, err)
		}
	}
	officeCfg := filepath.Join(e.dir, h.sfx+"-office.yaml")
	if err := os.WriteFile(officeCfg, []byte(fmt.Sprintf(greOffice, filepath.Join(e.dir, h.sfx+"-office-state"), h.lan, adminToken)), 0o600); err != nil {
		return failoverSample{}, err
	}
	office, err := startProc(ctx, h.ro, e.deskway, "site", "-c", officeCfg)
	if err != nil {
		return failoverSample{}, err
	}
	defer office.stop()
	if err := office.waitFor(`"msg":"site gateway forwarding"`, 30*time.Second); err != nil {
		return failoverSample{}, fmt.Errorf("deskway site (office): %w", err)
	}
	rc, err := listen(h.rig)
	if err != nil {
		return failoverSample{}, err
	}
	defer rc.close()
	if err := reachable(ctx, h.rig, 20*time.Second); err != nil {
		return failoverSample{}, err
	}
	pr, err := StartProbe(h.lan)
	if err != nil {
		return failoverSample{}, err
	}
	defer pr.Close()
	if _, err := pr.AnswerAfter(ctx, time.Now(), 10*time.Second); err != nil {
		return failoverSample{}, fmt.Errorf("before the kill: %w", err)
	}
	st, err := startStreams(ctx, h.rig, failoverConns)
	if err != nil {
		return failoverSample{}, err
	}
	defer st.stop()
	// Every connection has delivered bytes before the kill, so what
	// comes after is its bytes continuing.
	if err := rc.waitEach(ctx, failoverConns, nil, 10*time.Second); err != nil {
		return failoverSample{}, fmt.Errorf("before the kill: %w", err)
	}
	if err := sleep(ctx, time.Second); err != nil {
		return failoverSample{}, err
	}
	killed := time.Now()
	if err := gws[0].cmd.Process.Kill(); err != nil {
		return failoverSample{}, fmt.Errorf("kill -9 the active: %w", err)
	}
	<-gws[0].exited
	gws[0] = nil
	// The active forwards until it has ended, its kernel datapath's
	// programs going with its last file: a request sent between the
	// signal and its end is answered by the active itself (0.00 s in
	// two runs), not by the passive.
	gone := time.Now()
	back, err := pr.AnswerAfter(ctx, gone, 60*time.Second)
	if err != nil {
		return failoverSample{}, fmt.Errorf("after the active was killed: %w (the passive: %s)", err, gws[1].output())
	}
	s := failoverSample{seconds: back.Sub(killed).Seconds()}
	// TCP resends on its own backoff, which doubles while the path is
	// down: give each connection twice the outage, and 10 s at least.
	at := rc.counts()
	limit := max(10*time.Second, 2*back.Sub(killed))
	_ = rc.waitEach(ctx, failoverConns, at, limit)
	after := rc.counts()
	s.bytesAfter = -1
	for i := range failoverConns {
		d := after[i] - at[i]
		if s.bytesAfter < 0 || d < s.bytesAfter {
			s.bytesAfter = d
		}
	}
	errs := st.stop()
	rerrs := rc.errors()
	for i := range failoverConns {
		switch {
		case errs[i] != nil || rerrs[i] != nil:
			s.reset++
			o.Log.Warn("failover: a connection did not survive", "connection", i, "sender", errs[i], "receiver", rerrs[i])
		case after[i] <= at[i]:
			s.stalled++
			o.Log.Warn("failover: a connection's bytes did not continue", "connection", i, "within", limit)
		}
	}
	return s, nil
}

// counts are the bytes of each connection so far, the probe reachable()
// opened first among them.
func (rc *receiver) counts() []int64 {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make([]int64, 0, len(rc.bytes))
	// The first accepted connection is reachable()'s, closed at once.
	for _, b := range rc.bytes[min(1, len(rc.bytes)):] {
		out = append(out, b.Load())
	}
	return out
}

func (rc *receiver) errors() []error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]error(nil), rc.errs[min(1, len(rc.errs)):]...)
}

// waitEach waits until each of n connections has more bytes than in
// since (nil: more than none), or limit passes.
func (rc *receiver) waitEach(ctx context.Context, n int, since []int64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c := rc.counts()
		done := len(c) >= n
		for i := 0; done && i < n; i++ {
			var was int64
			if since != nil {
				was = since[i]
			}
			done = c[i] > was
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not every one of %d connections delivered bytes within %s: %v", n, limit, c)
		}
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}
