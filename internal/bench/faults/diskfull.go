package faults

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
)

// DiskFull is a full disk under load: the broker's state directory (its
// SQLite database, the local host cache's copy and journal) on a small
// tmpfs that a file from outside fills while a launch storm and
// administrators' drains run, then deleted. Every launch and every admin
// action must be answered in full or refused with a sentence, nothing may
// be written in half (the database passes its integrity check and holds
// every launch and audit entry a client was told succeeded), and service
// must come back by itself once space returns.
func DiskFull() Scenario { return Scenario{Name: "disk", Run: runDisk} }

const diskYAML = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [%[4]s]}
auth:
  token_key: disk-bench-key-0123456789abcdef0123456789
broker:
  listen: "127.0.0.1:%[3]d"
  gateway: "gateway.bench:443"
  frontend_tokens: [%[5]s]
  heartbeat_interval: 1s
  delivery_groups:
  - {name: desk, groups: [staff], session_limit: 100000, logon_limit: 100000}
`

const (
	diskAdminToken    = "disk-bench-admin"
	diskFrontendToken = "disk-bench-frontend"
	// diskMountSize is the tmpfs the state directory is on: room for the
	// database and the write-ahead log SQLite lets grow to 4 MiB before
	// its automatic checkpoint, and little more.
	diskMountSize = "16m"
)

func runDisk(ctx context.Context, env Env, run int) ([]Outcome, error) {
	dir := filepath.Join(env.Work, fmt.Sprintf("disk-%d", run))
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("disk scenario: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "mount", "-t", "tmpfs", "-o", "size="+diskMountSize+",mode=0700", "tmpfs", state).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("disk scenario: mount a tmpfs on %s (needs root): %w: %s", state, err, out)
	}
	// Unmounted whatever happens; lazily, should anything still hold it.
	defer func() {
		if err := exec.Command("umount", state).Run(); err != nil {
			_ = exec.Command("umount", "-l", state).Run()
		}
	}()
	outs, err := diskBroker(ctx, env, dir, state)
	if err == nil {
		var o Outcome
		o, err = diskStream(ctx, env, filepath.Join(dir, "stream"), diskFaultFor(env))
		outs = append(outs, o)
	}
	for i := range outs {
		outs[i].Run = run
	}
	return outs, err
}

// diskLoad is what the storm and the administrators were answered.
type diskLoad struct {
	mu sync.Mutex
	// launched maps each user the broker said it placed to the session
	// and host it named.
	launched map[string]brokerapi.LaunchResponse
	// byHost is what the simulated hosts report running.
	byHost map[string][]brokerapi.Session
	// refused counts launches refused with a 503 and words; during
	// counts those between the fill and the space returning.
	refused, refusedDuring int
	// badRefusals are refusals that showed the user an internal error.
	badRefusals []string
	// otherErrs are answers that were neither a launch nor a refusal.
	otherErrs []string
	// drains counts the admin actions answered 200, by action path.
	drains      map[string]int
	adminRefuse int
	// lastOK and firstOKAfter time the launches answered.
	firstOKAfter time.Time
	firstAdminOK time.Time
}

func diskBroker(ctx context.Context, env Env, dir, state string) ([]Outcome, error) {
	ports, err := loopback.FreePorts(2)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "deskway.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(diskYAML, state, ports[0], ports[1], diskAdminToken, diskFrontendToken)), 0o600); err != nil {
		return nil, fmt.Errorf("disk scenario: %w", err)
	}
	hosts, workers, faultFor := 8, 16, diskFaultFor(env)
	if env.Small {
		hosts, workers = 3, 4
	}
	join, err := exec.CommandContext(ctx, env.Bin, "token", "join", "-c", cfg, "--group", "desk", "--uses", fmt.Sprint(hosts+1)).Output()
	if err != nil {
		return nil, fmt.Errorf("disk scenario: make a join token: %w", err)
	}
	broker, err := childproc.Start(nil, env.Bin, "broker", "-c", cfg)
	if err != nil {
		return nil, fmt.Errorf("disk scenario: start the broker: %w", err)
	}
	// The broker is given 10 s to write back what it holds, as its
	// service would be.
	stop := func() { broker.StopWithin(10 * time.Second) }
	defer stop()
	brokerAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	if err := loopback.WaitPort(brokerAddr, 20*time.Second); err != nil {
		return nil, fmt.Errorf("disk scenario: %w\n%s", err, broker.Output())
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 64}} //nolint:gosec // the broker's own self-signed certificate on loopback
	client := &brokerclient.Client{Base: "https://" + brokerAddr, HTTP: hc}
	admin := fmt.Sprintf("https://127.0.0.1:%d", ports[0])

	ld := &diskLoad{launched: map[string]brokerapi.LaunchResponse{}, byHost: map[string][]brokerapi.Session{}, drains: map[string]int{}}
	creds := map[string]string{}
	token := strings.TrimSpace(string(join))
	for i := range hosts + 1 {
		name := fmt.Sprintf("vda%02d", i+1)
		r, err := client.Register(ctx, token, brokerapi.RegisterRequest{Name: name, Address: name + ".bench", Port: 3389})
		if err != nil {
			return nil, fmt.Errorf("disk scenario: register %s: %w", name, err)
		}
		creds[name] = r.Credential
	}
	// The last host is the administrators': drained and undrained in
	// turn, it takes no launches.
	drainHost := fmt.Sprintf("vda%02d", hosts+1)
	if st, msg := diskAdmin(ctx, hc, admin, drainHost, true); st != http.StatusOK {
		return nil, fmt.Errorf("disk scenario: drain %s: HTTP %d %s", drainHost, st, msg)
	}

	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for name, cred := range creds {
		wg.Add(1)
		go func() { defer wg.Done(); ld.beat(lctx, client, name, cred) }()
	}
	var fillAt, backAt atomic.Int64
	var next atomic.Int64
	for range workers {
		wg.Add(1)
		go func() { defer wg.Done(); ld.storm(lctx, client, &next, &fillAt, &backAt) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); ld.administer(lctx, hc, admin, drainHost, &fillAt, &backAt) }()

	// The storm runs a while on a roomy disk, then the disk fills.
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return nil, err
	}
	filler := filepath.Join(state, "filler")
	filled, err := fill(filler)
	if err != nil {
		return nil, err
	}
	fillAt.Store(time.Now().UnixNano())
	env.Log.Info("state directory filled", "bytes", filled)
	if err := sleepCtx(ctx, faultFor); err != nil {
		return nil, err
	}
	if err := os.Remove(filler); err != nil {
		return nil, fmt.Errorf("disk scenario: %w", err)
	}
	back := time.Now()
	backAt.Store(back.UnixNano())
	// Service must come back by itself: the storm goes on until a launch
	// and an admin action succeed again, or 30 s pass.
	for deadline := back.Add(30 * time.Second); time.Now().Before(deadline); {
		ld.mu.Lock()
		ok := !ld.firstOKAfter.IsZero() && !ld.firstAdminOK.IsZero()
		ld.mu.Unlock()
		if ok {
			break
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return nil, err
		}
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return nil, err
	}
	cancel()
	wg.Wait()
	// The last admin action, on a disk with room, also writes any audit
	// entries still waiting.
	if st, msg := diskAdmin(ctx, hc, admin, drainHost, true); st != http.StatusOK {
		ls, _ := exec.Command("sh", "-c", "ls -la "+state+"; df "+state).CombinedOutput()
		return nil, fmt.Errorf("disk scenario: drain %s after the fault: HTTP %d %s\n%s\n%s", drainHost, st, msg, ls, tail(broker.Output(), 1000))
	}
	ld.drains["drain"]++
	stop()
	blog := broker.Output()
	db, err := checkBrokerDB(filepath.Join(state, "broker.db"), ld)
	if err != nil {
		return nil, err
	}
	outs := diskOutcomes(ld, db, blog, hosts, workers, time.Unix(0, fillAt.Load()), back)
	for _, o := range outs {
		if !o.Held {
			env.Log.Warn("broker log (its end)", "log", tail(blog, 6000))
			break
		}
	}
	return outs, nil
}

// diskFaultFor is how long a disk stays full.
func diskFaultFor(env Env) time.Duration {
	if env.Small {
		return 3 * time.Second
	}
	return 8 * time.Second
}

// tail is the end of a process's log.
func tail(s string, n int) string { return s[max(0, len(s)-n):] }

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// fill writes path until the disk it is on has no space left, and
// returns how much it wrote.
func fill(path string) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, fmt.Errorf("disk scenario: fill: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	var n int64
	for {
		w, err := f.Write(buf)
		n += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("disk scenario: fill: %w", err)
		}
	}
}

// storm launches new users one after another until ctx ends.
func (ld *diskLoad) storm(ctx context.Context, c *brokerclient.Client, next, fillAt, backAt *atomic.Int64) {
	for ctx.Err() == nil {
		user := fmt.Sprintf("user%06d", next.Add(1))
		res, _, err := c.Launch(ctx, brokerclient.Bearer(diskFrontendToken), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: user, Groups: []string{"staff"}})
		if ctx.Err() != nil {
			return
		}
		now := time.Now().UnixNano()
		during := fillAt.Load() != 0 && backAt.Load() == 0
		ld.mu.Lock()
		var se *brokerclient.StatusError
		switch {
		case err == nil:
			ld.launched[user] = *res
			ld.byHost[res.Host] = append(ld.byHost[res.Host], brokerapi.Session{User: user, State: "active"})
			if b := backAt.Load(); b != 0 && now >= b && ld.firstOKAfter.IsZero() {
				ld.firstOKAfter = time.Unix(0, now)
			}
		case errors.As(err, &se) && se.Status == http.StatusServiceUnavailable:
			ld.refused++
			if during {
				ld.refusedDuring++
			}
			if internalError(se.Message) {
				ld.badRefusals = append(ld.badRefusals, se.Message)
			}
		default:
			ld.otherErrs = append(ld.otherErrs, err.Error())
		}
		ld.mu.Unlock()
		if err != nil {
			// A refused client tries again shortly, as the portal's do.
			_ = sleepCtx(ctx, 50*time.Millisecond)
		}
	}
}

// internalError tells a message that shows the user an internal error
// (a wrapped Go error, a driver's code) from a sentence.
func internalError(msg string) bool {
	for _, s := range []string{"store:", "sqlite", "(13)", "SQLITE", "broker:", "no such file", "disk is full"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// beat reports the host's sessions, as an agent does, until ctx ends.
func (ld *diskLoad) beat(ctx context.Context, c *brokerclient.Client, name, cred string) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		ld.mu.Lock()
		ss := append([]brokerapi.Session{}, ld.byHost[name]...)
		ld.mu.Unlock()
		_, _ = c.Heartbeat(ctx, cred, brokerapi.Heartbeat{Host: name, CPU: 0.2, Memory: 0.3, DiskIdle: 0.9, Sessions: ss})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// administer drains and undrains host in turn until ctx ends.
func (ld *diskLoad) administer(ctx context.Context, hc *http.Client, admin, host string, fillAt, backAt *atomic.Int64) {
	for drain := false; ctx.Err() == nil; drain = !drain {
		st, msg := diskAdmin(ctx, hc, admin, host, drain)
		if ctx.Err() != nil {
			return
		}
		ld.mu.Lock()
		switch st {
		case http.StatusOK:
			ld.drains[map[bool]string{true: "drain", false: "undrain"}[drain]]++
			if b := backAt.Load(); b != 0 && time.Now().UnixNano() >= b && ld.firstAdminOK.IsZero() {
				ld.firstAdminOK = time.Now()
			}
		case http.StatusServiceUnavailable:
			ld.adminRefuse++
			if internalError(msg) {
				ld.badRefusals = append(ld.badRefusals, "admin: "+msg)
			}
		default:
			ld.otherErrs = append(ld.otherErrs, fmt.Sprintf("admin drain %v: HTTP %d %s", drain, st, msg))
		}
		ld.mu.Unlock()
		if st != http.StatusOK {
			// The action is not done: the administrator tries it again.
			drain = !drain
		}
		_ = sleepCtx(ctx, 100*time.Millisecond)
	}
}
