package broker

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
)

// AgentCredentialTTL is how long a registered host's credential lasts; an
// agent whose credential expires registers again with its join token.
const AgentCredentialTTL = 7 * 24 * time.Hour

// agent authenticates an agent credential, before any of the body is read.
func (s *Server) agent(w http.ResponseWriter, r *http.Request) (*auth.AgentClaims, bool) {
	tok := bearer(r)
	if tok == "" {
		s.fail(w, r, http.StatusUnauthorized, "agent requests need Authorization: Bearer <credential from register>")
		return nil, false
	}
	c, err := s.tokens.VerifyAgent(tok)
	if err != nil {
		s.fail(w, r, http.StatusUnauthorized, "agent credential refused (%v): register again", err)
		return nil, false
	}
	return c, true
}

// sameHost checks that a report names the host its credential is for.
// Where the report is applied, the database (or the local host cache while
// it is away) checks the credential's registration too.
func (s *Server) sameHost(w http.ResponseWriter, r *http.Request, c *auth.AgentClaims, host string) bool {
	if c.Subject != host {
		s.fail(w, r, http.StatusForbidden, "this credential is for host %q, not %q", c.Subject, host)
		return false
	}
	return true
}

// register adds a host with a join token, which only ever creates new
// hosts in its own delivery group, or lets a host's own agent update its
// registration with the credential it was given. The bearer is checked
// before the body is read.
func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r)
	if tok == "" {
		s.fail(w, r, http.StatusUnauthorized, "register with Authorization: Bearer <join token> (deskway token join --group NAME), or the host's own credential")
		return
	}
	jc, jerr := s.tokens.VerifyJoin(tok)
	var own *auth.AgentClaims // the host's credential, when that is the bearer
	if jerr != nil {
		c, aerr := s.tokens.VerifyAgent(tok)
		if aerr != nil {
			s.fail(w, r, http.StatusUnauthorized, "join token refused (%v): mint a new one with deskway token join", jerr)
			return
		}
		own = c
	}
	var group string
	if own != nil {
		group = own.Group
	} else {
		group = jc.Group
	}
	g, found := s.groups.Load().byName[group]
	if !found {
		s.fail(w, r, http.StatusForbidden, "the token is for delivery group %q, which this broker does not define", group)
		return
	}
	var req brokerapi.RegisterRequest
	if err := decode(w, r, &req); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	switch {
	case !namePattern.MatchString(req.Name):
		s.fail(w, r, http.StatusBadRequest, "host name %q must be 1 to 253 letters, digits, dots, dashes or underscores", req.Name)
		return
	case req.Address == "" || len(req.Address) > 253 || strings.ContainsAny(req.Address, " /:\r\n") && net.ParseIP(req.Address) == nil:
		s.fail(w, r, http.StatusBadRequest, "address %q is not a host name or IP address", req.Address)
		return
	case req.Port < 1 || req.Port > 65535:
		s.fail(w, r, http.StatusBadRequest, "port %d is not 1 to 65535", req.Port)
		return
	case req.Weight < 0 || req.Weight > 100:
		s.fail(w, r, http.StatusBadRequest, "weight %g is not between 0 and 100", req.Weight)
		return
	case req.SessionLimit < 0:
		s.fail(w, r, http.StatusBadRequest, "session_limit %d is negative", req.SessionLimit)
		return
	case own != nil && own.Subject != req.Name:
		s.fail(w, r, http.StatusForbidden, "this credential is host %q's; it cannot register %q", own.Subject, req.Name)
		return
	}
	limit := g.SessionLimit
	if req.SessionLimit > 0 && req.SessionLimit < limit {
		limit = req.SessionLimit
	}
	weight := req.Weight
	if weight == 0 {
		weight = 1
	}
	zone := req.Zone
	switch {
	case own != nil && own.Zone != "":
		zone = own.Zone
	case own == nil && jc.Zone != "":
		zone = jc.Zone
	}
	h := store.Host{Name: req.Name, Group: g.Name, Zone: zone, Address: req.Address,
		Port: req.Port, Weight: weight, SessionLimit: limit, LogonLimit: g.LogonLimit, RegisteredAt: s.now()}
	var err error
	dctx, cancel := dbCall(r.Context())
	defer cancel()
	if own != nil {
		h.Registration = own.Registration
		err = s.store.UpdateHost(dctx, h)
	} else {
		h.Registration = store.NewID()
		err = s.store.JoinHost(dctx, h, jc.ID, jc.Uses, jc.ExpiresAt.Time)
	}
	switch {
	case errors.Is(err, store.ErrHostExists):
		s.log.Warn("join token refused for a registered host", "host", req.Name, "delivery_group", g.Name, "remote", r.RemoteAddr)
		s.fail(w, r, http.StatusConflict, "host %q is already registered: its own agent re-registers with its credential, "+
			"or an administrator removes it (DELETE /api/v1/broker/hosts/%s) before a join token may register the name again", req.Name, req.Name)
		return
	case errors.Is(err, store.ErrJoinTokenUsed):
		s.fail(w, r, http.StatusUnauthorized, "this join token has registered the %d hosts it may: mint a new one with deskway token join", jc.Uses)
		return
	case errors.Is(err, store.ErrNotFound):
		s.fail(w, r, http.StatusNotFound, "host %q of this credential is no longer registered in delivery group %q (removed, or removed and joined again): register it with a join token", req.Name, g.Name)
		return
	case err != nil:
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.cache.register(h)
	cred, err := s.tokens.MintAgent(req.Name, g.Name, zone, h.Registration, AgentCredentialTTL)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "%v", err)
		return
	}
	how := "join token"
	if own != nil {
		how = "host credential"
	}
	s.log.Info("host registered", "host", req.Name, "delivery_group", g.Name, "zone", zone, "address", req.Address,
		"port", req.Port, "session_limit", limit, "weight", weight, "with", how)
	writeJSON(w, http.StatusOK, brokerapi.RegisterResponse{Host: req.Name, DeliveryGroup: g.Name, Credential: cred,
		HeartbeatInterval: s.cfg.HeartbeatInterval.D().Seconds()})
}

