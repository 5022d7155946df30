// Package obs sets up logging and the admin listener (JSON admin API,
// Prometheus /metrics and pprof) that every role shares.
package obs

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
	"net/http/pprof"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/deskway/deskway/internal/admission"
	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/httpguard"
	"golang.org/x/term"
)

// NewLogger returns a JSON logger, or a text one when format is "text" or
// "auto" and w is a terminal.
func NewLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv}
	if format == "text" || format == "auto" && isTerminal(w) {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// Admin is the admin HTTPS listener.
type Admin struct {
	Log      *slog.Logger
	Registry *prometheus.Registry
	// Tokens are accepted as "Authorization: Bearer <token>" on /api/ and /debug/.
	Tokens []string
	// ConsoleTokens are accepted as Tokens are, from a web console: the
	// only credentials whose ActorHeader the audit trail records.
	ConsoleTokens []string
	// API muxes, each owning a path prefix under /api/v1/.
	API []*http.ServeMux
	// Throttle counts wrong tokens per source address, as wrong passwords
	// are counted: admin tokens are strings an operator chose.
	Throttle *auth.Throttle
	// Audit keeps every action taken through the API (nil: kept in
	// memory); every action is also logged.
	Audit AuditLog

	refused admission.Refusals // wrong or missing tokens, logged at most once a second
}

// credential is the admin token a request carries.
type credential struct {
	// n is its place in Tokens or ConsoleTokens, counted from 1; 0 for
	// none.
	n       int
	console bool
}

// authorized says which admin token r carries.
func (a *Admin) authorized(r *http.Request) credential {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return credential{}
	}
	find := func(tokens []string) int {
		for i, t := range tokens {
			if t != "" && subtle.ConstantTimeCompare([]byte(got), []byte(t)) == 1 {
				return i + 1
			}
		}
		return 0
	}
	if n := find(a.Tokens); n > 0 {
		return credential{n: n}
	}
	return credential{n: find(a.ConsoleTokens), console: true}
}

// refuse answers a request without a valid admin token, counting a wrong
// one against its address; past the throttle's limit the address gets 429
// before its token is looked at. Otherwise it returns the token.
func (a *Admin) refuse(w http.ResponseWriter, r *http.Request) (credential, bool) {
	ap, _ := netip.ParseAddrPort(r.RemoteAddr)
	from := ap.Addr()
	if a.Throttle != nil {
		if lk := a.Throttle.Check("", from); lk != nil {
			a.refused.Log(a.Log, "admin API refused a request", from, lk.Reason)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", strconv.Itoa(int(lk.RetryAfter.Seconds())+1))
			w.WriteHeader(http.StatusTooManyRequests)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "admin API refused: " + lk.Reason})
			return credential{}, true
		}
	}
	if c := a.authorized(r); c.n > 0 {
		return c, false
	}
	why := "no admin token"
	if r.Header.Get("Authorization") != "" {
		why = "a wrong admin token"
		if a.Throttle != nil {
			a.Throttle.Fail("", from)
		}
	}
	a.refused.Log(a.Log, "admin API refused a request", from, why+" for "+r.Method+" "+r.URL.Path)
	w.Header().Set("WWW-Authenticate", `Bearer realm="deskway admin"`)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = io.WriteString(w, `{"error":"admin API needs Authorization: Bearer <admin token>"}`+"\n")
	return credential{}, true
}

