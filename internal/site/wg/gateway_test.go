package wg

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.yaml.in/yaml/v3"
)

// The gateway runs as this test binary started again inside the underlay
// namespace, so the whole process lives there, as `deskway site` does in
// its own: its UDP sockets open in the underlay without any thread
// tricks, and only the TUN creation enters the tenants' namespaces.
const gatewayEnv = "DESKWAY_WG_TEST_GATEWAY"

func TestMain(m *testing.M) {
	if dir := os.Getenv(gatewayEnv); dir != "" {
		os.Exit(runGateway(dir))
	}
	os.Exit(m.Run())
}

// gwSpec is what the test gives the gateway process: per tenant, its
// namespace and its WireGuard section, as the site core will hold them.
type gwSpec struct {
	Tenants []gwTenant `yaml:"tenants"`
}

type gwTenant struct {
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"`
	WireGuard Config `yaml:"wireguard"`
}

func readSpec(dir string) (gwSpec, error) {
	var s gwSpec
	b, err := os.ReadFile(dir + "/gateway.yaml")
	if err != nil {
		return s, err
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	return s, dec.Decode(&s)
}

// readKey resolves private_key the way the core's config does (file:).
func readKey(ref string) (PrivateKey, error) {
	path, ok := strings.CutPrefix(ref, "file:")
	if !ok {
		return PrivateKey{}, fmt.Errorf("the test gateway reads file: keys only")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return PrivateKey{}, err
	}
	return ParsePrivateKey(string(b))
}

// runGateway is the gateway process: it starts a Device per tenant,
// serves /metrics on a unix socket in dir, reloads on SIGHUP, closes the
// devices on SIGTERM and exits when stdin ends. It says "ready",
// "reloaded" and "closed" on stdout.
func runGateway(dir string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reg := prometheus.NewRegistry()
	ln, err := net.Listen("unix", dir+"/metrics.sock")
	if err != nil {
		log.Error("metrics listener", "err", err)
		return 1
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	spec, err := readSpec(dir)
	if err != nil {
		log.Error("spec", "err", err)
		return 1
	}
	devs := map[string]*Device{}
	defer func() {
		for _, d := range devs {
			_ = d.Close()
		}
	}()
	for _, tn := range spec.Tenants {
		key, err := readKey(tn.WireGuard.PrivateKey)
		if err == nil {
			var d *Device
			d, err = New(tn.WireGuard, key, Options{Tenant: tn.Name, Namespace: tn.Namespace, Logger: log, Registerer: reg})
			if err == nil {
				devs[tn.Name] = d
				err = d.Start(ctx)
			}
		}
		if err != nil {
			log.Error("start", "tenant", tn.Name, "err", err)
			return 1
		}
	}
	fmt.Println("ready")
	for {
		select {
		case <-ctx.Done():
			// The devices close on the context's end, as Start promises;
			// the test looks at the namespaces before the process exits
			// (which would remove the TUNs anyway) and then closes stdin.
			for _, d := range devs {
				_ = d.Close()
			}
			fmt.Println("closed")
			_, _ = io.Copy(io.Discard, os.Stdin)
			return 0
		case <-hup:
			spec, err := readSpec(dir)
			for _, tn := range spec.Tenants {
				if err != nil {
					break
				}
				var key PrivateKey
				if key, err = readKey(tn.WireGuard.PrivateKey); err == nil {
					err = devs[tn.Name].Reload(tn.WireGuard, key)
				}
			}
			if err != nil {
				fmt.Printf("reload failed: %v\n", err)
				continue
			}
			fmt.Println("reloaded")
		}
	}
}

// gateway is the test's handle on the gateway process.
type gateway struct {
	t     *testing.T
	dir   string
	lines chan string
	log   string
	cmd   *exec.Cmd
	// stop sends SIGTERM and waits for the devices to be closed (once);
	// the process exits at the test's end.
	stop func()
}

func writeSpec(t *testing.T, dir string, s gwSpec) {
	t.Helper()
	b, err := yaml.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dir+"/gateway.yaml", b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startGateway starts the gateway process in the underlay namespace and
// waits for its devices to be up.
func startGateway(t *testing.T, underlay string, s gwSpec) *gateway {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", underlay, exe, "-test.run=^$")
	g := &gateway{t: t, dir: t.TempDir(), lines: make(chan string, 16), cmd: cmd}
	g.log = g.dir + "/gateway.log"
	writeSpec(t, g.dir, s)
	logf, err := os.Create(g.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), gatewayEnv+"="+g.dir)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the gateway: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			g.lines <- sc.Text()
		}
		close(g.lines)
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	g.stop = sync.OnceFunc(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		g.expect("closed", 15*time.Second)
	})
	t.Cleanup(func() {
		g.stop()
		stdin.Close()
		select {
		case err := <-done:
			// A data race seen in the gateway process makes it exit 66.
			if err != nil {
				t.Errorf("the gateway process ended with %v", err)
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("the gateway process did not exit within 15s of its stdin's end")
			<-done
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(g.log)
			t.Logf("gateway log:\n%s", b)
		}
	})
	g.expect("ready", 30*time.Second)
	return g
}

func (g *gateway) expect(want string, within time.Duration) {
	g.t.Helper()
	select {
	case l, ok := <-g.lines:
		if !ok {
			g.t.Fatalf("the gateway process ended before saying %q", want)
		}
		if l != want {
			g.t.Fatalf("the gateway said %q, want %q", l, want)
		}
	case <-time.After(within):
		g.t.Fatalf("the gateway did not say %q within %s", want, within)
	}
}

// reload gives the running gateway a new spec.
func (g *gateway) reload(s gwSpec) {
	g.t.Helper()
	writeSpec(g.t, g.dir, s)
	if err := g.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		g.t.Fatal(err)
	}
	g.expect("reloaded", 30*time.Second)
}

// metrics scrapes the gateway's /metrics.
func (g *gateway) metrics() string {
	g.t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", g.dir+"/metrics.sock")
		},
	}}
	resp, err := c.Get("http://gateway/metrics")
	if err != nil {
		g.t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return string(b)
}
