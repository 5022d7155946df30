package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/tlsconf"
)

// LinkAgent is the link between a session host's agent and the broker
// cut while users launch: the host goes on serving its users (their
// clients reach it directly), but its heartbeats and session reports
// stop. The broker must mark it unreachable once broker.heartbeat_timeout
// has passed since its last heartbeat, send it no launch from then on,
// take it back when its reports return, and lose no session record of
// its users. The hosts are the bench's simulated agents, which speak the
// agent's protocol and report as internal/agent does.
func LinkAgent() Scenario { return Scenario{Name: "link-agent", Run: runLinkAgent} }

// linkAgentTimes are the broker's heartbeat_timeout in this case and the
// cut, half as long again. The bench keeps the default's 30 s; the
// test's scale takes 10 s and checks the same things: the broker reads a
// host as stale at each launch and admin request, from the time since
// its last heartbeat, with no timer of its own, so the timeout's length
// only sets how long the case waits (the hosts heartbeat every second).
func linkAgentTimes(small bool) (heartbeatTimeout, cut time.Duration) {
	if small {
		return 10 * time.Second, 15 * time.Second
	}
	return farmHeartbeatTimeout, 45 * time.Second
}

func runLinkAgent(ctx context.Context, env Env, run int) ([]Outcome, error) {
	o, err := linkAgentRun(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("faults: link-agent, run %d: %w", run, err)
	}
	return []Outcome{o}, nil
}

// adminHosts reads the broker's view of its hosts: name to status.
func adminHosts(ctx context.Context, hc *http.Client, base string) (map[string]string, error) {
	var hosts []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	}
	if err := adminGet(ctx, hc, base+"/api/v1/broker/hosts", &hosts); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, h := range hosts {
		out[h.Name] = h.Status
	}
	return out, nil
}

// adminSessions is the broker's live session records: user to host.
func adminSessions(ctx context.Context, hc *http.Client, base string) (map[string]string, error) {
	var ss []struct {
		User string `json:"user"`
		Host string `json:"host"`
	}
	if err := adminGet(ctx, hc, base+"/api/v1/broker/sessions?limit=1000", &ss); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range ss {
		out[s.User] = s.Host
	}
	return out, nil
}

// adminPost posts body to the broker's admin API.
func adminPost(ctx context.Context, hc *http.Client, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	req.Header.Set("Authorization", "Bearer faults-admin-token")
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("faults: broker admin API: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("faults: broker admin API %s: %s", url, resp.Status)
	}
	return nil
}

func adminGet(ctx context.Context, hc *http.Client, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	req.Header.Set("Authorization", "Bearer faults-admin-token")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("faults: broker admin API: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("faults: broker admin API %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("faults: broker admin API %s: %w", url, err)
	}
	return nil
}

// agentLaunches is what the users' launches found, by phase.
type agentLaunches struct {
	onCut, elsewhere, failed int
	// onCutStale counts the launches placed on the cut host after
	// staleFrom: broker.heartbeat_timeout since the cut (its last
	// heartbeat was at most a second before the cut), and a second for
	// the broker's check.
	onCutStale int
	staleFrom  time.Time
	// lastOnCut is when the last launch was placed on the cut host.
	lastOnCut time.Time
}

