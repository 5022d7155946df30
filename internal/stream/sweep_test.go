package stream

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
)

// TestAttachRacesTheSweeper: a client comes back to a boot whose server
// died, just as a sweeper discards the boot's idle cache. The sweep runs
// at the last moment before the server locks the cache (the interleaving
// the hook forces); a server that looked for the sweeper's mark before
// taking the lock would miss it and serve the boot an empty cache under
// its old name, its acknowledged writes gone without a word.
func TestAttachRacesTheSweeper(t *testing.T) {
	dir := t.TempDir()
	path, base := writeBase(t, dir, 3)
	const window = time.Minute
	cfg := &config.Config{StateDir: dir, Stream: &config.Stream{TLS: "off", Clients: "open", SharedCache: true,
		ReconnectWindow: config.Duration(window), VDisks: []config.VDisk{{Name: "golden", Base: path}}}}
	cfg.ApplyDefaults()
	s, err := New(cfg.Stream, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	// The boot's cache as its dead server left it: an acknowledged write,
	// idle for longer than the reconnect window.
	cache := filepath.Join(cfg.Stream.Store, "cache", "golden", "pc", "b1")
	c, err := openStoreCache(cache, bytes.NewReader(base), testSize, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteAt([]byte("acknowledged"), 0); err != nil {
		t.Fatal(err)
	}
	c.release()
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(cache, "lock"), old, old); err != nil {
		t.Fatal(err)
	}
	var swept bool
	var sweepErr error
	s.beforeCacheLock = func(d string) {
		if d == cache && !swept {
			swept, sweepErr = sweepStoreCache(d, window, time.Now())
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	raw, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	_, _, err = nbdclient.Handshake(raw, "golden/pc/b1", nbdclient.Options{})
	if !swept || sweepErr != nil {
		t.Fatalf("the sweeper did not discard the idle cache at the lock (swept %v): %v", swept, sweepErr)
	}
	var oe *nbdclient.OptionError
	if !errors.As(err, &oe) || oe.Type != nbd.RepErrPolicy || !strings.Contains(oe.Message, "lost its write cache") {
		t.Fatalf("a boot whose cache was swept as it was taken over: want a refusal saying it lost its write cache, got %v", err)
	}
	if _, err := os.Stat(filepath.Join(cache, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the swept cache's data file was made again: %v", err)
	}
}
