package web

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSignOutsFileSurvivesItsFaults: the sign-outs file that a crash or
// a full or read-only disk left behind does not stop the portal's start
// and loses no sign-out it holds: a 70 KiB garbage line is skipped, a
// file that cannot be rewritten is read and appended to, and a line left
// unended does not swallow the next one.
func TestSignOutsFileSurvivesItsFaults(t *testing.T) {
	now := time.Now()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	path := filepath.Join(dir, signoutsFile)
	if err := os.WriteFile(path, []byte("abc 9999999999\n"+strings.Repeat("\x00", 70<<10)+"\nxyz 9999999999\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := loadRevocations(dir, now, log)
	if err != nil {
		t.Fatalf("a 70 KiB garbage line stops the portal's start: %v", err)
	}
	if !v.has(signIn{ID: "abc"}, now) || !v.has(signIn{ID: "xyz"}, now) {
		t.Fatal("the sign-outs around a garbage line are lost")
	}
	// A state directory the portal cannot write to (read-only mount, full
	// disk), with a line a crash left unended: as root, permissions do not
	// stop writes, so a directory stands in the temporary file's way.
	dir = t.TempDir()
	path = filepath.Join(dir, signoutsFile)
	if err := os.WriteFile(path, []byte("abc 9999999999\ndef 99"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path+".tmp", 0o700); err != nil {
		t.Fatal(err)
	}
	if v, err = loadRevocations(dir, now, log); err != nil {
		t.Fatalf("a state directory the portal cannot rewrite in stops its start: %v", err)
	}
	if !v.has(signIn{ID: "abc"}, now) {
		t.Fatal("a sign-out in a file that cannot be rewritten is lost")
	}
	if err := v.add(signIn{ID: "ghi"}, now.Add(time.Hour), now); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path + ".tmp"); err != nil {
		t.Fatal(err)
	}
	if v, err = loadRevocations(dir, now, log); err != nil {
		t.Fatal(err)
	}
	if !v.has(signIn{ID: "ghi"}, now) || !v.has(signIn{ID: "abc"}, now) {
		b, _ := os.ReadFile(path)
		t.Fatalf("a sign-out appended after an unended line is lost; the file read:\n%q", b)
	}
}