func fraction(name string, v float64) error {
	if v < 0 || v > 1 || v != v {
		return fmt.Errorf("%s %g is not a fraction between 0 and 1", name, v)
	}
	return nil
}

// rate checks a count per second (or share of a core): finite, not negative.
func rate(name string, v float64) error {
	if v < 0 || v != v || math.IsInf(v, 1) {
		return fmt.Errorf("%s %g is not a rate of 0 or more", name, v)
	}
	return nil
}

func (s *Server) heartbeat(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	var hb brokerapi.Heartbeat
	if err := decode(w, r, &hb); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if !s.sameHost(w, r, c, hb.Host) {
		return
	}
	err := errors.Join(fraction("cpu", hb.CPU), fraction("memory", hb.Memory), fraction("disk_idle", hb.DiskIdle),
		fraction("memory_pressure", hb.MemoryPressure), fraction("cpu_pressure", hb.CPUPressure), rate("major_faults_per_s", hb.MajorFaultsPerSec),
		rate("swap_in_per_s", hb.SwapInPerSec), rate("swap_out_per_s", hb.SwapOutPerSec))
	if hb.RDPDown < 0 || hb.RDPDown > 65535 {
		err = errors.Join(err, fmt.Errorf("rdp_down_port %d is not a port", hb.RDPDown))
	}
	if hb.DiskLatencyMS < 0 || hb.DiskLatencyMS != hb.DiskLatencyMS {
		err = errors.Join(err, fmt.Errorf("disk_latency_ms %g is negative", hb.DiskLatencyMS))
	}
	sessions := map[string]string{}
	var usage map[string]store.Usage
	for _, ss := range hb.Sessions {
		if ss.User == "" || (ss.State != store.Active && ss.State != store.Disconnected) {
			err = errors.Join(err, fmt.Errorf("session %+v needs a user and a state of active or disconnected", ss))
			break
		}
		if e := rate("cpu", ss.CPU); e != nil {
			err = errors.Join(err, fmt.Errorf("session of %q: %w", ss.User, e))
			break
		}
		// A desktop account's session is its portal user's: the one the
		// broker placed and the portal shows.
		user := s.users.PortalUser(ss.User)
		sessions[user] = ss.State
		if usage == nil {
			usage = map[string]store.Usage{}
		}
		usage[user] = store.Usage{Memory: ss.MemoryBytes, CPU: ss.CPU}
	}
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	rep := store.Report{Host: hb.Host, Registration: c.Registration, CPU: hb.CPU, Mem: hb.Memory, DiskIdle: hb.DiskIdle, DiskLatency: hb.DiskLatencyMS,
		MemPressure: hb.MemoryPressure, CPUPressure: hb.CPUPressure, MajorFaults: hb.MajorFaultsPerSec, SwapIn: hb.SwapInPerSec, SwapOut: hb.SwapOutPerSec,
		Unhealthy: Unhealthy(s.cfg.Health, hb), Drain: hb.Drain, Sessions: sessions, Usage: usage,
		Now: s.now(), LogonGrace: s.cfg.LogonGrace.D()}
	if g, ok := s.groups.Load().byName[c.Group]; ok {
		rep.TrustSessions = g.TrustHostSessions
	}
	err = s.applyReport(r.Context(), rep)
	if errors.Is(err, errUnknownHost) {
		s.unknownHost(w, r, hb.Host)
		return
	}
	if errors.Is(err, store.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, "host %q of this credential is not registered (removed, or removed and joined again): register it with a join token", hb.Host)
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.m.heartbeats.Inc()
	var cmds []store.Command
	if !s.offline.Load() {
		dctx, cancel := dbCall(r.Context())
		cmds, err = s.store.TakeCommands(dctx, hb.Host, s.now(), s.commandTTL())
		cancel()
		if err != nil && r.Context().Err() == nil {
			// They stay queued for the next heartbeat.
			s.log.Warn("could not hand a host its commands", "host", hb.Host, "error", err)
		}
	}
	if len(cmds) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	resp := brokerapi.HeartbeatResponse{}
	for _, c := range cmds {
		// The host knows the session by its own account's name.
		hostUser := c.User
		if d, ok := s.users.Desktop(c.User); ok {
			hostUser = d.Account
		}
		resp.Commands = append(resp.Commands, brokerapi.Command{ID: c.ID, SessionID: c.SessionID, User: hostUser, Kind: c.Kind, Text: c.Text})
		s.log.Info("session command sent to host", "command", c.ID, "kind", c.Kind, "host", hb.Host, "user", c.User, "session", c.SessionID)
	}
	writeJSON(w, http.StatusOK, resp)
}

