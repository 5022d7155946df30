package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
)

// TestForgetLostSharedCache: with shared caches a fixed-name client's
// lost boot is its swept cache on the store. The refusal names the way
// back; forgetting removes that client's swept caches of the vDisk (at
// every stage) and no one else's, and the client's next connection
// starts a new boot.
func TestForgetLostSharedCache(t *testing.T) {
	dir := t.TempDir()
	path, base := writeBase(t, dir, 5)
	cfg := &config.Config{StateDir: dir, Stream: &config.Stream{TLS: "off", Clients: "open", SharedCache: true,
		ReconnectWindow: config.Duration(time.Minute), VDisks: []config.VDisk{{Name: "golden", Base: path}, {Name: "golden2", Base: path}}}}
	cfg.ApplyDefaults()
	s, err := New(cfg.Stream, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	// Caches a dead server left and a sweeper discarded.
	swept := func(disk, client, id string) string {
		d := filepath.Join(cfg.Stream.Store, "cache", disk, client, id)
		c, err := openStoreCache(d, bytes.NewReader(base), testSize, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.release()
		old := time.Now().Add(-time.Hour)
		_ = os.Chtimes(filepath.Join(d, "lock"), old, old)
		if ok, err := sweepStoreCache(d, time.Minute, time.Now()); !ok || err != nil {
			t.Fatalf("sweep %s: %v %v", d, ok, err)
		}
		return d
	}
	mine := []string{swept("golden", "pc7", "-"), swept("golden@test", "pc7", "b2")}
	others := []string{swept("golden", "pc8", "-"), swept("golden2", "pc7", "-")}

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
	connect := func() error {
		raw, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		_, _, err = nbdclient.Handshake(raw, "golden/pc7", nbdclient.Options{})
		return err
	}
	var oe *nbdclient.OptionError
	if err := connect(); !errors.As(err, &oe) || oe.Type != nbd.RepErrPolicy || !strings.Contains(oe.Message, "deskway stream forget-lost golden pc7") {
		t.Fatalf("a fixed-name client's swept boot: want a refusal naming forget-lost, got %v", err)
	}

	rec := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodDelete, "/api/v1/stream/vdisks/golden/clients/pc7/lost", nil))
	var out struct{ Forgotten []string }
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
		t.Fatalf("forget: %d %s", rec.Code, rec.Body)
	}
	if want := []string{"golden/pc7/", "golden@test/pc7/b2"}; !slices.Equal(out.Forgotten, want) {
		t.Fatalf("forgotten %v, want %v", out.Forgotten, want)
	}
	for _, d := range mine {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s is still on the store: %v", d, err)
		}
	}
	for _, d := range others {
		if _, ok := sweptAt(d); !ok {
			t.Fatalf("another client's or vDisk's lost boot %s was forgotten too", d)
		}
	}
	if err := connect(); err != nil {
		t.Fatalf("after forget-lost the client's new boot: %v", err)
	}
}
