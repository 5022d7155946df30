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

// TestVersions walks a vDisk through maintenance, test, production and a
// merge, with boots running all along: each boot keeps the version it
// started on, new boots get the version of their stage.
func TestVersions(t *testing.T) {
	dir := t.TempDir()
	base := bytes.Repeat([]byte{'b'}, 1<<20)
	basePath := filepath.Join(dir, "base.img")
	os.WriteFile(basePath, base, 0o400)
	cfg := &config.Config{StateDir: dir, Stream: &config.Stream{TLS: "off", Clients: "open", ReconnectWindow: config.Duration(time.Minute),
		VDisks: []config.VDisk{{Name: "golden", Base: basePath}}}}
	cfg.ApplyDefaults()
	start := func() (*Server, string, func()) {
		s, err := New(cfg.Stream, Deps{})
		if err != nil {
			t.Fatal(err)
		}
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { s.Serve(ctx, ln); close(done) }()
		return s, ln.Addr().String(), func() { cancel(); <-done }
	}
	s, addr, stop := start()
	vd := s.byName["golden"]
	ctx := context.Background()
	dial := func(export string) *nbdclient.Client {
		t.Helper()
		c, err := nbdclient.Dial(ctx, addr, export, nbdclient.Options{Structured: true})
		if err != nil {
			t.Fatalf("%s: %v", export, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// block reads the first byte of block i.
	block := func(c *nbdclient.Client, i int) byte {
		t.Helper()
		b := make([]byte, 4096)
		if _, err := c.ReadAt(b, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
		return b[0]
	}
	early := dial("golden/early/b1")

	v1, err := vd.createVersion("install an update")
	if err != nil || v1.Version != 1 || v1.Stage != StageMaintenance {
		t.Fatalf("create: %+v %v", v1, err)
	}
	if _, err := vd.createVersion("second"); !errors.Is(err, errVersion) {
		t.Fatalf("second maintenance version: %v", err)
	}
	m := dial("golden@maintenance/admin")
	if err := m.WriteAt(bytes.Repeat([]byte{'M'}, 4096), 0, true); err != nil {
		t.Fatal(err)
	}
	_, err = nbdclient.Dial(ctx, addr, "golden@maintenance/other", nbdclient.Options{})
	if oe := (*nbdclient.OptionError)(nil); !errors.As(err, &oe) || oe.Type != nbd.RepErrPolicy || !strings.Contains(oe.Message, "open for maintenance by another client") {
		t.Fatalf("a second maintenance writer: %v, want refused as one writer at a time", err)
	}
	if _, err := vd.promote(1); !errors.Is(err, errVersion) {
		t.Fatalf("promote with a writer connected: %v", err)
	}
	if got := block(dial("golden@test/t1/b1"), 0); got != 'b' {
		t.Fatalf("test client sees %q before promotion", got)
	}
	m.Close()
	// The server lets go of the writer lock once it has seen the client leave.
	promote := func(n int) (Version, error) {
		deadline := time.Now().Add(5 * time.Second)
		for {
			v, err := vd.promote(n)
			if err == nil || time.Now().After(deadline) || !bytes.Contains([]byte(err.Error()), []byte("open for maintenance")) {
				return v, err
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if v, err := promote(1); err != nil || v.Stage != StageTest {
		t.Fatalf("promote to test: %+v %v", v, err)
	}
	if got := block(dial("golden@test/t2/b1"), 0); got != 'M' {
		t.Fatalf("new test boot sees %q", got)
	}
	if got := block(dial("golden/p1/b1"), 0); got != 'b' {
		t.Fatalf("production boot sees the test version: %q", got)
	}
	if v, err := vd.promote(1); err != nil || v.Stage != StageProduction {
		t.Fatalf("promote to production: %+v %v", v, err)
	}
	if got := block(dial("golden/p2/b1"), 0); got != 'M' {
		t.Fatalf("new production boot sees %q", got)
	}
	if got := block(early, 0); got != 'b' {
		t.Fatalf("a boot running since before the update sees %q: updates must not change running clients", got)
	}

	// A second version on top, then a merge into a new base.
	if _, err := vd.createVersion(""); err != nil {
		t.Fatal(err)
	}
	m2 := dial("golden@maintenance/admin")
	m2.WriteAt(bytes.Repeat([]byte{'N'}, 4096), 4096, true)
	m2.Close()
	if _, err := promote(2); err != nil {
		t.Fatal(err)
	}
	if _, err := promote(2); err != nil {
		t.Fatal(err)
	}
	c := dial("golden/p3/b1")
	if block(c, 0) != 'M' || block(c, 1) != 'N' || block(c, 2) != 'b' {
		t.Fatal("version 2 does not show both deltas over the base")
	}
	v3, err := vd.merge()
	if err != nil || v3.MergedBase == "" || v3.Stage != StageProduction {
		t.Fatalf("merge: %+v %v", v3, err)
	}
	c = dial("golden/p4/b1")
	if block(c, 0) != 'M' || block(c, 1) != 'N' || block(c, 2) != 'b' {
		t.Fatal("the merged base differs from version 2")
	}
	if got := block(dial("golden@v1"), 1); got != 'b' {
		t.Fatalf("version 1 read-only view sees %q at block 1", got)
	}
	if now, _ := os.ReadFile(basePath); !bytes.Equal(now, base) {
		t.Fatal("the configured base image changed")
	}
	stop()

	// Another server on the same store (a restart, or the second node)
	// reads the chain from versions.json.
	s2, addr2, stop2 := start()
	defer stop2()
	addr = addr2
	c = dial("golden/p5/b1")
	if block(c, 0) != 'M' || block(c, 1) != 'N' {
		t.Fatal("a new server does not boot the merged production version")
	}
	vs, err := s2.byName["golden"].versionList()
	if err != nil || len(vs) != 4 {
		t.Fatalf("versions: %+v %v", vs, err)
	}
}

// TestPrivateFromProduction: a private-mode client's new image starts
// from the newest production version, edited through maintenance.
func TestPrivateFromProduction(t *testing.T) {
	dir := t.TempDir()
	basePath := filepath.Join(dir, "base.img")
	os.WriteFile(basePath, bytes.Repeat([]byte{'b'}, 1<<20), 0o400)
	cfg := &config.Config{StateDir: dir, Stream: &config.Stream{TLS: "off", Clients: "open", ReconnectWindow: config.Duration(time.Minute),
		VDisks: []config.VDisk{{Name: "desk", Base: basePath, Mode: "private", Clients: []string{"alice"}}}}}
	cfg.ApplyDefaults()
	s, err := New(cfg.Stream, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Serve(ctx, ln)
	vd := s.byName["desk"]
	if _, err := vd.createVersion(""); err != nil {
		t.Fatal(err)
	}
	m, err := nbdclient.Dial(ctx, ln.Addr().String(), "desk@maintenance/admin", nbdclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m.WriteAt(bytes.Repeat([]byte{'P'}, 4096), 0, true)
	m.Close()
	for i := 0; i < 2; i++ {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := vd.promote(1); err == nil || time.Now().After(deadline) {
				break
			}
		}
	}
	c, err := nbdclient.Dial(ctx, ln.Addr().String(), "desk/alice", nbdclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, 8192)
	c.ReadAt(b, 0)
	if b[0] != 'P' || b[4096] != 'b' {
		t.Fatalf("new private image starts with %q…%q, want the production version", b[0], b[4096])
	}
	_, err = nbdclient.Dial(ctx, ln.Addr().String(), "desk@test/alice", nbdclient.Options{})
	if oe := (*nbdclient.OptionError)(nil); !errors.As(err, &oe) || oe.Type != nbd.RepErrUnknown || !strings.Contains(oe.Message, "is in private mode") {
		t.Fatalf("a stage of a private vDisk: %v, want refused as private mode", err)
	}
}
