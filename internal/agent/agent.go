// Package agent runs on each session host: it registers the host with the
// broker using a join token, reports load and disk health from /proc every
// heartbeat, reports logons, disconnects and logoffs as they happen, and
// asks for drain mode while a drain file exists.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
)

// Deps are what the agent needs from outside.
type Deps struct {
	Logger *slog.Logger
	Client *brokerclient.Client
	// Sessions lists the host's sessions now; nil means the host reports none.
	Sessions func() ([]brokerapi.Session, error)
	// Usage reads what the host's sessions use, to report with them
	// (ReadSessionUsage); nil reports none.
	Usage func() ([]SessionUsage, error)
	// Proc is the /proc to read counters from.
	Proc string
	// Control carries out session commands; nil answers each that this
	// host's sessions are not controlled.
	Control Controller
	// CredentialFile keeps the credential the broker gave this host, so
	// a restarted agent re-registers with it: a join token only ever
	// registers new hosts. Empty keeps it in memory only.
	CredentialFile string
	// CheckRDP checks the host's RDP service each heartbeat (CheckRDP at
	// agent.address and agent.port); nil checks nothing.
	CheckRDP func(ctx context.Context) error
}

// Agent is one host's agent.
type Agent struct {
	cfg  *config.Agent
	d    Deps
	cred string
	beat time.Duration
	// cpu and usageFailing belong to Run's heartbeats.
	cpu          cpuMeter
	usageFailing bool
	rdpFailing   bool
}

// New builds an agent; Run registers and reports.
func New(cfg *config.Agent, d Deps) (*Agent, error) {
	if d.Client == nil || d.Logger == nil {
		return nil, errors.New("agent: client and logger are required")
	}
	if d.Proc == "" {
		d.Proc = "/proc"
	}
	if d.Sessions == nil {
		d.Sessions = func() ([]brokerapi.Session, error) { return nil, nil }
	}
	return &Agent{cfg: cfg, d: d}, nil
}

// permanent reports a refusal that retrying cannot fix: the config is wrong.
func permanent(err error) bool {
	var se *brokerclient.StatusError
	return errors.As(err, &se) && (se.Status == http.StatusBadRequest || se.Status == http.StatusUnauthorized || se.Status == http.StatusForbidden)
}

