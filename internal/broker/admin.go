package broker

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
)

// queueCommand is the admin API's logoff, disconnect and message.
func (s *Server) queueCommand(w http.ResponseWriter, r *http.Request) {
	id, kind := r.PathValue("id"), r.PathValue("kind")
	if kind != brokerapi.Logoff && kind != brokerapi.Disconnect && kind != brokerapi.Message {
		s.fail(w, r, http.StatusNotFound, "no session command %q: logoff, disconnect or message", kind)
		return
	}
	var req brokerapi.CommandRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			s.fail(w, r, http.StatusBadRequest, "%v", err)
			return
		}
	}
	switch {
	case kind == brokerapi.Message && strings.TrimSpace(req.Text) == "":
		s.fail(w, r, http.StatusBadRequest, `a message needs {"text": "..."}`)
		return
	case kind != brokerapi.Message && req.Text != "":
		s.fail(w, r, http.StatusBadRequest, "%s takes no text; send a message for that", kind)
		return
	case len(req.Text) > maxCommandText:
		s.fail(w, r, http.StatusBadRequest, "the message is %d bytes; at most %d", len(req.Text), maxCommandText)
		return
	case strings.ContainsFunc(req.Text, func(c rune) bool { return c != '\n' && (unicode.IsControl(c) || unicode.Is(unicode.Bidi_Control, c)) }):
		s.fail(w, r, http.StatusBadRequest, "the message holds control or text-direction characters; only newlines may break it")
		return
	}
	var c store.Command
	var err error
	if s.offlineFor(r.Context(), func(ctx context.Context) error {
		c, err = s.store.QueueCommand(ctx, id, kind, req.Text, s.now())
		return err
	}) {
		s.fail(w, r, http.StatusServiceUnavailable, "session commands need the database, which is unreachable: try again when it returns")
		return
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		s.fail(w, r, http.StatusNotFound, "no session with id %q (deskway session ls)", id)
		return
	case errors.Is(err, store.ErrSessionEnded):
		s.fail(w, r, http.StatusConflict, "session %q has ended", id)
		return
	case err != nil:
		s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
		return
	}
	s.log.Info("session command queued", "command", c.ID, "kind", kind, "session", id, "host", c.Host, "user", c.User)
	w.Header().Set("Location", "/api/v1/broker/commands/"+c.ID)
	writeJSON(w, http.StatusAccepted, commandStatus(c))
}

