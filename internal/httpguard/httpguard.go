// Package httpguard holds the rules every deskway HTTP API keeps in front
// of its handlers, whoever the caller: bounded bodies, and state changes
// that a browser on another site cannot forge.
package httpguard

import (
	"encoding/json"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Timeouts every deskway HTTP server applies unless it sets its own: a
// client gets ReadHeader for its request line and headers and Read for
// the whole request, so one that trickles bytes (slowloris) holds a
// connection that long at most; an idle kept-alive connection is closed
// after Idle.
const (
	ReadHeader = 10 * time.Second
	Read       = 30 * time.Second
	Idle       = 2 * time.Minute
	MaxHeader  = 64 << 10
)

// Apply sets the timeouts and header cap srv does not set itself.
func Apply(srv *http.Server) {
	if srv.ReadHeaderTimeout == 0 {
		srv.ReadHeaderTimeout = ReadHeader
	}
	if srv.ReadTimeout == 0 {
		srv.ReadTimeout = Read
	}
	if srv.IdleTimeout == 0 {
		srv.IdleTimeout = Idle
	}
	if srv.MaxHeaderBytes == 0 {
		srv.MaxHeaderBytes = MaxHeader
	}
}

// Wrap guards h: every body is cut at maxBody bytes, and a request that
// changes state (any method but GET, HEAD and OPTIONS) is refused when a
// browser says it comes from another site (Origin, Sec-Fetch-Site), or
// when it has a body that is not JSON. A cross-site form or fetch can
// send text/plain or form bodies without a preflight, with the user's
// cached Basic credentials; it cannot send application/json.
func Wrap(h http.Handler, maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A shallow copy carries the capped body: net/http looks at the
		// original request's body after the handler to decide whether an
		// unread rest is small enough to drain or the connection must be
		// closed instead, and a refused client's body is never waited for.
		rc := *r
		rc.Body = http.MaxBytesReader(w, r.Body, maxBody)
		r = &rc
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
			h.ServeHTTP(w, r)
			return
		}
		if why := crossSite(r); why != "" {
			refuse(w, http.StatusForbidden, why)
			return
		}
		if r.ContentLength != 0 {
			mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || mt != "application/json" {
				refuse(w, http.StatusUnsupportedMediaType, "a request that changes state must send its body as Content-Type: application/json")
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// crossSite says why r comes from a page of another site, or "".
func crossSite(r *http.Request) string {
	if s := r.Header.Get("Sec-Fetch-Site"); s == "cross-site" || s == "same-site" {
		return "cross-site requests may not change state (Sec-Fetch-Site: " + s + ")"
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return "" // not a browser's cross-origin request: API clients send none
	}
	u, err := url.Parse(o)
	if err != nil || o == "null" || !strings.EqualFold(u.Host, r.Host) {
		return "requests from another origin (" + o + ") may not change state"
	}
	return ""
}

func refuse(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
