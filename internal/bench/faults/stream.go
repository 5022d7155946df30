package faults

import (
	"cmp"
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/bootstorm"
	"github.com/deskway/deskway/internal/bench/report"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
)

// Stream is the stream server dying mid-boot-storm: clients replay the
// recorded boot, each writing a pattern naming itself and the write,
// while the server most of them are on is killed (an HA pair on a shared
// cache store), or the only server is killed and started again (write
// caches in RAM, then on its store). Every acknowledged write is read
// back afterwards and every read is compared with what the client's disk
// must hold.
func Stream() Scenario { return Scenario{Name: "stream", Run: runStream} }

// streamCase is one fault of the scenario.
type streamCase struct {
	name    string
	servers int  // 2: an HA pair
	shared  bool // stream.shared_cache
}

// killAt is the share of the storm's writes acknowledged when the server
// is killed: halfway through the boot's writes, most of them not yet
// flushed.
const killAt = 0.5

func runStream(ctx context.Context, env Env, run int) ([]Outcome, error) {
	ops, err := bootstorm.RecordedBoot()
	if err != nil {
		return nil, err
	}
	base, path, err := writeBase(env.Work, ops)
	if err != nil {
		return nil, err
	}
	d := newDisk(base, ops)
	clients := 200
	if env.Small {
		clients = 8
	}
	cases := []streamCase{
		{name: "HA pair on a shared cache store: kill -9 the server most clients are on", servers: 2, shared: true},
		{name: "single server, write caches in RAM: kill -9, then start again", servers: 1},
		{name: "single server, write caches on its store: kill -9, then start again", servers: 1, shared: true},
	}
	var out []Outcome
	for i, c := range cases {
		dir := filepath.Join(env.Work, fmt.Sprintf("stream-%d-%d", run, i))
		o, err := streamRun(ctx, env, c, d, path, dir, clients)
		if err != nil {
			return out, fmt.Errorf("stream scenario, %s: %w", c.name, err)
		}
		o.Run = run
		out = append(out, o)
	}
	return out, nil
}

// writeBase writes the golden image the trace reads, of incompressible
// bytes, and returns them with its path.
func writeBase(dir string, ops []bootstorm.Request) ([]byte, string, error) {
	var end int64
	for _, o := range ops {
		end = max(end, o.Off+int64(o.Len))
	}
	base := make([]byte, (end+1<<20-1)&^(1<<20-1))
	rand.New(rand.NewSource(37)).Read(base)
	path := filepath.Join(dir, "golden.img")
	if err := os.WriteFile(path, base, 0o600); err != nil {
		return nil, "", fmt.Errorf("stream scenario: golden image: %w", err)
	}
	return base, path, nil
}

const streamYAML = `state_dir: %[1]s
log: {level: warn, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [bench-admin]}
stream:
  listen: "127.0.0.1:%[3]d"
  tls: "off"
  clients: open
  store: %[4]s
  shared_cache: %[5]t
  reconnect_window: 2m
  max_inflight: 32
  max_unauthenticated: 100000
  max_unauthenticated_per_address: 100000 # every client of the storm comes from 127.0.0.1
  vdisks:
  - {name: golden, base: %[6]s}
`

// streamServer is one deskway stream process, which can be killed and
// started again on its address.
type streamServer struct {
	bin, cfg, addr string
	proc           *childproc.Proc
	// earlier is what the server printed before it was last started.
	earlier string
}

func newStreamServer(bin, dir, store, base string, shared bool) (*streamServer, error) {
	ports, err := loopback.FreePorts(2)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "deskway.yaml")
	body := fmt.Sprintf(streamYAML, filepath.Join(dir, "state"), ports[0], ports[1], store, shared, base)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		return nil, fmt.Errorf("stream scenario: %w", err)
	}
	s := &streamServer{bin: bin, cfg: cfg, addr: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	return s, s.start()
}

