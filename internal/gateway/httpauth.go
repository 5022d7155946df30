package gateway

import (
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/policy"
	"github.com/deskway/deskway/internal/proto/ntlm"
)

// authenticateHTTP runs HTTP NTLM on the connection, or lets a PAA client
// through unauthenticated (its token is checked in TUNNEL_CREATE). It
// writes the response itself when it returns false.
func (s *Server) authenticateHTTP(w http.ResponseWriter, r *http.Request, cs *connState) (string, bool) {
	if cs.user != nil {
		return policy.MethodNTLM, true
	}
	authz := r.Header.Get("Authorization")
	scheme, token, _ := strings.Cut(authz, " ")
	if authz == "" {
		if strings.EqualFold(r.Header.Get("RDG-Auth-Scheme"), "PAA") && s.deps.Tokens != nil && s.offers(policy.MethodPAA) {
			if lk := s.deps.Throttle.Check("", cs.remote); lk != nil {
				s.throttled(w, cs, policy.MethodPAA, lk)
				return "", false
			}
			return policy.MethodPAA, true
		}
		if !s.offers(policy.MethodNTLM) {
			s.metrics.auth.WithLabelValues("http", "refused").Inc()
			plain(w, http.StatusUnauthorized, "")
			return "", false
		}
		w.Header().Add("WWW-Authenticate", "NTLM")
		w.Header().Add("WWW-Authenticate", "Negotiate")
		plain(w, http.StatusUnauthorized, "")
		return "", false
	}
	if !s.offers(policy.MethodNTLM) || !(strings.EqualFold(scheme, "NTLM") || strings.EqualFold(scheme, "Negotiate")) {
		s.log.Warn("unsupported HTTP auth scheme", "scheme", scheme, "remote", cs.remote)
		plain(w, http.StatusUnauthorized, "")
		return "", false
	}
	msg, err := base64.StdEncoding.DecodeString(strings.TrimSpace(token))
	if err != nil || len(msg) < 12 || string(msg[:8]) != "NTLMSSP\x00" {
		s.log.Warn("bad NTLM token", "remote", cs.remote, "scheme", scheme)
		s.metrics.auth.WithLabelValues(policy.MethodNTLM, "malformed").Inc()
		plain(w, http.StatusBadRequest, "")
		return "", false
	}
	switch msg[8] {
	case 1:
		// An address past its limit is turned away before the exchange;
		// failures are counted where the password is checked.
		if lk := s.deps.Throttle.Check("", cs.remote); lk != nil {
			s.throttled(w, cs, policy.MethodNTLM, lk)
			return "", false
		}
		x, challenge, err := s.ntlm.Challenge(msg)
		if err != nil {
			s.log.Warn("bad NTLM negotiate", "remote", cs.remote, "err", err)
			plain(w, http.StatusBadRequest, "")
			return "", false
		}
		cs.ntlm = x
		w.Header().Set("WWW-Authenticate", scheme+" "+base64.StdEncoding.EncodeToString(challenge))
		plain(w, http.StatusUnauthorized, "")
		return "", false
	case 3:
		x := cs.ntlm
		cs.ntlm = nil
		if x == nil {
			s.log.Warn("NTLM authenticate without a challenge on this connection", "remote", cs.remote)
			plain(w, http.StatusUnauthorized, "")
			return "", false
		}
		name := ntlmUser(msg)
		// A locked-out login is refused before its password is looked at,
		// and is no failure: a right password refused here must not lock
		// its owner's address too.
		if lk := s.deps.Throttle.Check(name, cs.remote); lk != nil {
			s.throttled(w, cs, policy.MethodNTLM, lk, "user", name)
			return "", false
		}
		u, err := s.ntlm.Authenticate(x, msg)
		if err != nil {
			s.deps.Throttle.Fail(name, cs.remote)
			s.log.Warn("login failed", "user", name, "remote", cs.remote, "err", err)
			s.metrics.auth.WithLabelValues(policy.MethodNTLM, "failed").Inc()
			plain(w, http.StatusUnauthorized, "")
			return "", false
		}
		s.deps.Throttle.Succeed(u.Name, cs.remote)
		cs.user = u
		s.metrics.auth.WithLabelValues(policy.MethodNTLM, "ok").Inc()
		s.log.Info("login", "user", u.Name, "remote", cs.remote, "method", policy.MethodNTLM)
		return policy.MethodNTLM, true
	default:
		plain(w, http.StatusBadRequest, "")
		return "", false
	}
}

// throttled refuses a login the throttle holds back: 429 with
// Retry-After, which clients that read the status can show, and the
// reason in the log.
func (s *Server) throttled(w http.ResponseWriter, cs *connState, method string, lk *auth.Lockout, attrs ...any) {
	s.log.Warn("login refused by the failed-login throttle", append(attrs, "remote", cs.remote, "method", method, "reason", lk.Reason)...)
	s.metrics.auth.WithLabelValues(method, "throttled").Inc()
	w.Header().Set("Retry-After", strconv.Itoa(int(lk.RetryAfter.Seconds())+1))
	w.Header().Set("Connection", "close")
	plain(w, http.StatusTooManyRequests, "")
}

func ntlmUser(msg []byte) string {
	a, err := ntlm.DecodeAuthenticate(msg)
	if err != nil {
		return "?"
	}
	return a.User
}

func (s *Server) offers(m string) bool {
	for _, x := range s.cfg.AuthMethods {
		if x == m {
			return true
		}
	}
	return false
}
