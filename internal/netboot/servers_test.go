package netboot

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
)

// TestBootGoesToLeastLoadedServer: two stream servers sharing a store
// report their clients; a device's boot script names the one with fewer
// first, counts the boots it handed out until they connect (a burst is
// spread), and lists a server whose report went stale (killed) last.
func TestBootGoesToLeastLoadedServer(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	a, b := "127.0.0.1:10809", "127.0.0.1:10810"
	st := &config.Stream{Listen: a, Store: dir, SharedCache: true, VDisks: []config.VDisk{{Name: "golden", Mode: "standard", Kernel: kernel, Initrd: kernel}},
		Netboot: &config.Netboot{Interface: "br0", Address: "127.0.0.1", HTTPPort: 8069, DHCP: "proxy", Servers: []string{a, b}}}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(st, Deps{Logger: log, StateDir: dir, StreamPort: "10809"})
	if err != nil {
		t.Fatal(err)
	}
	s.Devices().Add(Device{MAC: "52:54:00:77:00:01", Name: "pc1", VDisk: "golden", Enabled: true})
	report := func(addr string, clients int) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		tcp, _ := net.ResolveTCPAddr("tcp", addr)
		done := make(chan struct{})
		go func() { defer close(done); ReportLoad(ctx, log, dir, tcp, func() int { return clients }) }()
		return func() { cancel(); <-done }
	}
	waitReports := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); len(readReports(loadDir(dir))) != n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d load reports, want %d", len(readReports(loadDir(dir))), n)
			}
		}
	}
	servers := regexp.MustCompile(`deskway\.servers=(\S+)`)
	boot := func() string {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/netboot/device?mac=52:54:00:77:00:01", nil))
		m := servers.FindStringSubmatch(rec.Body.String())
		if m == nil {
			t.Fatalf("no server list in the script:\n%s", rec.Body.String())
		}
		return m[1]
	}
	stopA := report(a, 3)
	defer stopA()
	stopB := report(b, 1)
	waitReports(2)
	// B serves 1 client, A 3: B first, twice (1, then 1 + the boot just
	// handed to it); then 3 each, and the configured order decides.
	for i, want := range []string{b + "," + a, b + "," + a, a + "," + b} {
		if got := boot(); got != want {
			t.Fatalf("boot %d: servers %s, want %s", i+1, got, want)
		}
	}
	// B is killed: its report stays, and goes stale.
	stopB()
	waitReports(1)
	tcp, _ := net.ResolveTCPAddr("tcp", b)
	addrs, _ := listenAddresses(tcp)
	stale, _ := json.Marshal(loadReport{Addresses: addrs, Clients: 0, At: time.Now().Add(-loadStale)})
	os.WriteFile(filepath.Join(loadDir(dir), "killed.json"), stale, 0o600)
	if got := boot(); got != a+","+b {
		t.Fatalf("with B dead: servers %s, want A first, B kept last for failover", got)
	}
}