// linkAgentRun starts one broker (its database on its own disk) with
// three session hosts, one reaching the broker through the fault proxy,
// launches users at a steady pace before, during and after a cut of that
// host's link longer than the heartbeat timeout, and compares the
// broker's session records with the sessions the hosts hold.
func linkAgentRun(ctx context.Context, env Env) (Outcome, error) {
	agentHeartbeatTimeout, agentCut := linkAgentTimes(env.Small)
	o := Outcome{Case: fmt.Sprintf("agent ↔ broker link cut for %s (broker.heartbeat_timeout %s)", agentCut, agentHeartbeatTimeout)}
	dir := filepath.Join(env.Work, "link-agent")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	f, err := startBrokerFarmTimeout(ctx, env, dir, filepath.Join(dir, "broker.db"), 1, 0, 100, 10, agentHeartbeatTimeout)
	if err != nil {
		return o, err
	}
	defer f.close()
	ctc, err := tlsconf.Trusting(filepath.Join(dir, "tls.crt"))
	if err != nil {
		return o, err
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ctc}}
	cfg, err := os.ReadFile(filepath.Join(f.brokers[0].state, "deskway.yaml"))
	if err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	am := regexp.MustCompile(`admin: \{listen: "([^"]+)"`).FindSubmatch(cfg)
	if am == nil {
		return o, fmt.Errorf("faults: no admin listener in the broker's config")
	}
	admin := "https://" + string(am[1])
	proxy, err := newFaultProxy(f.brokers[0].addr)
	if err != nil {
		return o, err
	}
	defer proxy.close()
	cutLB := newBalancer([]string{"https://" + proxy.Addr()}, ctc)
	tokens, err := auth.NewTokens([]byte(farmTokenKey), nil)
	if err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	join, err := tokens.MintJoin(farmGroup, "", time.Hour, 0)
	if err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	hctx, stopHosts := context.WithCancel(context.Background())
	defer stopHosts() // before f.close, which waits for the hosts
	const cutHost = "cut01"
	for _, h := range []struct {
		name string
		lb   *balancer
	}{{cutHost, cutLB}, {"direct01", f.lb}, {"direct02", f.lb}} {
		var reg *brokerapi.RegisterResponse
		err := h.lb.do(ctx, func(c *brokerclient.Client) error {
			var err error
			reg, err = c.Register(ctx, join, brokerapi.RegisterRequest{Name: h.name, Address: h.name + ".faults.test", Port: 3389})
			return err
		})
		if err != nil {
			return o, fmt.Errorf("faults: register %s: %w", h.name, err)
		}
		sh := &simHost{name: h.name, cred: reg.Credential, sessions: map[string]*hostSession{}, posts: map[string][]hostPost{}}
		f.hosts[h.name] = sh
		f.wg.Add(1)
		go func() { defer f.wg.Done(); sh.run(hctx, h.lb, 500*time.Millisecond, time.Second) }()
	}
	// Every host heartbeats before the first launch.
	if err := waitHostStatus(ctx, hc, admin, cutHost, "ok", 20*time.Second); err != nil {
		return o, err
	}
	// One user every 500 ms, from before the cut to well after it.
	n := 0
	launch := func(l *agentLaunches) {
		n++
		user := fmt.Sprintf("user%03d", n)
		var res *brokerapi.LaunchResponse
		err := f.lb.do(ctx, func(c *brokerclient.Client) error {
			var err error
			res, _, err = c.Launch(ctx, brokerclient.Bearer(farmFrontend), brokerapi.LaunchRequest{DeliveryGroup: farmGroup, User: user, Groups: []string{farmGroup}})
			return err
		})
		h := (*simHost)(nil)
		if err == nil {
			h = f.hosts[res.Host]
		}
		if h == nil {
			l.failed++
			return
		}
		// The user's client reaches the host directly: the cut is only
		// between its agent and the broker.
		h.connect(user, 500*time.Millisecond)
		if res.Host == cutHost {
			l.onCut++
			l.lastOnCut = time.Now()
			if !l.staleFrom.IsZero() && l.lastOnCut.After(l.staleFrom) {
				l.onCutStale++
			}
		} else {
			l.elsewhere++
		}
	}
	var before, during, after agentLaunches
	for range 10 {
		launch(&before)
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return o, err
		}
	}
	cutAt := time.Now()
	proxy.cut()
	during.staleFrom = cutAt.Add(agentHeartbeatTimeout + time.Second)
	staleS := -1.0
	onlyCut := -1
	var onlyCutPlaced int
	for time.Since(cutAt) < agentCut {
		launch(&during)
		if staleS < 0 {
			if hs, err := adminHosts(ctx, hc, admin); err == nil && hs[cutHost] == "unreachable" {
				staleS = seconds(time.Since(cutAt))
			}
		} else if onlyCut < 0 {
			// With the other hosts drained, the unreachable host is the
			// only one left: a launch must be refused in words, not
			// placed on it.
			var err error
			if onlyCut, onlyCutPlaced, err = launchesWithOnlyCutHost(ctx, hc, admin, f.lb, cutHost, []string{"direct01", "direct02"}); err != nil {
				return o, err
			}
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return o, err
		}
	}
	proxy.restore()
	back := time.Now()
	backS := -1.0
	if err := waitHostStatus(ctx, hc, admin, cutHost, "ok", 30*time.Second); err == nil {
		backS = seconds(time.Since(back))
	}
	for range 10 {
		launch(&after)
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return o, err
		}
	}
	// Records settle within two heartbeats of the last logon.
	if err := sleepCtx(ctx, 3*time.Second); err != nil {
		return o, err
	}
	records, err := adminSessions(ctx, hc, admin)
	if err != nil {
		return o, err
	}
	lost, wrongHost, held := 0, 0, 0
	for name, h := range f.hosts {
		h.mu.Lock()
		for user := range h.sessions {
			held++
			switch at, ok := records[user]; {
			case !ok:
				lost++
			case at != name:
				wrongHost++
			}
		}
		h.mu.Unlock()
	}
	o.Load = "one user launching every 500 ms through one broker onto 3 session hosts, from 5 s before the cut to 5 s after the host is back"
	o.Users = n
	o.Affected = 0
	o.RecoverS = backS
	o.Metrics = map[string]float64{"stale_after_s": staleS, "back_after_s": backS, "heartbeat_timeout_s": agentHeartbeatTimeout.Seconds(),
		"cut_s": agentCut.Seconds(), "launches_to_cut_host_during_cut": float64(during.onCut), "launches_to_cut_host_after_stale": float64(during.onCutStale),
		"launches_to_cut_host_after_return": float64(after.onCut), "launches_failed": float64(before.failed + during.failed + after.failed),
		"sessions_lost": float64(lost), "sessions_on_wrong_host": float64(wrongHost), "sessions_held": float64(held)}
	o.Metrics["launches_refused_with_only_cut_host"] = float64(onlyCut)
	o.Metrics["launches_to_cut_host_with_only_it"] = float64(onlyCutPlaced)
	o.Held = onlyCut == 4 && onlyCutPlaced == 0 && staleS > 0 && staleS <= (agentHeartbeatTimeout+3*time.Second).Seconds() && during.onCutStale == 0 && backS >= 0 && after.onCut > 0 &&
		lost == 0 && wrongHost == 0 && before.failed+during.failed+after.failed == 0
	lastOn := 0.0
	if !during.lastOnCut.IsZero() {
		lastOn = during.lastOnCut.Sub(cutAt).Seconds()
	}
	o.Notes = fmt.Sprintf("the broker marked the cut host unreachable %.1f s after the cut; %d launches went to it during the cut (their users reached it directly and logged on), the last %.1f s after the cut (%d of them once the heartbeat timeout and a second had passed); back %.1f s after the link returned, then took %d of %d launches; %d of %d sessions the hosts hold have no record, %d a record on another host; %d launches failed; with the other hosts drained while the cut host was unreachable, %d of 4 launches were refused and %d placed on it",
		staleS, during.onCut, lastOn, during.onCutStale, backS, after.onCut, after.onCut+after.elsewhere, lost, held, wrongHost, before.failed+during.failed+after.failed, onlyCut, onlyCutPlaced)
	return o, nil
}

