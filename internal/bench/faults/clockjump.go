package faults

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ClockJump is the clock-jump scenario: a gateway's clock jumps mid-run,
// while users work through it, then is set right; and a broker's clock
// steps back while users launch through it. The gateway reads its
// token clock's offset from a file (the hidden --clock-offset-file flag)
// that the bench rewrites (the broker too), as an NTP step or an administrator's `date
// -s` would move the clock under a running process.
func ClockJump() Scenario { return Scenario{Name: "clock-jump", Run: runClockJump} }

// clockJump is how far the clock jumps.
const clockJump = 10 * time.Minute

func runClockJump(ctx context.Context, env Env, run int) ([]Outcome, error) {
	users := 10
	if env.Small {
		users = 3
	}
	o, err := clockJumpGateway(ctx, env, users)
	if err != nil {
		return nil, fmt.Errorf("faults: clock jump, run %d: %w", run, err)
	}
	dir := filepath.Join(env.Work, "broker-step")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("faults: %w", err)
	}
	benv := env
	benv.Work = dir
	b, err := clockStepBroker(ctx, benv, users)
	if err != nil {
		return nil, fmt.Errorf("faults: broker clock step, run %d: %w", run, err)
	}
	return []Outcome{o, b}, nil
}

// setClockFile replaces the offset file at once (a rename), so the
// gateway never reads half of it.
func setClockFile(path string, off time.Duration) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(off.String()+"\n"), 0o600); err != nil {
		return fmt.Errorf("faults: clock file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("faults: clock file: %w", err)
	}
	return nil
}

// stillEchoing waits settle, then counts the streams still open that
// had an echo in the second after: the tunnels a fault left working.
func stillEchoing(ctx context.Context, ss []*echoStream, settle time.Duration) (int, error) {
	if err := sleepCtx(ctx, settle); err != nil {
		return 0, err
	}
	checkAt := time.Now()
	if err := sleepCtx(ctx, time.Second); err != nil {
		return 0, err
	}
	kept := 0
	for _, s := range ss {
		if at, _ := s.end(); at.IsZero() && s.lastRecv.Load() > checkAt.UnixNano() {
			kept++
		}
	}
	return kept, nil
}

// setClockRight sets the clock in file right and tries open (try 0, 1,
// ...) every 100 ms for 10 s: recoverS is the seconds from backAt, when
// the clock was set, to the first tunnel that opened; -1 if none did.
func setClockRight(ctx context.Context, file string, open func(try int) (io.Closer, error)) (backAt time.Time, recoverS float64, err error) {
	backAt = time.Now()
	if err := setClockFile(file, 0); err != nil {
		return backAt, -1, err
	}
	for i := 0; time.Since(backAt) < 10*time.Second; i++ {
		if c, err := open(i); err == nil {
			recoverS = seconds(time.Since(backAt))
			c.Close()
			return backAt, recoverS, nil
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return backAt, -1, err
		}
	}
	return backAt, -1, nil
}

// clockJumpGateway opens users tunnels that echo a checked pattern,
// jumps the gateway's clock 10 minutes ahead, has as many users open a
// tunnel with a fresh token (each must be refused, its log line naming
// the clocks), checks that the open tunnels go on carrying every byte,
// then sets the clock right and times the first fresh tunnel that opens.
func clockJumpGateway(ctx context.Context, env Env, users int) (Outcome, error) {
	o := Outcome{Case: fmt.Sprintf("gateway clock jumps %d min ahead mid-run, then is set right", int(clockJump.Minutes())), Users: users,
		Load: fmt.Sprintf("%d open tunnels each echoing 512 B every 20 ms, and %d users opening one with a fresh %d-min token", users, users, int(tokenTTL.Minutes()))}
	file := filepath.Join(env.Work, "clock-offset")
	if err := setClockFile(file, 0); err != nil {
		return o, err
	}
	r, err := startEchoRig(env, 0, 30*time.Second, false, "--clock-offset-file", file)
	if err != nil {
		return o, err
	}
	defer r.close()
	ss, stop, err := startEchoing(ctx, r, users, 512, 20*time.Millisecond)
	if err != nil {
		return o, err
	}
	defer closeStreams(ss)
	defer stop()
	jumpAt := time.Now()
	if err := setClockFile(file, clockJump); err != nil {
		return o, err
	}
	opened, refused := 0, 0
	var told []string
	for i := range users {
		c, err := r.dial(ctx, fmt.Sprintf("fresh%02d", i), tokenTTL)
		if err != nil {
			refused++
			told = append(told, err.Error())
			continue
		}
		opened++
		c.Close()
	}
	// The open tunnels must still echo well after the jump.
	kept, err := stillEchoing(ctx, ss, 3*time.Second)
	if err != nil {
		return o, err
	}
	backAt, recoverS, err := setClockRight(ctx, file, func(int) (io.Closer, error) { return r.dial(ctx, "after", tokenTTL) })
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
		"bytes_lost": float64(lost), "bytes_wrong": float64(wrong), "clock_jump_s": clockJump.Seconds(),
		"jump_s": seconds(backAt.Sub(jumpAt))}
	o.Held = refused == users && naming == users && kept == users && ended == 0 && lost == 0 && wrong == 0 && recoverS >= 0
	o.Notes = fmt.Sprintf("after the jump %d of %d fresh tokens refused, %d of those refusals in the gateway's log naming the clocks and NTP; %d of %d open tunnels kept echoing, %d ended, %d bytes lost, %d wrong; a fresh tunnel opened %.2f s after the clock was set right; the client was told: %s",
		refused, users, naming, kept, users, ended, lost, wrong, recoverS, strings.Join(uniq(told), "; "))
	return o, nil
}
