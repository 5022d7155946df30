package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/childproc"
)

// Clock is the clock-step scenario: a gateway whose clock is off from
// the broker's that issues its tokens. Each case runs a real gateway
// with its token clock moved (the hidden --clock-offset flag: a Go
// binary reads the time through the vDSO, so nothing outside the process
// can move it) and users opening tunnels with fresh tokens minted by a
// correct clock, as the broker's launch answer carries them.
func Clock() Scenario { return Scenario{Name: "clock", Run: runClock} }

// clockCase is one offset and what docs/operations.md says it does.
type clockCase struct {
	offset time.Duration
	accept bool // whether a fresh token must open a tunnel
}

// tokenTTL is broker.token_ttl's default, the life of the tokens the
// users present.
const tokenTTL = 5 * time.Minute

func runClock(ctx context.Context, env Env, run int) ([]Outcome, error) {
	users := 10
	if env.Small {
		users = 3
	}
	var outs []Outcome
	for _, c := range []clockCase{
		{offset: 10 * time.Minute}, {offset: -10 * time.Minute},
		{offset: 20 * time.Second, accept: true}, {offset: -20 * time.Second, accept: true},
	} {
		o, err := clockRun(ctx, env, c, users)
		if err != nil {
			return nil, fmt.Errorf("faults: clock %s, run %d: %w", c.offset, run, err)
		}
		outs = append(outs, o)
	}
	return outs, nil
}

func clockRun(ctx context.Context, env Env, c clockCase, users int) (Outcome, error) {
	dir, err := os.MkdirTemp(env.Work, "clock-")
	if err != nil {
		return Outcome{}, fmt.Errorf("faults: %w", err)
	}
	cenv := env
	cenv.Work = dir
	way := "ahead of"
	if c.offset < 0 {
		way = "behind"
	}
	off := fmt.Sprintf("%d s", int(c.offset.Abs().Seconds()))
	if c.offset%time.Minute == 0 {
		off = fmt.Sprintf("%d min", int(c.offset.Abs().Minutes()))
	}
	o := Outcome{Case: fmt.Sprintf("gateway clock %s %s the broker's", off, way), Users: users, RecoverS: -1,
		Load: fmt.Sprintf("%d users opening a tunnel each with a fresh %d-min token", users, int(tokenTTL.Minutes()))}
	r, err := startEchoRig(cenv, c.offset, 30*time.Second, false)
	if err != nil {
		return o, err
	}
	defer r.close()
	opened, refused, wrong, lost := 0, 0, 0, int64(0)
	var told []string
	for i := range users {
		conn, err := r.dial(ctx, fmt.Sprintf("user%02d", i), tokenTTL)
		if err != nil {
			refused++
			told = append(told, err.Error())
			continue
		}
		opened++
		s := newEchoStream(conn)
		go s.write(ctx, 4096, 0)
		for deadline := time.Now().Add(10 * time.Second); s.got.Load() < 64<<10 && time.Now().Before(deadline); {
			if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
				return o, err
			}
		}
		if s.got.Load() < 64<<10 {
			lost++
		}
		wrong += int(s.wrong.Load())
		conn.Close()
	}
	reasons, naming, err := clockRefusals(ctx, r.gw, refused)
	if err != nil {
		return o, err
	}
	o.Affected = refused
	o.Metrics = map[string]float64{"tunnels_opened": float64(opened), "tunnels_refused": float64(refused),
		"refusals_naming_clocks": float64(naming), "sessions_lost": float64(lost), "bytes_wrong": float64(wrong),
		"clock_offset_s": c.offset.Seconds()}
	// A verdict is wrong when it is not the documented one: an
	// accepted token beyond the allowance, a refused one within it.
	if c.accept {
		o.Metrics["wrong_verdicts"] = float64(refused)
	} else {
		o.Metrics["wrong_verdicts"] = float64(opened)
	}
	if c.accept {
		o.Held = opened == users && lost == 0 && wrong == 0
		o.Notes = fmt.Sprintf("%d of %d tunnels opened and echoed, as a gateway within the allowance must", opened, users)
	} else {
		o.Held = refused == users && naming == users
		o.Notes = fmt.Sprintf("%d of %d refused, until the clock is set right; the client was told: %s; the gateway logged: %s", refused, users,
			strings.Join(uniq(told), "; "), strings.Join(uniq(reasons), "; "))
	}
	return o, nil
}

// clockRefusals waits up to 5 s for the gateway's log to hold refused
// "tunnel refused" lines (the log reaches us through a pipe, after the
// refusal) and counts the reasons that name the clocks and NTP.
func clockRefusals(ctx context.Context, gw *childproc.Proc, refused int) (reasons []string, naming int, err error) {
	reasons = refusalReasons(gw.Output())
	for deadline := time.Now().Add(5 * time.Second); len(reasons) < refused && time.Now().Before(deadline); reasons = refusalReasons(gw.Output()) {
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return nil, 0, err
		}
	}
	for _, why := range reasons {
		if strings.Contains(why, "clocks") && strings.Contains(why, "NTP") {
			naming++
		}
	}
	return reasons, naming, nil
}

// refusalReasons are the reasons of the gateway's "tunnel refused" log
// lines.
func refusalReasons(log string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		var rec struct {
			Msg    string `json:"msg"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "tunnel refused" {
			out = append(out, rec.Reason)
		}
	}
	return out
}
