package stream

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestBootLogAcrossRestarts: boots live when a server stops are lost on
// the next start; ended ones are forgotten; a torn last line (the process
// died writing it) is dropped, and what is appended after it is read.
func TestBootLogAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "boots.log")
	now := time.Now()
	l, err := openBootLog(path, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"g/a/1", "g/b/1", "g/c/1"} {
		if err := l.start(k, 2); err != nil {
			t.Fatal(err)
		}
	}
	l.end("g/b/1")
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	// The process dies halfway through a line.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"op":"start","key":"g/d/1"`)
	f.Close()

	l, err = openBootLog(path, func(k string) bool { return k == "g/c/1" }, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, lost := l.lostAt("g/a/1"); !lost {
		t.Fatal("a boot live at the stop is not lost")
	}
	for _, k := range []string{"g/b/1", "g/c/1", "g/d/1"} {
		if _, lost := l.lostAt(k); lost {
			t.Fatalf("%s is lost: it ended, kept its cache, or was never recorded", k)
		}
	}
	if err := l.start("g/e/1", 0); err != nil {
		t.Fatal(err)
	}
	l.close()
	// A third start reads the line appended after the torn one, and the
	// lost boot stays lost until its retention ends.
	l, err = openBootLog(path, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"g/a/1", "g/e/1"} {
		if _, lost := l.lostAt(k); !lost {
			t.Fatalf("%s should be lost", k)
		}
	}
	l.close()
	l, err = openBootLog(path, nil, now.Add(lostRetention+time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, lost := l.lostAt("g/a/1"); lost {
		t.Fatal("a lost boot outlived its retention")
	}
	l.close()
}

// TestBootLogGroupCommit: boots starting at once are all durable when
// start returns, and the log stays bounded by compaction.
func TestBootLogGroupCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "boots.log")
	l, err := openBootLog(path, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprintf("g/pc%d/1", i)
			if err := l.start(k, 0); err != nil {
				t.Error(err)
			}
			if i%2 == 0 {
				l.end(k)
			}
		}()
	}
	wg.Wait()
	// Not closed: what start returned for must be in the file already.
	r, err := openBootLog(path, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for i := range 200 {
		if _, lost := r.lostAt(fmt.Sprintf("g/pc%d/1", i)); lost {
			n++
		}
	}
	if n < 100 {
		t.Fatalf("%d of 200 started boots were durable", n)
	}
	r.close()
	l.close()
}

// TestBootLogRetentionFromLoss: a boot that ran for longer than the
// retention before it was lost is remembered from its loss, and an expiry
// keeps its reason across a restart.
func TestBootLogRetentionFromLoss(t *testing.T) {
	path := filepath.Join(t.TempDir(), "boots.log")
	now := time.Now()
	week := now.Add(-8 * 24 * time.Hour).UTC().Format(time.RFC3339Nano)
	lines := fmt.Sprintf("{\"op\":\"start\",\"key\":\"g/old/1\",\"time\":%q}\n{\"op\":\"start\",\"key\":\"g/idle/1\",\"time\":%q}\n", week, week)
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	// A shared store kept g/idle/1's cache; then its client did not come
	// back in time. g/old/1, eight days old, was lost at this start.
	l, err := openBootLog(path, func(k string) bool { return k == "g/idle/1" }, now)
	if err != nil {
		t.Fatal(err)
	}
	l.expire("g/idle/1", "no client reconnected within 2m0s")
	l.close()
	l, err = openBootLog(path, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, lost := l.lostAt("g/old/1"); !lost {
		t.Fatal("a boot that started over a week before it was lost is forgotten at once")
	}
	if r, lost := l.lostAt("g/idle/1"); !lost || r.Why != "no client reconnected within 2m0s" {
		t.Fatalf("the expired boot after a restart: %+v %v", r, lost)
	}
	l.close()
	// Six days on, both are still remembered; past the retention, neither.
	for _, c := range []struct {
		after time.Duration
		lost  bool
	}{{6 * 24 * time.Hour, true}, {lostRetention + time.Hour, false}} {
		l, err = openBootLog(path, nil, now.Add(c.after))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"g/old/1", "g/idle/1"} {
			if _, lost := l.lostAt(k); lost != c.lost {
				t.Fatalf("%s %s after its loss: lost %v, want %v", k, c.after, lost, c.lost)
			}
		}
		l.close()
	}
}
