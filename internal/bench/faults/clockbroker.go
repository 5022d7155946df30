package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
)

// clockStepBroker runs a real broker whose clock steps 10 minutes back
// mid-run (its --clock-offset-file rewritten) in front of a real gateway
// keeping time: users launch through the broker and open a tunnel with
// the token its answer carries. Tunnels opened before the step stay
// open; every token signed after it is refused by the gateway, naming
// the clocks and NTP; the broker goes on hearing its host; set right,
// its next token opens a tunnel.
func clockStepBroker(ctx context.Context, env Env, users int) (Outcome, error) {
	o := Outcome{Case: fmt.Sprintf("broker clock steps %d min back mid-run, then is set right", int(clockJump.Minutes())), Users: 2 * users,
		Load: fmt.Sprintf("%d users launched through the broker before the step, their tunnels echoing 512 B every 20 ms, then %d launching after it", users, users)}
	gdir, bdir := filepath.Join(env.Work, "gateway"), filepath.Join(env.Work, "broker")
	for _, d := range []string{gdir, bdir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return o, fmt.Errorf("faults: %w", err)
		}
	}
	genv := env
	genv.Work = gdir
	r, err := startEchoRigKey(genv, farmTokenKey, 0, 30*time.Second, false)
	if err != nil {
		return o, err
	}
	defer r.close()
	cert, key := filepath.Join(bdir, "tls.crt"), filepath.Join(bdir, "tls.key")
	if err := tlsconf.SelfSigned(cert, key, []string{"127.0.0.1"}); err != nil {
		return o, err
	}
	ctc, err := tlsconf.Trusting(cert)
	if err != nil {
		return o, err
	}
	ports, err := loopback.FreePorts(2)
	if err != nil {
		return o, err
	}
	cfg := filepath.Join(bdir, "deskway.yaml")
	text := fmt.Sprintf(brokerNode, bdir, cert, key, farmTokenKey, ports[0], filepath.Join(bdir, "broker.db"), farmFrontend, farmGroup, 100, 50, ports[1], "", farmHeartbeatTimeout)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	clock := filepath.Join(bdir, "clock-offset")
	if err := setClockFile(clock, 0); err != nil {
		return o, err
	}
	b, err := startBrokerProc(env.Bin, fmt.Sprintf("127.0.0.1:%d", ports[0]), bdir, "-c", cfg, "--clock-offset-file", clock)
	if err != nil {
		return o, fmt.Errorf("faults: start the broker: %w", err)
	}
	defer b.log.Close()
	defer b.kill9()
	if err := waitListening(ctx, b, 30*time.Second); err != nil {
		return o, err
	}
	lb := newBalancer([]string{"https://" + b.addr}, ctc)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: ctc}}
	admin := fmt.Sprintf("https://127.0.0.1:%d", ports[1])
	tokens, err := auth.NewTokens([]byte(farmTokenKey), nil)
	if err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	join, err := tokens.MintJoin(farmGroup, "", time.Hour, 0)
	if err != nil {
		return o, fmt.Errorf("faults: %w", err)
	}
	const hostName = "echo01"
	reg, err := lb.clients[0].Register(ctx, join, brokerapi.RegisterRequest{Name: hostName, Address: "127.0.0.1", Port: int(r.hostPort)})
	if err != nil {
		return o, fmt.Errorf("faults: register the host: %w", err)
	}
	h := &simHost{name: hostName, cred: reg.Credential, sessions: map[string]*hostSession{}, posts: map[string][]hostPost{}}
	hctx, stopHost := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.run(hctx, lb, 500*time.Millisecond, time.Second) }()
	defer func() { stopHost(); <-done }()
	if err := waitHostStatus(ctx, hc, admin, hostName, "ok", 20*time.Second); err != nil {
		return o, err
	}
	// open launches user through the broker and opens a tunnel with the
	// answer's token.
	open := func(user string) (*echoStream, error) {
		res, _, err := lb.clients[0].Launch(ctx, brokerclient.Bearer(farmFrontend), brokerapi.LaunchRequest{DeliveryGroup: farmGroup, User: user, Groups: []string{farmGroup}})
		if err != nil {
			return nil, fmt.Errorf("faults: launch %s: %w", user, err)
		}
		h.connect(user, 200*time.Millisecond)
		c, err := r.dialToken(ctx, res.Token)
		if err != nil {
			return nil, err
		}
		return newEchoStream(c), nil
	}
	var ss []*echoStream
	defer func() { closeStreams(ss) }()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for i := range users {
		s, err := open(fmt.Sprintf("before%02d", i))
		if err != nil {
			return o, fmt.Errorf("before the step: %w", err)
		}
		ss = append(ss, s)
		go s.write(wctx, 512, 20*time.Millisecond)
	}
	stepAt := time.Now()
	if err := setClockFile(clock, -clockJump); err != nil {
		return o, err
	}
	opened, refused := 0, 0
	var told []string
	for i := range users {
		s, err := open(fmt.Sprintf("after%02d", i))
		if err != nil {
			if strings.Contains(err.Error(), "faults: launch") {
				return o, err
			}
			refused++
			told = append(told, err.Error())
			continue
		}
		opened++
		s.c.Close()
	}
	kept, err := stillEchoing(ctx, ss, 3*time.Second)
	if err != nil {
		return o, err
	}
	hostOK := 0.0
	if hs, err := adminHosts(ctx, hc, admin); err == nil && hs[hostName] == "ok" {
		hostOK = 1
	}
	backAt, recoverS, err := setClockRight(ctx, clock, func(try int) (io.Closer, error) {
		s, err := open(fmt.Sprintf("right%02d", try))
		if err != nil {
			return nil, err
		}
		return s.c, nil
	})
	if err != nil {
		return o, err
	}
	stop()
	ended, lost, wrong, _ := tallyStreams(ctx, ss)
	_, naming, err := clockRefusals(ctx, r.gw, refused)
	if err != nil {
		return o, err
	}
	o.Affected, o.RecoverS = refused, recoverS
	o.Metrics = map[string]float64{"tunnels_refused": float64(refused), "wrong_verdicts": float64(opened),
		"refusals_naming_clocks": float64(naming), "open_tunnels_kept": float64(kept), "sessions_lost": float64(ended),
		"bytes_lost": float64(lost), "bytes_wrong": float64(wrong), "clock_step_s": -clockJump.Seconds(),
		"host_ok_after_step": hostOK, "step_s": seconds(backAt.Sub(stepAt))}
	o.Held = refused == users && naming == users && kept == users && ended == 0 && lost == 0 && wrong == 0 && hostOK == 1 && recoverS >= 0
	o.Notes = fmt.Sprintf("after the step %d of %d tokens the broker signed were refused by the gateway, %d of those refusals in its log naming the clocks and NTP; %d of %d tunnels opened before the step kept echoing, %d ended, %d bytes lost, %d wrong; the broker still showed its host ok: %v; a token signed %.2f s after the clock was set right opened a tunnel; the client was told: %s",
		refused, users, naming, kept, users, ended, lost, wrong, hostOK == 1, recoverS, strings.Join(uniq(told), "; "))
	return o, nil
}
