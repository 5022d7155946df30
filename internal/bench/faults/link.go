package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/pgcluster"
)

// Link is the link-cut scenario: the link between two parts of a
// deployment stops carrying packets (no reset, no FIN: a cable pulled or
// a firewall dropping) while users work, and comes back.
func Link() Scenario { return Scenario{Name: "link", Run: runLink} }

// linkScale is how many tunnels and how long the cuts are.
type linkScale struct {
	tunnels      int
	cut          time.Duration // the short cut, under the gateway's write timeout
	writeTimeout time.Duration
}

func linkScaleFor(small bool) linkScale {
	if small {
		return linkScale{tunnels: 4, cut: 7 * time.Second, writeTimeout: 5 * time.Second}
	}
	return linkScale{tunnels: 20, cut: 10 * time.Second, writeTimeout: 5 * time.Second}
}

func runLink(ctx context.Context, env Env, run int) ([]Outcome, error) {
	sc := linkScaleFor(env.Small)
	var outs []Outcome
	for _, c := range []func(context.Context, Env, linkScale, int) (Outcome, error){linkHostInteractive, linkHostBulk, linkDatabase} {
		o, err := c(ctx, env, sc, run)
		if err != nil {
			return nil, err
		}
		outs = append(outs, o)
	}
	return outs, nil
}

// openStreams opens n tunnels through the rig, each with an echo stream.
func openStreams(ctx context.Context, r *echoRig, n int) ([]*echoStream, error) {
	var ss []*echoStream
	for i := range n {
		c, err := r.dial(ctx, fmt.Sprintf("user%02d", i), 5*time.Minute)
		if err != nil {
			closeStreams(ss)
			return nil, fmt.Errorf("faults: open tunnel %d: %w: %s", i, err, r.gw.Tail(3))
		}
		ss = append(ss, newEchoStream(c))
	}
	return ss, nil
}

func closeStreams(ss []*echoStream) {
	for _, s := range ss {
		s.c.Close()
	}
}

// startEchoing opens n tunnels through the rig, each writing size bytes
// every interval (0: as fast as the tunnel takes them) until stop, and
// lets them run a second, so that the fault strikes a steady load. The
// caller closes the streams after stop.
func startEchoing(ctx context.Context, r *echoRig, n, size int, every time.Duration) ([]*echoStream, context.CancelFunc, error) {
	ss, err := openStreams(ctx, r, n)
	if err != nil {
		return nil, nil, err
	}
	wctx, stop := context.WithCancel(ctx)
	for _, s := range ss {
		go s.write(wctx, size, every)
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		stop()
		closeStreams(ss)
		return nil, nil, err
	}
	return ss, stop, nil
}

// linkHostInteractive cuts the link between the gateway and the session
// host for longer than the gateway's write timeout while every user
// types and draws a little (512 bytes each 20 ms each way): bytes wait in
// the kernels' buffers, no write blocks that long, and when the link
// returns every byte arrives, in order.
func linkHostInteractive(ctx context.Context, env Env, sc linkScale, _ int) (Outcome, error) {
	o := Outcome{Case: fmt.Sprintf("gateway ↔ session host link cut for %s (write timeout %s)", sc.cut, sc.writeTimeout),
		Load: fmt.Sprintf("%d tunnels through one gateway, each echoing 512 B every 20 ms", sc.tunnels), Users: sc.tunnels}
	r, err := startEchoRig(env, 0, sc.writeTimeout, true)
	if err != nil {
		return o, err
	}
	defer r.close()
	ss, stop, err := startEchoing(ctx, r, sc.tunnels, 512, 20*time.Millisecond)
	if err != nil {
		return o, err
	}
	defer closeStreams(ss)
	defer stop()
	cutAt := time.Now()
	r.proxy.cut()
	if err := sleepCtx(ctx, sc.cut); err != nil {
		return o, err
	}
	r.proxy.restore()
	back := time.Now()
	// Every stream is back once it has an echo from after the link's return.
	recover := 0.0
	for _, s := range ss {
		for time.Since(back) < 30*time.Second && s.lastRecv.Load() < back.UnixNano() {
			if _, err := s.end(); err != nil {
				break
			}
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return o, err
			}
		}
		if t := s.lastRecv.Load(); t >= back.UnixNano() {
			recover = max(recover, time.Unix(0, t).Sub(cutAt).Seconds())
		}
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return o, err
	}
	stop()
	ended, lost, wrong, why := tallyStreams(ctx, ss)
	o.Affected, o.RecoverS = sc.tunnels, recover
	o.Metrics = map[string]float64{"sessions_lost": float64(ended), "bytes_lost": float64(lost), "bytes_wrong": float64(wrong),
		"cut_s": seconds(back.Sub(cutAt)), "write_timeout_s": sc.writeTimeout.Seconds()}
	o.Held = ended == 0 && lost == 0 && wrong == 0 && recover > 0
	o.Notes = fmt.Sprintf("every tunnel stalled for the cut and went on when the link returned; %d of %d ended, %d bytes lost, %d wrong", ended, sc.tunnels, lost, wrong)
	if len(why) > 0 {
		o.Notes += "; ended with: " + strings.Join(uniq(why), "; ")
	}
	return o, nil
}

