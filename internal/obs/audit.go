package obs

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// AuditEntry is one administrator's action on the admin API: every
// request that may change something (anything but GET and HEAD), with
// its answer.
type AuditEntry struct {
	Time time.Time `json:"time"`
	// Actor is the admin token used, by its place in admin.tokens
	// ("admin token 1"), never the token itself.
	Actor  string `json:"actor"`
	Action string `json:"action"` // method and path
	Source string `json:"source"` // the client's address
	Status int    `json:"status"` // the HTTP status answered
}

// AuditLog keeps the admin API's audit trail.
type AuditLog interface {
	Record(ctx context.Context, e AuditEntry) error
	// List returns the newest limit entries, newest first.
	List(ctx context.Context, limit int) ([]AuditEntry, error)
}

// MemoryAudit is an AuditLog in memory, of the newest max entries: the
// trail of a process with no database (a gateway alone).
type MemoryAudit struct {
	Max int

	mu      sync.Mutex
	entries []AuditEntry
}

// Record implements AuditLog.
func (m *MemoryAudit) Record(_ context.Context, e AuditEntry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries = append(m.entries, e)
	if over := len(m.entries) - m.Max; over > 0 {
		m.entries = append(m.entries[:0], m.entries[over:]...)
	}
	return nil
}

// List implements AuditLog.
func (m *MemoryAudit) List(_ context.Context, limit int) ([]AuditEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]AuditEntry, 0, min(limit, len(m.entries)))
	for i := len(m.entries) - 1; i >= 0 && len(out) < limit; i-- {
		out = append(out, m.entries[i])
	}
	return out, nil
}

// statusWriter remembers the status a handler answered with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush lets pprof's and other streaming answers through.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
