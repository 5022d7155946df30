package broker

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
)

// sessionEndWindow is how far back a logoff or disconnect command counts
// as the cause of a session's end: a page asks as soon as its connection
// ends, so anything older is another story.
const sessionEndWindow = 5 * time.Minute

// endSince is from when a command counts: the asker's since (when its
// connection began: a disconnect before a reconnect did not end this
// one), within the last sessionEndWindow.
func endSince(since, now time.Time) time.Time {
	if floor := now.Add(-sessionEndWindow); since.Before(floor) || since.After(now) {
		return floor
	}
	return since
}

// userSessionEnd tells a user (or a front end on their behalf) how their
// own session ended.
func (s *Server) userSessionEnd(w http.ResponseWriter, r *http.Request) {
	who, ok := s.user(w, r)
	if !ok {
		return
	}
	var since time.Time
	if ms, err := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64); err == nil {
		since = time.UnixMilli(ms)
	}
	end, rf := s.sessionEnd(r.Context(), who, r.PathValue("id"), since)
	if rf != nil {
		s.refused(w, r, rf)
		return
	}
	writeJSON(w, http.StatusOK, end)
}

func (s *Server) sessionEnd(ctx context.Context, who caller, id string, since time.Time) (brokerapi.SessionEnd, *refusal) {
	var end brokerapi.SessionEnd
	var err error
	if s.offlineFor(ctx, func(ctx context.Context) error {
		end.State, end.Command, err = s.store.SessionEnd(ctx, id, who.user, endSince(since, s.now()))
		return err
	}) {
		return end, refuse(http.StatusServiceUnavailable, "the broker's database is unreachable: how the session ended is not known")
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		return end, refuse(http.StatusNotFound, "you have no session %q", id)
	case err != nil:
		return end, refuse(http.StatusServiceUnavailable, "%v", err)
	}
	return end, nil
}

// SessionEnd tells how the session id of the user req names ended,
// counting the commands since since.
func (l *Local) SessionEnd(ctx context.Context, id string, since time.Time, req brokerapi.DesktopsRequest) (*brokerapi.SessionEnd, error) {
	who, rf := l.s.onBehalf(caller{frontend: true}, req.User, req.Groups)
	if rf == nil {
		var end brokerapi.SessionEnd
		if end, rf = l.s.sessionEnd(ctx, who, id, since); rf == nil {
			return &end, nil
		}
	}
	return nil, l.s.localRefusal(ctx, "session end", rf)
}