// commandTTL is how long a session command waits for its host's agent to
// take it and answer (two minutes, or four heartbeats if longer); past
// it, the command reads as expired.
func (s *Server) commandTTL() time.Duration {
	return max(2*time.Minute, 4*s.cfg.HeartbeatInterval.D())
}

// maxCommandText bounds a message and an agent's failure reason.
const maxCommandText = 1000

// commandResult records an agent's answer to a command it was sent.
func (s *Server) commandResult(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	var res brokerapi.CommandResult
	if err := decode(w, r, &res); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if !s.sameHost(w, r, c, res.Host) {
		return
	}
	if len(res.Error) > maxCommandText {
		res.Error = res.Error[:maxCommandText]
	}
	id := r.PathValue("id")
	dctx, cancel := dbCall(r.Context())
	defer cancel()
	err := s.store.FinishCommand(dctx, res.Host, c.Registration, id, res.Error, s.now())
	if errors.Is(err, store.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, "host %q was sent no command %q that waits for an answer", res.Host, id)
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	if res.Error != "" {
		s.log.Warn("session command failed on host", "command", id, "host", res.Host, "error", res.Error)
	} else {
		s.log.Info("session command carried out", "command", id, "host", res.Host)
	}
	w.WriteHeader(http.StatusNoContent)
}

// commandStatus is a command as the admin API shows it.
func commandStatus(c store.Command) brokerapi.CommandStatus {
	return brokerapi.CommandStatus{Command: brokerapi.Command{ID: c.ID, SessionID: c.SessionID, User: c.User, Kind: c.Kind, Text: c.Text},
		Host: c.Host, State: c.State, Error: c.Error}
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	c, ok := s.agent(w, r)
	if !ok {
		return
	}
	var ev brokerapi.Events
	if err := decode(w, r, &ev); err != nil {
		s.fail(w, r, http.StatusBadRequest, "%v", err)
		return
	}
	if !s.sameHost(w, r, c, ev.Host) {
		return
	}
	for _, e := range ev.Events {
		if e.User == "" || (e.State != store.Active && e.State != store.Disconnected && e.State != store.Ended) {
			s.fail(w, r, http.StatusBadRequest, "event %+v needs a user and a state of active, disconnected or ended", e)
			return
		}
	}
	now := s.now()
	// Consecutive events of one state go to the store together: a batch of
	// logons costs one statement, and the order of a user's events holds.
	for i := 0; i < len(ev.Events); {
		j, users := i, []string{}
		for ; j < len(ev.Events) && ev.Events[j].State == ev.Events[i].State; j++ {
			users = append(users, s.users.PortalUser(ev.Events[j].User))
		}
		e := store.Event{Host: ev.Host, Registration: c.Registration, Users: users, State: ev.Events[i].State, Now: now}
		changed, err := s.applyEvent(r.Context(), e)
		if errors.Is(err, errUnknownHost) {
			s.unknownHost(w, r, ev.Host)
			return
		}
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "host %q of this credential is not registered (removed, or removed and joined again): register it with a join token", ev.Host)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		s.log.Debug("session events", "host", ev.Host, "users", users, "state", ev.Events[i].State, "changed", changed)
		i = j
	}
	w.WriteHeader(http.StatusNoContent)
}
