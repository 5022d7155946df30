package web

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
)

// The portal's words for what the broker refuses. The broker's own
// message is written for administrators (hosts, drains, thresholds); a
// person gets a sentence about what they can do, and the portal's log
// keeps the broker's message beside it.

// launchRefusal is what a person reads when group could not start.
func launchRefusal(group string, err error) string {
	var se *brokerclient.StatusError
	if !errors.As(err, &se) {
		return "The desktop service is not answering right now. Try again in a moment."
	}
	switch se.Status {
	case http.StatusNotFound:
		return group + " is not offered any more. Reload the page to see your desktops."
	case http.StatusForbidden:
		return "You may not open " + group + ". Ask your administrator for access."
	case http.StatusTooManyRequests:
		return "Too many attempts. Wait a minute, then try again."
	case http.StatusServiceUnavailable:
		return "No " + group + " desktop is free right now. Try again in a few minutes; if it keeps happening, tell your administrator."
	}
	return group + " could not start. Try again in a moment; if it keeps happening, tell your administrator."
}

// logoffRefusal is what a person reads when their logoff was refused.
func logoffRefusal(err error) string {
	var se *brokerclient.StatusError
	if errors.As(err, &se) && se.Status == http.StatusNotFound {
		return "That session has already ended."
	}
	return "Your session could not be logged off right now. Try again in a moment."
}

// Why a browser session ended, in the words its page shows.
const (
	endAdminDisconnect  = "An administrator disconnected you from the desktop. Its programs are still running: open it again from your desktops to carry on."
	endLoggedOffOutside = "You were logged off from outside the session (by an administrator, or from your desktops page). Its programs were closed."
	endLoggedOff        = "You logged off. The session has ended."
	endConnectionLost   = "The connection to the desktop was lost. Its programs are still running: open it again from your desktops to carry on."
	endUnknown          = "The session ended."
)

// endSettle bounds how long the portal waits for the broker to learn
// what the page already saw: the host's agent reports a session's end
// or disconnect within its poll (agent.session_poll).
const endSettle = 4 * time.Second

// browserEnd is asked by the browser desktop page when its connection
// ends without the person pressing Disconnect: it logs what the client
// said (the page shows none of it) and answers, as {"message": ...},
// why the session ended in words, from what the broker knows of it.
func (s *Server) browserEnd(w http.ResponseWriter, r *http.Request) {
	si, ok := s.current(w, r)
	if !ok {
		http.Error(w, "Your sign-in to the portal has ended.", http.StatusUnauthorized)
		return
	}
	if !s.checkForm(w, r, si) {
		return
	}
	id, detail := r.PostFormValue("session"), r.PostFormValue("detail")
	// When the page opened, by the portal's clock: a command older than
	// that ended an earlier connection, not this one.
	var opened time.Time
	if ms, err := strconv.ParseInt(r.PostFormValue("opened"), 10, 64); err == nil {
		opened = time.UnixMilli(ms)
	}
	if len(detail) > 500 {
		detail = detail[:500]
		for !utf8.ValidString(detail) {
			detail = detail[:len(detail)-1]
		}
	}
	msg, state := s.endWords(r.Context(), si, id, opened)
	s.d.Logger.Info("browser session ended", "user", si.User, "session", id, "client_said", detail, "state", state, "shown", msg)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]string{"message": msg})
}

// endWords asks the broker how si's session id ended, waiting up to
// endSettle for its state to leave active, and returns the words and
// the state read.
func (s *Server) endWords(ctx context.Context, si signIn, id string, opened time.Time) (string, string) {
	deadline := time.Now().Add(endSettle)
	for {
		end, err := s.d.Broker.SessionEnd(ctx, id, opened, forUser(si))
		if err != nil {
			s.d.Logger.Warn("asking the broker how a browser session ended", "user", si.User, "session", id, "error", err)
			return endUnknown, "unknown"
		}
		switch {
		case end.Command == brokerapi.Disconnect:
			return endAdminDisconnect, end.State
		case end.Command == brokerapi.Logoff:
			return endLoggedOffOutside, end.State
		case end.State == "ended":
			return endLoggedOff, end.State
		}
		if time.Now().After(deadline) {
			return endConnectionLost, end.State
		}
		select {
		case <-ctx.Done():
			return endUnknown, end.State
		case <-time.After(250 * time.Millisecond):
		}
	}
}
