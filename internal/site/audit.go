package site

import (
	"context"
	"net/http"
	"time"

	"github.com/deskway/deskway/internal/obs"
)

// audit writes one change to the audit trail the admin API keeps (the
// broker's database, or memory), in the form of the administrators'
// own actions: who, what, from where, and how it ended (an HTTP status:
// 200 applied, 400 refused, 500 failed). The log keeps it too, so a
// trail that cannot be written loses nothing.
func (s *Server) audit(actor, source, action string, status int) {
	s.log.Info("site change", "actor", actor, "action", action, "status", status)
	if s.d.Audit == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e := obs.AuditEntry{Time: time.Now().UTC(), Actor: actor, Action: action, Source: source, Status: status}
	if err := s.d.Audit.Record(ctx, e); err != nil {
		s.log.Warn("could not write a site change to the audit trail; the log line above keeps it", "error", err)
	}
}

// Refused writes a reload that changed nothing, and why, to the audit
// trail.
func (s *Server) Refused(actor, source string, why error) {
	s.audit(actor, source, "site reload refused: "+why.Error(), http.StatusBadRequest)
}
