package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
)

// PSI files as Linux 5.13 and later write them: a "full" line follows
// "some" (always 0 for the whole machine's CPU).
const (
	cpuPSI    = "some avg10=42.50 avg60=30.12 avg300=12.00 total=123456789\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
	memoryPSI = "some avg10=3.00 avg60=1.00 avg300=0.50 total=5000\nfull avg10=1.00 avg60=0.50 avg300=0.10 total=2000\n"
)

// fakePressureProc writes a /proc under a temporary root with what
// ReadCounters needs, and pressure/cpu and pressure/memory when given.
func fakePressureProc(t *testing.T, cpu, memory string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"stat": "cpu  100 0 50 800 50 0 0 0 0 0\n", "meminfo": "MemTotal: 1000 kB\nMemAvailable: 500 kB\n",
		"diskstats": "", "vmstat": "pgmajfault 0\n",
	}
	if cpu != "" {
		files["pressure/cpu"] = cpu
	}
	if memory != "" {
		files["pressure/memory"] = memory
	}
	for name, body := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestReadCountersCPUPressure reads /proc/pressure/cpu's "some avg10"
// beside memory's, each from its own file, and turns it into a fraction;
// a kernel without PSI (no /proc/pressure) reads 0 and no error.
func TestReadCountersCPUPressure(t *testing.T) {
	c, err := ReadCounters(fakePressureProc(t, cpuPSI, memoryPSI))
	if err != nil {
		t.Fatal(err)
	}
	if c.CPUSome10 != 42.5 || c.MemSome10 != 3 {
		t.Fatalf("counters: cpu some avg10 %g, memory some avg10 %g; want 42.5 and 3", c.CPUSome10, c.MemSome10)
	}
	l := Between(Counters{At: c.At.Add(-2 * time.Second)}, c)
	if !near(l.CPUPressure, 0.425) || !near(l.MemoryPressure, 0.03) {
		t.Fatalf("Between: cpu pressure %g, memory pressure %g; want 0.425 and 0.03", l.CPUPressure, l.MemoryPressure)
	}
	// Kernels before 5.13 write the "some" line alone for the CPU.
	if c, err := ReadCounters(fakePressureProc(t, "some avg10=7.25 avg60=1.00 avg300=0.00 total=99\n", memoryPSI)); err != nil || c.CPUSome10 != 7.25 {
		t.Fatalf("cpu pressure with the some line alone = %g, %v; want 7.25", c.CPUSome10, err)
	}
	c, err = ReadCounters(fakePressureProc(t, "", ""))
	if err != nil {
		t.Fatalf("ReadCounters on a kernel without PSI: %v", err)
	}
	if l := Between(Counters{At: c.At.Add(-2 * time.Second)}, c); c.CPUSome10 != 0 || l.CPUPressure != 0 {
		t.Fatalf("cpu pressure without PSI = %g (load %g), want 0", c.CPUSome10, l.CPUPressure)
	}
}

// TestHeartbeatCarriesCPUPressure looks at heartbeats on the wire: each
// carries cpu_pressure as a fraction, read afresh from /proc for that
// heartbeat.
func TestHeartbeatCarriesCPUPressure(t *testing.T) {
	srv, got := heartbeatSink(t, 2)
	root := fakePressureProc(t, cpuPSI, memoryPSI)
	a, err := New(&config.Agent{Name: "h1"}, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Proc: root,
		Client: &brokerclient.Client{Base: srv.URL, HTTP: srv.Client()}})
	if err != nil {
		t.Fatal(err)
	}
	a.cred = "credential"
	w := newLoadWindow(Counters{At: time.Now().Add(-2 * time.Second)})
	if err := a.heartbeat(context.Background(), w, []brokerapi.Session{}); err != nil {
		t.Fatal(err)
	}
	fraction := func(v any, want float64) bool { f, ok := v.(float64); return ok && near(f, want) }
	if hb := <-got; !fraction(hb["cpu_pressure"], 0.425) || !fraction(hb["memory_pressure"], 0.03) {
		t.Fatalf("heartbeat: cpu_pressure %v, memory_pressure %v; want 0.425 and 0.03", hb["cpu_pressure"], hb["memory_pressure"])
	}
	// The waiting stopped: the next heartbeat says so.
	if err := os.WriteFile(filepath.Join(root, "pressure", "cpu"), []byte("some avg10=0.00 avg60=20.00 avg300=10.00 total=123456999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.heartbeat(context.Background(), w, []brokerapi.Session{}); err != nil {
		t.Fatal(err)
	}
	if hb := <-got; !fraction(hb["cpu_pressure"], 0) {
		t.Fatalf("heartbeat after the pressure fell: cpu_pressure %v, want 0", hb["cpu_pressure"])
	}
}

// TestLoadWindow: with heartbeats every second, the disk's load is read
// over the last ten seconds or more, so one second of writeback (300
// requests of 35 ms) does not read as a slow disk, while a disk slow for
// the whole window still does; until the agent has run that long, the
// load runs from its first reading.
func TestLoadWindow(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(sec int, ios, ioms uint64) Counters {
		return Counters{At: t0.Add(time.Duration(sec) * time.Second), Disks: map[string]DiskCounters{"vda": {IOs: ios, IOms: ioms, BusyMS: ioms / 10}}}
	}
	w := newLoadWindow(at(0, 0, 0))
	var ios, ioms uint64
	var l Load
	for sec := 1; sec <= 20; sec++ {
		per, ms := uint64(100), uint64(1) // 100 requests a second at 1 ms
		if sec == 15 {
			per, ms = 300, 35
		}
		ios, ioms = ios+per, ioms+per*ms
		l = w.add(at(sec, ios, ioms))
		if sec == 5 && !near(l.DiskLatencyMS, 1) {
			t.Fatalf("at 5 s, from the first reading: latency %v ms, want 1", l.DiskLatencyMS)
		}
		if sec == 15 && l.DiskLatencyMS >= 25 {
			t.Fatalf("one second of 35 ms requests read as %.1f ms over the window: want it averaged with the ten before", l.DiskLatencyMS)
		}
	}
	if len(w.samples) > 12 {
		t.Fatalf("%d readings kept for a 10 s window of 1 s heartbeats", len(w.samples))
	}
	// Slow for the whole window: unhealthy it is.
	for sec := 21; sec <= 32; sec++ {
		ios, ioms = ios+100, ioms+100*40
		l = w.add(at(sec, ios, ioms))
	}
	if !near(l.DiskLatencyMS, 40) {
		t.Fatalf("a disk at 40 ms for 12 s read as %.1f ms", l.DiskLatencyMS)
	}
}