// waitHostStatus waits until the broker gives host the status want.
func waitHostStatus(ctx context.Context, hc *http.Client, admin, host, want string, within time.Duration) error {
	var got string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		if hs, err := adminHosts(ctx, hc, admin); err == nil {
			if got = hs[host]; got == want {
				return nil
			}
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("faults: host %s is %q, not %q, after %s", host, got, want, within)
}

// launchesWithOnlyCutHost drains the other hosts, makes 4 launches, and
// undrains them: it returns how many were refused and how many were
// placed on the cut host.
func launchesWithOnlyCutHost(ctx context.Context, hc *http.Client, admin string, lb *balancer, cutHost string, others []string) (refusedN, placed int, err error) {
	for _, h := range others {
		if err := adminPost(ctx, hc, admin+"/api/v1/broker/hosts/"+h+"/drain", `{"drain": true}`); err != nil {
			return 0, 0, err
		}
	}
	for i := range 4 {
		res, _, err := lb.clients[0].Launch(ctx, brokerclient.Bearer(farmFrontend), brokerapi.LaunchRequest{DeliveryGroup: farmGroup, User: fmt.Sprintf("only%02d", i), Groups: []string{farmGroup}})
		var se *brokerclient.StatusError
		switch {
		case errors.As(err, &se):
			refusedN++
		case err == nil && res.Host == cutHost:
			placed++
		}
	}
	for _, h := range others {
		if err := adminPost(ctx, hc, admin+"/api/v1/broker/hosts/"+h+"/undrain", ""); err != nil {
			return refusedN, placed, err
		}
	}
	return refusedN, placed, nil
}