// register joins the broker, retrying while it is unreachable: with the
// host's own credential when it has one, else with the join token.
func (a *Agent) register(ctx context.Context) error {
	if a.cred == "" && a.d.CredentialFile != "" {
		if b, err := os.ReadFile(a.d.CredentialFile); err == nil {
			a.cred = strings.TrimSpace(string(b))
		}
	}
	wait := time.Second
	for {
		req := brokerapi.RegisterRequest{Name: a.cfg.Name, Address: a.cfg.Address, Port: a.cfg.Port, Zone: a.cfg.Zone,
			Weight: a.cfg.Weight, SessionLimit: a.cfg.SessionLimit}
		var res *brokerapi.RegisterResponse
		var err error
		if a.cred != "" {
			res, err = a.d.Client.Register(ctx, a.cred, req)
			var se *brokerclient.StatusError
			if permanent(err) || errors.As(err, &se) && se.Status == http.StatusNotFound {
				// Expired, or the host was removed: only a join token helps.
				a.d.Logger.Warn("the broker refused this host's credential; registering with the join token", "error", err)
				a.cred = ""
				res, err = a.d.Client.Register(ctx, a.cfg.JoinToken.Value(), req)
			}
		} else {
			res, err = a.d.Client.Register(ctx, a.cfg.JoinToken.Value(), req)
		}
		if err == nil {
			a.cred = res.Credential
			a.keep()
			a.beat = time.Duration(res.HeartbeatInterval * float64(time.Second))
			if a.beat <= 0 {
				a.beat = 5 * time.Second
			}
			a.d.Logger.Info("registered", "host", res.Host, "delivery_group", res.DeliveryGroup, "heartbeat", a.beat)
			return nil
		}
		if permanent(err) {
			return fmt.Errorf("agent: the broker refused registration: %w", err)
		}
		a.d.Logger.Warn("register failed; retrying", "error", err, "in", wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// keep writes the credential to CredentialFile (mode 0600).
func (a *Agent) keep() {
	if a.d.CredentialFile == "" {
		return
	}
	tmp := a.d.CredentialFile + ".new"
	err := os.WriteFile(tmp, []byte(a.cred+"\n"), 0o600)
	if err == nil {
		err = os.Rename(tmp, a.d.CredentialFile)
	}
	if err != nil {
		a.d.Logger.Warn("could not keep the host's credential; a restart will need a new join token", "file", a.d.CredentialFile, "error", err)
	}
}

// renewEvery is how often a running agent re-registers with its
// credential, which returns a fresh one long before the old expires.
const renewEvery = 24 * time.Hour

// Run reports until ctx ends. Reading the host's sessions never waits on
// the broker: the readings' changes queue for the reporter (report),
// which sends them, the heartbeats and the renewals in turn. An agent
// that read no sessions while a report to a stalled broker waited (3 s
// and more) could miss a session that came and went meanwhile, and the
// broker kept its launch as logging on until broker.logon_grace.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.register(ctx); err != nil {
		return err
	}
	first, err := ReadCounters(a.d.Proc)
	if err != nil {
		return err
	}
	prev := newLoadWindow(first)
	known, _ := a.d.Sessions()
	if err := a.heartbeat(ctx, prev, known); err != nil {
		return err
	}
	out := NewOutbox(known)
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	reported := make(chan error, 1)
	go func() { reported <- a.report(rctx, out, prev) }()
	poll := time.NewTicker(a.cfg.SessionPoll.D())
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			stop()
			<-reported
			return nil
		case err := <-reported:
			return err
		case <-poll.C:
			cur, err := a.d.Sessions()
			if err != nil {
				a.d.Logger.Warn("reading sessions", "error", err)
				continue
			}
			ev := Diff(known, cur)
			for _, e := range ev {
				a.d.Logger.Info("session event", "user", e.User, "state", e.State)
			}
			out.Read(cur, ev)
			known = cur
		}
	}
}

// heartbeat reports the load over w's window and the sessions; it
// registers again when the broker no longer knows the host or its
// credential.
func (a *Agent) heartbeat(ctx context.Context, w *loadWindow, sessions []brokerapi.Session) error {
	cur, err := ReadCounters(a.d.Proc)
	if err != nil {
		return err
	}
	l := w.add(cur)
	_, drainErr := os.Stat(a.cfg.DrainFile)
	hb := brokerapi.Heartbeat{Host: a.cfg.Name, CPU: l.CPU, Memory: l.Memory, DiskIdle: l.DiskIdle,
		DiskLatencyMS: l.DiskLatencyMS, MemoryPressure: l.MemoryPressure, CPUPressure: l.CPUPressure, MajorFaultsPerSec: l.MajorFaultsPerSec,
		SwapInPerSec: l.SwapInPerSec, SwapOutPerSec: l.SwapOutPerSec, Drain: drainErr == nil, Sessions: a.withUsage(sessions)}
	if !a.rdpAnswers(ctx) {
		hb.RDPDown = a.cfg.Port
	}
	cmds, err := a.d.Client.Heartbeat(ctx, a.cred, hb)
	var se *brokerclient.StatusError
	if errors.As(err, &se) && (se.Status == http.StatusNotFound || se.Status == http.StatusUnauthorized) {
		a.d.Logger.Info("broker asks to register again", "reason", se.Message)
		if err := a.register(ctx); err != nil {
			return err
		}
		cmds, err = a.d.Client.Heartbeat(ctx, a.cred, hb)
	}
	for _, c := range cmds {
		go a.carryOut(ctx, a.cred, c)
	}
	if err != nil && !permanent(err) {
		a.d.Logger.Warn("heartbeat failed", "error", err)
		return nil
	}
	return err
}