func (s *streamServer) start() error {
	if s.proc != nil {
		s.earlier += s.proc.Output()
	}
	p, err := childproc.Start(nil, s.bin, "stream", "-c", s.cfg)
	if err != nil {
		return fmt.Errorf("stream scenario: start the stream server: %w", err)
	}
	s.proc = p
	if err := loopback.WaitPort(s.addr, 15*time.Second); err != nil {
		s.kill()
		return fmt.Errorf("stream scenario: %w\n%s", err, s.log())
	}
	return nil
}

// log is everything the server printed, across its restarts.
func (s *streamServer) log() string { return s.earlier + s.proc.Output() }

// kill ends the server with SIGKILL and waits until it is gone.
func (s *streamServer) kill() { s.proc.Kill() }

// stop ends the server as its service would, with SIGTERM, and kills it
// after 10 s.
func (s *streamServer) stop() { s.proc.StopWithin(10 * time.Second) }

// streamRun runs one case with a fresh store and servers.
func streamRun(ctx context.Context, env Env, c streamCase, d *disk, base, dir string, n int) (Outcome, error) {
	store := filepath.Join(dir, "store")
	servers := make([]*streamServer, c.servers)
	addrs := make([]string, c.servers)
	defer func() {
		for _, s := range servers {
			if s != nil {
				s.stop()
			}
		}
	}()
	for i := range servers {
		sdir := filepath.Join(dir, fmt.Sprintf("server%d", i))
		if err := os.MkdirAll(sdir, 0o700); err != nil {
			return Outcome{}, fmt.Errorf("stream scenario: %w", err)
		}
		s, err := newStreamServer(env.Bin, sdir, store, base, c.shared)
		if err != nil {
			return Outcome{}, err
		}
		servers[i], addrs[i] = s, s.addr
	}
	var fault atomic.Int64
	rs := make([]*replayer, n)
	for i := range rs {
		order := addrs
		// A quarter of the clients list the second server first, so the
		// killed one carries most of the clients, not all.
		if len(addrs) == 2 && i%4 == 3 {
			order = []string{addrs[1], addrs[0]}
		}
		rs[i] = &replayer{id: i + 1, export: fmt.Sprintf("golden/client%d/boot1", i+1), servers: order, d: d,
			state: make([]int32, d.slots), depth: 4, scale: 1, fault: &fault}
	}
	var writes int
	for _, o := range d.ops {
		if o.Cmd == 'W' || o.Cmd == 'Z' {
			writes++
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var acked atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.run(rctx, func() { acked.Add(1) })
		}()
	}
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	defer func() { cancel(); <-allDone }()

	// The fault strikes once the storm is well under way.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for acked.Load() < int64(killAt*float64(writes*n)) {
		select {
		case <-allDone:
			return Outcome{}, fmt.Errorf("every client ended before the fault (%d of %d writes acknowledged)", acked.Load(), writes*n)
		case <-rctx.Done():
			return Outcome{}, rctx.Err()
		case <-tick.C:
		}
	}
	on := map[string]int{}
	for _, r := range rs {
		on[r.server()]++
	}
	victim := 0
	if len(addrs) == 2 && on[addrs[1]] > on[addrs[0]] {
		victim = 1
	}
	faultAt := time.Now()
	fault.Store(faultAt.UnixNano())
	servers[victim].kill()
	env.Log.Info("stream server killed", "case", c.name, "server", victim, "clients_on_it", on[addrs[victim]], "after", faultAt.Sub(start).Round(time.Millisecond))
	var back time.Duration
	if c.servers == 1 {
		if err := servers[0].start(); err != nil {
			return Outcome{}, err
		}
		back = time.Since(faultAt)
	}
	select {
	case <-allDone:
	case <-rctx.Done():
		<-allDone
	}
	o := streamOutcome(c, rs, d, faultAt, back)
	o.Notes = fmt.Sprintf("kill -9 at %.1f s into the storm, %d of %d clients on the killed server; %s", faultAt.Sub(start).Seconds(), on[addrs[victim]], n, o.Notes)
	env.Log.Info("stream case", "case", c.name, "held", o.Held, "metrics", o.Metrics, "notes", o.Notes)
	if !o.Held {
		for i, s := range servers {
			l := s.log()
			env.Log.Warn("stream server log (its end)", "server", i, "log", l[max(0, len(l)-4000):])
		}
	}
	return o, nil
}

