package broker

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/httpguard"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/proxylisten"
)

// maxBody bounds every API request body.
const maxBody = 64 << 10

// Handler serves the launch and agent API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/launch", s.launch)
	mux.HandleFunc("POST /api/v1/desktops", s.desktops)
	mux.HandleFunc("POST /api/v1/sessions/{id}/logoff", s.userLogoff)
	mux.HandleFunc("POST /api/v1/sessions/{id}/end", s.userSessionEnd)
	mux.HandleFunc("POST /api/v1/agent/register", s.register)
	mux.HandleFunc("POST /api/v1/agent/heartbeat", s.heartbeat)
	mux.HandleFunc("POST /api/v1/agent/events", s.events)
	mux.HandleFunc("POST /api/v1/agent/commands/{id}", s.commandResult)
	mux.HandleFunc("POST /api/v1/peer/sessions", s.peerSessions)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, r, http.StatusNotFound, "no such broker API path %s %s (see docs/broker-openapi.yaml)", r.Method, r.URL.Path)
	})
	return mux
}

// Guarded is Handler behind the guard every HTTPS request passes
// (bounded bodies, no cross-site state changes): what Serve serves, and
// what a portal in the same process calls without a socket.
func (s *Server) Guarded() http.Handler { return httpguard.Wrap(s.Handler(), maxBody) }

// Serve runs the broker's HTTPS listener until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener, tc *tls.Config) error {
	srv := &http.Server{Handler: s.Guarded(), ReadTimeout: s.cfg.ReadTimeout.D(),
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	mctx, stop := context.WithCancel(ctx)
	defer stop()
	go s.Maintain(mctx)
	if len(s.cfg.ProxyProtocolFrom) > 0 {
		trusted, err := config.ParsePrefixes(s.cfg.ProxyProtocolFrom)
		if err != nil {
			return fmt.Errorf("broker: proxy_protocol_from: %w", err)
		}
		ln = proxylisten.New(ln, trusted, s.cfg.ReadTimeout.D(), s.log)
	}
	s.log.Info("broker listening", "addr", ln.Addr().String(), "database", s.store.Dialect(), "zone", s.cfg.Zone)
	return obs.ServeHTTPS(ctx, "broker", srv, ln, tc, 10*time.Second)
}

// fail answers with a JSON error and logs it.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	for _, v := range a {
		if err, ok := v.(error); ok && s.noSpace(err) {
			msg = noSpaceMsg
		}
	}
	s.log.Log(r.Context(), refusalLevel(status), "request refused", "method", r.Method, "path", r.URL.Path, "status", status,
		"remote", r.RemoteAddr, "error", msg)
	writeJSON(w, status, brokerapi.Error{Error: msg})
}

// refusalLevel is how loud a refusal with status is logged: an error
// only when the broker itself failed, not when a client was turned away
// or the database is out (503, which its own log lines report).
func refusalLevel(status int) slog.Level {
	if status >= 500 && status != http.StatusServiceUnavailable {
		return slog.LevelError
	}
	return slog.LevelInfo
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads one JSON object into v: at most maxBody bytes, no unknown
// fields, nothing after it.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return fmt.Errorf("request body is over %d bytes", maxBody)
		}
		return fmt.Errorf("request body is not the expected JSON: %v", err)
	}
	if dec.More() {
		return errors.New("request body has data after the JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("request body has data after the JSON object")
	}
	return nil
}

// bearer returns the bearer token of r, or "".
func bearer(r *http.Request) string {
	t, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if t == r.Header.Get("Authorization") {
		return ""
	}
	return t
}

// caller is who is launching.
type caller struct {
	user     string
	groups   []string
	zone     string
	frontend bool
}

// authenticate accepts HTTP Basic with a local user's password, or a
// front-end bearer token.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (caller, bool) {
	ap, _ := netip.ParseAddrPort(r.RemoteAddr)
	from := ap.Addr()
	if tok := bearer(r); tok != "" {
		// Front-end tokens are strings an operator chose, so guessing
		// them counts against the address as wrong passwords do.
		if lk := s.throttle.Check("", from); lk != nil {
			w.Header().Set("Retry-After", strconv.Itoa(int(lk.RetryAfter.Seconds())+1))
			s.fail(w, r, http.StatusTooManyRequests, "login refused: %s", lk.Reason)
			return caller{}, false
		}
		for _, f := range s.frontend {
			if subtle.ConstantTimeCompare([]byte(tok), f) == 1 {
				return caller{frontend: true}, true
			}
		}
		s.throttle.Fail("", from)
		s.fail(w, r, http.StatusUnauthorized, "bearer token is not a front-end token of this broker")
		return caller{}, false
	}
	name, pw, ok := r.BasicAuth()
	if !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="deskway broker", charset="UTF-8"`)
		s.fail(w, r, http.StatusUnauthorized, "authenticate with HTTP Basic (user and password) or a front-end bearer token")
		return caller{}, false
	}
	// Refused before the password is checked, and not counted.
	if lk := s.throttle.Check(name, from); lk != nil {
		w.Header().Set("Retry-After", strconv.Itoa(int(lk.RetryAfter.Seconds())+1))
		s.fail(w, r, http.StatusTooManyRequests, "login refused: %s", lk.Reason)
		return caller{}, false
	}
	u, found := s.users.Lookup(name)
	if !found || !u.CheckPassword(pw) {
		s.throttle.Fail(name, from)
		w.Header().Set("WWW-Authenticate", `Basic realm="deskway broker", charset="UTF-8"`)
		s.fail(w, r, http.StatusUnauthorized, "wrong user name or password")
		return caller{}, false
	}
	s.throttle.Succeed(u.Name, from)
	return caller{user: u.Name, groups: u.Groups, zone: u.Zone}, true
}

// onBehalf settles whom a request is for: a front end names the user (and
// the groups of a user the broker does not know); a user asking for
// themself names nobody.
func (s *Server) onBehalf(who caller, user string, groups []string) (caller, *refusal) {
	switch {
	case who.frontend && user == "":
		return who, refuse(http.StatusBadRequest, "a front end acting on behalf of a user must name the user")
	case who.frontend:
		if u, found := s.users.Lookup(user); found {
			// A local account's groups and zone are the broker's to know.
			who.user, who.groups, who.zone = u.Name, u.Groups, u.Zone
		} else {
			who.user, who.groups = user, groups
		}
	case user != "" || len(groups) > 0:
		return who, refuse(http.StatusBadRequest, "user and groups are for front ends; a user asking for themself leaves them out")
	}
	if !validUser(who.user) {
		return who, refuse(http.StatusBadRequest, "user name %q is empty, too long or has control characters", who.user)
	}
	return who, nil
}