// rdpAnswers checks the host's RDP service, logging when it stops or
// starts answering; without Deps.CheckRDP it says yes.
func (a *Agent) rdpAnswers(ctx context.Context) bool {
	if a.d.CheckRDP == nil {
		return true
	}
	err := a.d.CheckRDP(ctx)
	switch {
	case err != nil && !a.rdpFailing:
		a.d.Logger.Warn("the host's RDP service does not answer: the broker places no new sessions here until it does", "port", a.cfg.Port, "error", err)
	case err == nil && a.rdpFailing:
		a.d.Logger.Info("the host's RDP service answers again", "port", a.cfg.Port)
	}
	a.rdpFailing = err != nil
	return err == nil
}

// withUsage returns the sessions with what each uses now; without
// Deps.Usage, or when it fails, they go with none (zero) and the
// heartbeat goes anyway.
func (a *Agent) withUsage(sessions []brokerapi.Session) []brokerapi.Session {
	var usage []SessionUsage
	if a.d.Usage != nil {
		u, err := a.d.Usage()
		switch {
		case err != nil && !a.usageFailing:
			a.d.Logger.Warn("reading the sessions' memory and CPU; they are reported as 0 until it works", "error", err)
		case err == nil && a.usageFailing:
			a.d.Logger.Info("reading the sessions' memory and CPU works again")
		}
		a.usageFailing = err != nil
		if err == nil {
			usage = u
		}
	}
	return a.cpu.annotate(sessions, usage, time.Now())
}

// carryOut runs one session command and answers the broker with the
// outcome. Commands run beside the heartbeats: a logoff waits for the
// session's programs to quit.
func (a *Agent) carryOut(ctx context.Context, cred string, c brokerapi.Command) {
	// A command runs to its end even when the agent is stopping: a logoff
	// cut short would skip its grace and kill the session outright.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commandTimeout)
	defer cancel()
	log := a.d.Logger.With("command", c.ID, "kind", c.Kind, "user", c.User, "session", c.SessionID)
	log.Info("session command")
	var err error
	switch {
	case a.d.Control == nil:
		err = errors.New("this host's agent does not control sessions (agent.sessions is none)")
	case c.Kind == brokerapi.Logoff:
		err = a.d.Control.Logoff(ctx, c.User)
	case c.Kind == brokerapi.Disconnect:
		err = a.d.Control.Disconnect(ctx, c.User)
	case c.Kind == brokerapi.Message:
		err = a.d.Control.Message(ctx, c.User, c.Text)
	default:
		err = fmt.Errorf("this agent knows no session command %q", c.Kind)
	}
	res := brokerapi.CommandResult{Host: a.cfg.Name}
	if err != nil {
		res.Error = err.Error()
		log.Warn("session command failed", "error", err)
	} else {
		log.Info("session command carried out")
	}
	for wait := time.Second; ; wait *= 2 {
		err := a.d.Client.CommandResult(ctx, cred, c.ID, res)
		if err == nil {
			return
		}
		if permanent(err) || wait > 8*time.Second {
			log.Warn("could not tell the broker a command's outcome", "error", err)
			return
		}
		select {
		case <-ctx.Done():
			log.Warn("could not tell the broker a command's outcome", "error", err)
			return
		case <-time.After(wait):
		}
	}
}

// commandTimeout bounds one session command and the answer to it.
const commandTimeout = 2 * time.Minute

// Diff turns two readings of a host's sessions into events: a new user is
// a logon, active to disconnected a disconnect, back a reconnect, a user
// gone a logoff.
func Diff(prev, cur []brokerapi.Session) []brokerapi.Event {
	was := map[string]string{}
	for _, s := range prev {
		was[s.User] = s.State
	}
	var out []brokerapi.Event
	now := map[string]bool{}
	for _, s := range cur {
		now[s.User] = true
		if was[s.User] != s.State {
			out = append(out, brokerapi.Event{User: s.User, State: s.State})
		}
	}
	for _, s := range prev {
		if !now[s.User] {
			out = append(out, brokerapi.Event{User: s.User, State: "ended"})
		}
	}
	return out
}