// Handler returns the admin mux.
func (a *Admin) Handler() http.Handler {
	// The first role mux with a route for the request serves it.
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, m := range a.API {
			if _, pattern := m.Handler(r); pattern != "" {
				m.ServeHTTP(w, r)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":"no such admin API path"}`+"\n")
	})
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	if a.Audit == nil {
		a.Audit = &MemoryAudit{Max: 10000}
	}
	protected := http.NewServeMux()
	protected.HandleFunc("GET /api/v1/audit", a.listAudit)
	protected.Handle("/api/", api)
	protected.HandleFunc("/debug/pprof/", pprof.Index)
	protected.HandleFunc("/debug/pprof/profile", pprof.Profile)
	protected.HandleFunc("/debug/pprof/trace", pprof.Trace)
	guard := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, refused := a.refuse(w, r)
		if refused {
			return
		}
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			protected.ServeHTTP(w, r)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), actorKey{}, actor(r, token)))
		sw := &statusWriter{ResponseWriter: w}
		protected.ServeHTTP(sw, r)
		a.record(r, token, sw.status)
	})
	mux.Handle("/api/", guard)
	mux.Handle("/debug/", guard)
	return mux
}

// record writes an action to the audit trail and the log.
func (a *Admin) record(r *http.Request, token credential, status int) {
	if status == 0 {
		status = http.StatusOK
	}
	e := AuditEntry{Time: time.Now().UTC(), Actor: actor(r, token), Action: r.Method + " " + r.URL.Path,
		Source: r.RemoteAddr, Status: status}
	a.Log.Info("admin action", "actor", e.Actor, "action", e.Action, "source", e.Source, "status", e.Status)
	// The request's context ends with its answer: the record must not.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if err := a.Audit.Record(ctx, e); err != nil {
		a.Log.Warn("could not write an admin action to the audit trail; the log line above keeps it", "error", err)
	}
}

// actor is who sends r with token, as the audit trail names them. Only a
// console's credential names the person it acts for: anyone holding an
// admin token could name anybody.
func actor(r *http.Request, token credential) string {
	if !token.console {
		return fmt.Sprintf("admin token %d", token.n)
	}
	a := fmt.Sprintf("console token %d", token.n)
	if on := onBehalfOf(r); on != "" {
		a += " for " + on
	}
	return a
}

type actorKey struct{}

// Actor is who an admin API request that changes state comes from, as
// the audit trail names them, for handlers that keep it with what they
// change; "" outside such a request.
func Actor(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	return a
}

// ActorHeader names, in a request with a console token, the person the
// web console acts for; the audit trail records both. Requests with an
// admin token are recorded as the token's whatever they say here.
const ActorHeader = "Deskway-Actor"

// onBehalfOf is the request's ActorHeader, cut to 128 printable characters.
func onBehalfOf(r *http.Request) string {
	v := strings.Map(func(c rune) rune {
		if c < ' ' || c == 0x7f {
			return -1
		}
		return c
	}, r.Header.Get(ActorHeader))
	if utf8.RuneCountInString(v) > 128 {
		v = string([]rune(v)[:128])
	}
	return strings.ToValidUTF8(v, "?")
}

// listAudit answers GET /api/v1/audit?limit=N (default 100, at most 10,000).
func (a *Admin) listAudit(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":"limit is a number from 1 to 10000"}`+"\n")
			return
		}
		limit = n
	}
	entries, err := a.Audit.List(r.Context(), limit)
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"entries": entries})
}

// Serve runs the admin listener until ctx ends.
func (a *Admin) Serve(ctx context.Context, ln net.Listener, tc *tls.Config) error {
	// pprof's profile and trace run as long as asked (30s by default).
	srv := &http.Server{Handler: httpguard.Wrap(a.Handler(), 1<<20), ReadTimeout: httpguard.Read,
		ErrorLog: slog.NewLogLogger(a.Log.Handler(), slog.LevelDebug)}
	a.Log.Info("admin listening", "addr", ln.Addr().String())
	return ServeHTTPS(ctx, "admin", srv, ln, tc, 5*time.Second)
}

// ServeHTTPS serves srv over TLS on ln until ctx ends, then shuts it down,
// letting requests in flight finish for up to grace.
func ServeHTTPS(ctx context.Context, name string, srv *http.Server, ln net.Listener, tc *tls.Config, grace time.Duration) error {
	httpguard.Apply(srv)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(tls.NewListener(ln, tc)) }()
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("%s: %w", name, err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}
