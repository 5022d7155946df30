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
