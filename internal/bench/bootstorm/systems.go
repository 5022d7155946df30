package bootstorm

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
)

// server is one NBD server under test, started for one step.
type server struct {
	addr string
	pid  int
	// export names client i's boot (or a reader's view).
	export func(i int, writable bool) string
	// cacheBytes reports the server's write-cache RAM when it exports
	// that figure (deskway), so memory per client can leave it out.
	cacheBytes func() int64
	stop       func()
}

// system is deskway or a peer.
type system struct {
	name string
	// note says how the peer keeps client writes.
	note  string
	start func(dir, base string) (*server, error)
}

// startCmd runs argv in its own process group and stops the group.
func startCmd(addr string, argv ...string) (*server, error) {
	p, err := childproc.Start(nil, argv[0], argv[1:]...)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	s := &server{addr: addr, pid: p.Pid(), stop: func() { p.StopWithin(10 * time.Second) }}
	if err := loopback.WaitPort(addr, 15*time.Second); err != nil {
		s.stop()
		return nil, fmt.Errorf("%w\n%s", err, p.Output())
	}
	return s, nil
}

const deskwayYAML = `state_dir: %[1]s
log: {level: warn, format: json}
admin: {listen: "127.0.0.1:%[2]d", tokens: [bench-admin]}
stream:
  listen: "127.0.0.1:%[3]d"
  tls: "off"
  clients: open
  store: %[1]s/store
  max_inflight: 32
  max_boots: 1000000          # storms of 1,000 clients, boots of earlier storms still in their window
  max_boots_per_client: 1000
  max_cache_mb_per_client: 262144 # every boot of a storm may share one client name
  max_unauthenticated: 100000     # every client of a storm negotiates at once, from one address
  max_unauthenticated_per_address: 100000
  vdisks:
  - {name: golden, base: %[4]s}
`

func deskway(exe string) system {
	return system{name: "deskway", note: "per-client write cache (RAM, then a sparse file), discarded at the end of each boot",
		start: func(dir, base string) (*server, error) {
			port, err := loopback.FreePort()
			if err != nil {
				return nil, err
			}
			admin, err := loopback.FreePort()
			if err != nil {
				return nil, err
			}
			cfg := filepath.Join(dir, "deskway.yaml")
			if err := os.WriteFile(cfg, []byte(fmt.Sprintf(deskwayYAML, dir, admin, port, base)), 0o600); err != nil {
				return nil, err
			}
			s, err := startCmd(fmt.Sprintf("127.0.0.1:%d", port), exe, "stream", "-c", cfg)
			if err != nil {
				return nil, err
			}
			s.export = func(i int, writable bool) string {
				if !writable {
					return "golden"
				}
				return fmt.Sprintf("golden/client%d/boot1", i)
			}
			metrics := fmt.Sprintf("https://127.0.0.1:%d/metrics", admin)
			s.cacheBytes = func() int64 { return scrapeGauge(metrics, "deskway_stream_cache_ram_bytes") }
			return s, nil
		}}
}

// insecureTransport reads deskway's admin listener, whose certificate is
// the self-signed one it made on start.
var insecureTransport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}

// scrapeGauge reads one unlabelled gauge from a Prometheus endpoint.
func scrapeGauge(url, name string) int64 {
	c := &http.Client{Timeout: 2 * time.Second, Transport: insecureTransport}
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return int64(v)
		}
	}
	return 0
}

const nbdServerCfg = `[generic]
    port = %[1]d
    listenaddr = 127.0.0.1
    allowlist = true
    maxconnections = 5000
[golden]
    exportname = %[2]s
    copyonwrite = true
`

