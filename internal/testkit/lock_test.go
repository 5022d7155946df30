package testkit

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestLockSerialisesHolders: tests that take the same lock run one at a
// time, and a test holding one lock still takes another (were it shared,
// the test would hang).
func TestLockSerialisesHolders(t *testing.T) {
	name := "locktest-" + t.Name()
	var holders, most atomic.Int32
	hold := func(t *testing.T) {
		Lock(t, name, name+"-other")
		n := holders.Add(1)
		defer holders.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(50 * time.Millisecond) // a holder's work, long enough for others to try
	}
	t.Run("holders", func(t *testing.T) {
		for _, sub := range []string{"a", "b", "c"} {
			t.Run(sub, func(t *testing.T) {
				t.Parallel()
				hold(t)
			})
		}
	})
	Lock(t, name)
	t.Run("another lock", func(t *testing.T) { Lock(t, name+"-unrelated") })
	if m := most.Load(); m != 1 {
		t.Errorf("%d holders of one lock at once, want 1", m)
	}
}

// TestLockDuringReleases: the lock LockDuring took is free once fn has
// returned, while the test goes on (were it held, Lock would hang).
func TestLockDuringReleases(t *testing.T) {
	name := "locktest-" + t.Name()
	ran := false
	LockDuring(t, name, func() { ran = true })
	Lock(t, name)
	if !ran {
		t.Error("fn did not run")
	}
}
