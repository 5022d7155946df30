package auth

import (
	"sync"
	"time"
)

// Throttle counts failed logins per key (a user name, a source address) and
// refuses a key that failed too often within the window. Memory is bounded:
// past maxKeys the oldest windows are dropped first.
type Throttle struct {
	max     int
	window  time.Duration
	maxKeys int
	now     func() time.Time

	mu   sync.Mutex
	keys map[string]*failures
}

type failures struct {
	first time.Time
	count int
}

// NewThrottle allows max failures per key within window.
func NewThrottle(max int, window time.Duration, now func() time.Time) *Throttle {
	if now == nil {
		now = time.Now
	}
	return &Throttle{max: max, window: window, maxKeys: 100000, now: now, keys: map[string]*failures{}}
}

// Allowed reports whether key may try to log in now.
func (t *Throttle) Allowed(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, ok := t.keys[key]
	if !ok {
		return true
	}
	if t.now().Sub(f.first) > t.window {
		delete(t.keys, key)
		return true
	}
	return f.count < t.max
}

// Fail records a failed login for key.
func (t *Throttle) Fail(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	f, ok := t.keys[key]
	if !ok || now.Sub(f.first) > t.window {
		if len(t.keys) >= t.maxKeys {
			t.pruneLocked(now)
		}
		f = &failures{first: now}
		t.keys[key] = f
	}
	f.count++
}

// Succeed clears key after a good login.
func (t *Throttle) Succeed(key string) {
	t.mu.Lock()
	delete(t.keys, key)
	t.mu.Unlock()
}

// pruneLocked drops expired windows, then, if still full, the oldest half.
func (t *Throttle) pruneLocked(now time.Time) {
	var oldest time.Time
	for k, f := range t.keys {
		if now.Sub(f.first) > t.window {
			delete(t.keys, k)
		} else if oldest.IsZero() || f.first.Before(oldest) {
			oldest = f.first
		}
	}
	if len(t.keys) < t.maxKeys {
		return
	}
	cut := oldest.Add(now.Sub(oldest) / 2)
	for k, f := range t.keys {
		if !f.first.After(cut) {
			delete(t.keys, k)
		}
	}
}