// nbdServer is nbd-server with copyonwrite: a process and a diff file per
// client connection, the only stock server with per-client write caches.
func nbdServer() (system, error) {
	if _, err := exec.LookPath("nbd-server"); err != nil {
		return system{name: "nbd-server-cow"}, errors.New("nbd-server is not installed (apt-get install nbd-server)")
	}
	return system{name: "nbd-server-cow", note: "copyonwrite: a forked process and a diff file per connection",
		start: func(dir, base string) (*server, error) {
			port, err := loopback.FreePort()
			if err != nil {
				return nil, err
			}
			cfg := filepath.Join(dir, "nbd-server.conf")
			if err := os.WriteFile(cfg, []byte(fmt.Sprintf(nbdServerCfg, port, base)), 0o600); err != nil {
				return nil, err
			}
			// nbd-server serves one client only in the foreground (-d), so
			// it runs as the daemon it is and is found by its pid file.
			pidFile := filepath.Join(dir, "nbd-server.pid")
			out, err := exec.Command("nbd-server", "-C", cfg, "-p", pidFile).CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("bench: nbd-server: %v\n%s", err, out)
			}
			addr := fmt.Sprintf("127.0.0.1:%d", port)
			if err := loopback.WaitPort(addr, 15*time.Second); err != nil {
				return nil, err
			}
			raw, _ := os.ReadFile(pidFile)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
			if pid <= 0 {
				return nil, fmt.Errorf("bench: nbd-server wrote no pid to %s", pidFile)
			}
			return &server{addr: addr, pid: pid,
				export: func(int, bool) string { return "golden" },
				stop: func() {
					_ = syscall.Kill(pid, syscall.SIGTERM)
					for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
						time.Sleep(50 * time.Millisecond)
					}
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}}, nil
		}}, nil
}

// nbdkitCow is nbdkit's file plugin under the cow filter: one overlay
// shared by every client (it has no per-client overlay).
func nbdkitCow() (system, error) {
	if _, err := exec.LookPath("nbdkit"); err != nil {
		return system{name: "nbdkit-cow"}, errors.New("nbdkit is not installed (apt-get install nbdkit)")
	}
	return system{name: "nbdkit-cow", note: "cow filter: one overlay shared by all clients",
		start: func(dir, base string) (*server, error) {
			port, err := loopback.FreePort()
			if err != nil {
				return nil, err
			}
			s, err := startCmd(fmt.Sprintf("127.0.0.1:%d", port), "nbdkit", "-f", "-i", "127.0.0.1", "-p", strconv.Itoa(port),
				"--filter=cow", "file", base)
			if err != nil {
				return nil, err
			}
			s.export = func(int, bool) string { return "" }
			return s, nil
		}}, nil
}

// qemuNBD is qemu-nbd in snapshot mode: one temporary overlay shared by
// every client.
func qemuNBD() (system, error) {
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		return system{name: "qemu-nbd"}, errors.New("qemu-nbd is not installed (apt-get install qemu-utils)")
	}
	return system{name: "qemu-nbd", note: "--snapshot: one temporary overlay shared by all clients",
		start: func(dir, base string) (*server, error) {
			port, err := loopback.FreePort()
			if err != nil {
				return nil, err
			}
			s, err := startCmd(fmt.Sprintf("127.0.0.1:%d", port), "qemu-nbd", "-f", "raw", "-b", "127.0.0.1", "-p", strconv.Itoa(port),
				"-x", "golden", "--snapshot", "--persistent", "--shared=0", "--cache=writeback", "--aio=threads", base)
			if err != nil {
				return nil, err
			}
			s.export = func(int, bool) string { return "golden" }
			return s, nil
		}}, nil
}

// floorName is the reference that keeps nothing; it is not a peer.
const floorName = "floor"

// floor is deskway's own NBD responder that stores nothing and answers
// every request at once (internal/bench/nbdfloor): the least any server
// can cost here, so what is slow against it is the machine's limit.
func floor(exe string) system {
	return system{name: floorName, note: "reference, not a server: reads sendfile'd from the base, writes dropped unstored",
		start: func(dir, base string) (*server, error) {
			port, err := loopback.FreePort()
			if err != nil {
				return nil, err
			}
			s, err := startCmd(fmt.Sprintf("127.0.0.1:%d", port), exe, "bench", "nbd-floor",
				"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--file", base)
			if err != nil {
				return nil, err
			}
			s.export = func(int, bool) string { return "golden" }
			return s, nil
		}}
}