// seconds is d in seconds, to the millisecond.
func seconds(d time.Duration) float64 { return report.Round(d.Seconds(), 3) }

// streamOutcome counts what the clients saw.
func streamOutcome(c streamCase, rs []*replayer, d *disk, faultAt time.Time, back time.Duration) Outcome {
	var finished, ioErrs, refused, reconnected, wrong, affected, acked, lost, verified, loud int
	var longest, across, recover []time.Duration
	var firstErr, firstWrong error
	for _, r := range rs {
		r.mu.Lock()
		if r.finished {
			finished++
		}
		if r.ioErr != nil {
			ioErrs++
			firstErr = cmp.Or(firstErr, r.ioErr)
		}
		if r.refused != nil {
			refused++
			// Gone with the boot, and said so: the client's disk fails.
			loud += r.acked
		}
		if r.wrong != nil {
			wrong++
			firstWrong = cmp.Or(firstWrong, r.wrong)
		}
		if r.gen > 0 {
			reconnected++
		}
		if !r.firstAfter.IsZero() {
			recover = append(recover, r.firstAfter.Sub(faultAt))
		}
		if r.ioErr != nil || r.refused != nil || r.gen > 0 || r.across > time.Second {
			affected++
		}
		acked += r.acked
		lost += r.lost
		verified += r.verified
		longest = append(longest, r.longest)
		if r.across > 0 {
			across = append(across, r.across)
		}
		r.mu.Unlock()
	}
	n := len(rs)
	var writes, read int64
	var reqs int
	for _, op := range d.ops {
		switch op.Cmd {
		case 'W', 'Z':
			writes += int64(op.Len)
		case 'R':
			read += int64(op.Len)
		}
		if op.Cmd != 'T' {
			reqs++
		}
	}
	stallMax := slices.Max(longest)
	m := map[string]float64{
		"clients": float64(n), "clients_finished": float64(finished), "io_errors": float64(ioErrs),
		"refused": float64(refused), "reconnected": float64(reconnected), "writes_acked": float64(acked),
		"writes_verified": float64(verified), "writes_lost": float64(lost), "writes_of_refused_boots": float64(loud), "wrong_disks": float64(wrong),
		"stall_max_s": seconds(stallMax), "stall_median_s": seconds(medianDuration(longest)),
	}
	if len(across) > 0 {
		// The stalls the fault caused, beside those of the storm itself.
		m["stall_fault_max_s"] = seconds(slices.Max(across))
		m["stall_fault_median_s"] = seconds(medianDuration(across))
	}
	recoverS := -1.0
	if len(recover) > 0 {
		m["recover_median_s"] = seconds(medianDuration(recover))
		m["recover_max_s"] = seconds(slices.Max(recover))
		recoverS = m["recover_max_s"]
	}
	if back > 0 {
		m["server_back_s"] = seconds(back)
		if len(recover) == 0 {
			recoverS = m["server_back_s"]
		}
	}
	held := lost == 0 && wrong == 0 && ioErrs == 0
	if c.servers == 2 {
		// An HA pair promises more: every client goes on, unaware.
		held = held && refused == 0 && finished == n
	} else {
		held = held && finished+refused == n
	}
	notes := fmt.Sprintf("%d clients went on, %d were refused with the reason (the boot's write cache was lost), %d saw an I/O error; %d acknowledged writes read back, %d lost; %d wrong disks",
		finished, refused, ioErrs, verified, lost, wrong)
	if firstErr != nil {
		notes += "; first I/O error: " + firstErr.Error()
	}
	if firstWrong != nil {
		notes += "; first wrong disk: " + firstWrong.Error()
	}
	return Outcome{
		Scenario: "stream", Case: c.name, Users: n, Affected: affected, RecoverS: recoverS, Metrics: m, Held: held, Notes: notes,
		Load: fmt.Sprintf("%d clients replaying the recorded boot at its pace (%d requests each: %d MiB read, %d MiB written, 4 in flight)",
			n, reqs, read>>20, writes>>20),
	}
}