// AdminHandler serves the broker's part of the admin API.
func (s *Server) AdminHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/broker/hosts", func(w http.ResponseWriter, r *http.Request) {
		group := r.URL.Query().Get("delivery_group")
		var hosts []store.Host
		var err error
		if s.offlineFor(r.Context(), func(ctx context.Context) error { hosts, err = s.store.Hosts(ctx, group); return err }) {
			hosts, err = s.cache.snapshot(group), nil
			fromCache(w)
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		stale := s.now().Add(-s.cfg.HeartbeatTimeout.D())
		out := make([]map[string]any, 0, len(hosts))
		for _, h := range hosts {
			out = append(out, map[string]any{"name": h.Name, "delivery_group": h.Group, "zone": h.Zone,
				"address": h.Address, "port": h.Port, "weight": h.Weight, "session_limit": h.SessionLimit,
				"logon_limit": h.LogonLimit, "sessions": h.Sessions, "pending_logons": h.Pending, "cpu": h.CPU,
				"memory": h.Mem, "disk_idle": h.DiskIdle, "disk_latency_ms": h.DiskLatency,
				"memory_pressure": h.MemPressure, "cpu_pressure": h.CPUPressure, "major_faults_per_s": h.MajorFaults, "swap_in_per_s": h.SwapIn,
				"swap_out_per_s": h.SwapOut, "session_memory_bytes": h.SessionMemory, "unhealthy": h.Unhealthy,
				"admin_drain": h.AdminDrain, "agent_drain": h.AgentDrain, "assigned_user": h.AssignedUser,
				"last_seen": h.LastSeen, "status": HostStatus(h, stale, false, "")})
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("GET /api/v1/broker/sessions", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		sq := store.SessionQuery{User: q.Get("user"), Host: q.Get("host"), All: q.Get("all") == "1", LoggedOn: q.Get("logged_on") == "1", Limit: 1000}
		for key, dst := range map[string]*int{"limit": &sq.Limit, "offset": &sq.Offset} {
			if v := q.Get(key); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 || key == "limit" && (n < 1 || n > 1000) {
					s.fail(w, r, http.StatusBadRequest, "%s %q: limit is 1 to 1000, offset 0 or more", key, v)
					return
				}
				*dst = n
			}
		}
		var ss []store.Session
		var total int
		var err error
		if s.offlineFor(r.Context(), func(ctx context.Context) error {
			ss, total, err = s.store.SessionPage(ctx, sq)
			return err
		}) {
			ss, err = s.cache.sessions(q.Get("user")), nil
			if sq.LoggedOn {
				ss = slices.DeleteFunc(ss, func(x store.Session) bool { return x.State == store.Launching })
			}
			total = len(ss)
			fromCache(w)
		}
		w.Header().Set("Deskway-Total", strconv.Itoa(total))
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		out := make([]map[string]any, 0, len(ss))
		for _, x := range ss {
			out = append(out, map[string]any{"id": x.ID, "user": x.User, "delivery_group": x.Group, "host": x.Host,
				"state": x.State, "created": x.CreatedAt, "updated": x.UpdatedAt, "verified": !x.Unverified,
				"memory_bytes": x.Memory, "cpu": x.CPU})
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("DELETE /api/v1/broker/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		var live bool
		var err error
		if s.offlineFor(r.Context(), func(ctx context.Context) error { live, err = s.store.EndSession(ctx, id, s.now()); return err }) {
			s.fail(w, r, http.StatusServiceUnavailable, "ending a session record needs the database, which is unreachable: try again when it returns")
			return
		}
		if errors.Is(err, store.ErrNotFound) || err == nil && !live {
			s.fail(w, r, http.StatusNotFound, "no live session with id %q", id)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		s.cache.end(id)
		s.log.Info("session record ended by administrator", "session", id)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /api/v1/broker/groups", s.adminGroups)
	mux.HandleFunc("PUT /api/v1/broker/groups/{name}/entitlements", s.setEntitlement)
	mux.HandleFunc("DELETE /api/v1/broker/groups/{name}/entitlements", s.clearEntitlement)
	mux.HandleFunc("POST /api/v1/broker/sessions/{id}/{kind}", s.queueCommand)
	mux.HandleFunc("GET /api/v1/broker/commands/{id}", func(w http.ResponseWriter, r *http.Request) {
		var c store.Command
		var err error
		if s.offlineFor(r.Context(), func(ctx context.Context) error {
			c, err = s.store.CommandByID(ctx, r.PathValue("id"), s.now(), s.commandTTL())
			return err
		}) {
			s.fail(w, r, http.StatusServiceUnavailable, "session commands are kept in the database, which is unreachable: try again when it returns")
			return
		}
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "no command %q", r.PathValue("id"))
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		writeJSON(w, http.StatusOK, commandStatus(c))
	})
	mux.HandleFunc("DELETE /api/v1/broker/hosts/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		var err error
		if s.offlineFor(r.Context(), func(ctx context.Context) error { err = s.store.RemoveHost(ctx, name); return err }) {
			s.fail(w, r, http.StatusServiceUnavailable, "removing a host needs the database, which is unreachable: try again when it returns (drain the host meanwhile)")
			return
		}
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "no host named %q", name)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusConflict, "%v", err)
			return
		}
		s.cache.remove(name)
		s.log.Info("host removed by administrator", "host", name)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /api/v1/broker/hosts/{name}/drain", s.drainHost(false))
	// Undrain has a path of its own so that the audit trail, which keeps
	// the method and path, tells it from drain.
	mux.HandleFunc("POST /api/v1/broker/hosts/{name}/undrain", s.drainHost(true))
	return mux
}

// drainHost sets a host's admin drain: as the body says, or off for
// undrain, which takes no body.
func (s *Server) drainHost(undrain bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req brokerapi.DrainRequest
		if !undrain {
			if err := decode(w, r, &req); err != nil {
				s.fail(w, r, http.StatusBadRequest, "%v", err)
				return
			}
		}
		name := r.PathValue("name")
		offline, err := s.applyDrain(r.Context(), name, req.Drain)
		if errors.Is(err, store.ErrNotFound) {
			s.fail(w, r, http.StatusNotFound, "no host named %q", name)
			return
		}
		if err != nil {
			s.fail(w, r, http.StatusServiceUnavailable, "%v", err)
			return
		}
		if offline {
			fromCache(w)
		}
		s.log.Info("drain", "host", name, "drain", req.Drain, "offline", offline)
		writeJSON(w, http.StatusOK, map[string]any{"host": name, "admin_drain": req.Drain})
	}
}