// linkHostBulk cuts the link while every user sends as fast as the
// tunnel takes (a file copy, a video): the gateway's writes to the host
// stop, and the documented write timeout must end each tunnel, logged
// with its reason, within that timeout and the 5 s between the gateway's
// checks of its tunnels of the buffers filling; a new tunnel works once
// the link is back.
func linkHostBulk(ctx context.Context, env Env, sc linkScale, _ int) (Outcome, error) {
	o := Outcome{Case: fmt.Sprintf("gateway ↔ session host link cut under bulk load (write timeout %s)", sc.writeTimeout),
		Load: fmt.Sprintf("%d tunnels through one gateway, each echoing as fast as it can", sc.tunnels), Users: sc.tunnels}
	r, err := startEchoRig(env, 0, sc.writeTimeout, true)
	if err != nil {
		return o, err
	}
	defer r.close()
	ss, stop, err := startEchoing(ctx, r, sc.tunnels, 32<<10, 0)
	if err != nil {
		return o, err
	}
	defer closeStreams(ss)
	defer stop()
	cutAt := time.Now()
	r.proxy.cut()
	limit := sc.writeTimeout + 20*time.Second
	var detect []float64
	var why []string
	for _, s := range ss {
		select {
		case <-s.ended:
		case <-time.After(time.Until(cutAt.Add(limit))):
		case <-ctx.Done():
			return o, ctx.Err()
		}
		if at, err := s.end(); !at.IsZero() {
			detect = append(detect, at.Sub(cutAt).Seconds())
			why = append(why, err.Error())
		}
	}
	stop()
	r.proxy.restore()
	back := time.Now()
	// A user starting again once the link is back gets through.
	newOK := 0.0
	var newErr string
	if c, err := r.dial(ctx, "user-again", 5*time.Minute); err != nil {
		newErr = err.Error()
	} else {
		s := newEchoStream(c)
		go s.write(ctx, 512, 0)
		for time.Since(back) < 10*time.Second && s.got.Load() < 512 {
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return o, err
			}
		}
		if s.got.Load() >= 512 && s.wrong.Load() == 0 {
			newOK = 1
		}
		c.Close()
	}
	wrong := int64(0)
	for _, s := range ss {
		wrong += s.wrong.Load()
	}
	slices.Sort(detect)
	o.Affected = sc.tunnels
	o.RecoverS = time.Since(cutAt).Seconds()
	o.Metrics = map[string]float64{"tunnels_ended": float64(len(detect)), "bytes_wrong": float64(wrong),
		"write_timeout_s": sc.writeTimeout.Seconds(), "new_tunnel_ok": newOK, "sessions_lost": 0}
	if len(detect) > 0 {
		o.Metrics["detect_s_median"] = round2(detect[len(detect)/2])
		o.Metrics["detect_s_worst"] = round2(detect[len(detect)-1])
	}
	hostReason := strings.Contains(r.gw.Output(), "host took no data")
	// The tunnel ends once the write timeout has passed since the host's
	// buffers filled, at the gateway's next check of its tunnels (every
	// 5 s, as docs/configuration.md says); filling them takes well under
	// two seconds at this rate.
	within := len(detect) == sc.tunnels && detect[len(detect)-1] <= (sc.writeTimeout+7*time.Second).Seconds()
	o.Held = within && wrong == 0 && newOK == 1 && hostReason
	o.Notes = fmt.Sprintf("%d of %d tunnels ended by the gateway, %.1f s to %.1f s after the cut; gateway log names the host's write timeout: %v; the client was told: %s; a new tunnel after the link returned: %v %s",
		len(detect), sc.tunnels, first(detect), last(detect), hostReason, strings.Join(uniq(why), "; "), newOK == 1, newErr)
	return o, nil
}

// linkDatabase cuts the link between both brokers of a farm and their
// PostgreSQL mid-storm for as long as the broker scenario stops the
// database: unlike a stopped database, a cut link refuses nothing, so
// each query waits. The brokers must answer from their cache and
// journal as in the outage, before the storm's client gives up (10 s),
// and lose or double nothing but what architecture.md documents. Even at
// the test's scale the cut outlasts those 10 s.
func linkDatabase(ctx context.Context, env Env, _ linkScale, run int) (Outcome, error) {
	sc := brokerScaleFor(env.Small)
	sc.outage = max(sc.outage, 15*time.Second)
	pg, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		return Outcome{}, fmt.Errorf("faults: link: %w", err)
	}
	defer pg.Stop()
	var proxy *faultProxy
	c := brokerCase{name: "cut-database", outage: true,
		fault: fmt.Sprintf("broker ↔ PostgreSQL link cut for %v mid-storm (both brokers), then back", sc.outage),
		via: func(dsn string) (string, func(), error) {
			p, err := newFaultProxy(pg.Addr())
			if err != nil {
				return "", nil, err
			}
			proxy = p
			return strings.Replace(dsn, pg.Addr(), p.Addr(), 1), p.close, nil
		},
		inject: func(ctx context.Context, f *brokerFarm) (time.Time, time.Time, error) {
			start := time.Now()
			proxy.cut()
			err := sleepCtx(ctx, sc.outage)
			proxy.restore()
			return start, time.Now(), err
		}}
	o, err := c.run(ctx, env, pg, sc, run)
	if err != nil {
		return o, fmt.Errorf("faults: link, %s, run %d: %w", c.name, run, err)
	}
	return o, nil
}

func first(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[0]
}

func last(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return v[len(v)-1]
}

// uniq is ss without repeats, in first-seen order.
func uniq(ss []string) []string {
	var out []string
	for _, s := range ss {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
