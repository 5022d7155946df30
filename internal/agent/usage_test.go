package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
	"github.com/deskway/deskway/internal/config"
)

// fakeProc is a /proc tree for tests, laid out as xrdp 0.9 on Debian 12
// has it.
type fakeProc struct {
	t    *testing.T
	root string
}

// proc adds a process. ticks is its utime; its stime is utime/2. pssKB < 0
// leaves out smaps_rollup (a process that ended between the reads).
func (f fakeProc) proc(pid int, comm, cmdline string, ppid int, uid, state string, ticks uint64, pssKB int) {
	f.t.Helper()
	dir := filepath.Join(f.root, fmt.Sprint(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
	write("cmdline", cmdline)
	write("status", fmt.Sprintf("Name:\t%s\nState:\t%s\nPPid:\t%d\nUid:\t%s\t%s\t%s\t%s\n", comm, state, ppid, uid, uid, uid, uid))
	write("stat", fmt.Sprintf("%d (%s) %s %d %d %d 0 -1 4194560 100 0 3 0 %d %d 0 0 20 0 1 0 1000 100000 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
		pid, comm, state, ppid, pid, pid, ticks, ticks/2))
	if pssKB >= 0 {
		write("smaps_rollup", fmt.Sprintf("55d0a0000000-7ffc00000000 ---p 00000000 00:00 0 [rollup]\nRss:  %d kB\nPss:  %d kB\nPss_Anon:  1 kB\nPss_File:  2 kB\nSwapPss:  9 kB\n", 2*pssKB, pssKB))
	}
	exe := "/usr/bin/" + comm
	if comm == "xrdp-sesman" {
		exe = "/usr/sbin/xrdp-sesman"
	}
	if err := os.Symlink(exe, filepath.Join(dir, "exe")); err != nil {
		f.t.Fatal(err)
	}
}

// TestReadSessionUsageFromProc counts a session's processes by the
// process tree under its xrdp-sesman: the user's processes below it,
// however deep and whatever runs between, and nothing else.
func TestReadSessionUsageFromProc(t *testing.T) {
	f := fakeProc{t: t, root: t.TempDir()}
	const nobody, root = "65534", "0"
	f.proc(1, "init", "/sbin/init\x00", 0, root, "S", 500, 4000)
	f.proc(100, "xrdp-sesman", "xrdp-sesman\x00--nodaemon\x00", 1, root, "S", 40, 3000)
	// nobody's session on :10: the per-session sesman (root, not counted)
	// started the X server, the window manager and chansrv.
	f.proc(101, "xrdp-sesman", "xrdp-sesman\x00--nodaemon\x00", 100, root, "S", 10, 2000)
	f.proc(102, "Xorg", "/usr/lib/xorg/Xorg\x00:10\x00-auth\x00.Xauthority\x00", 101, nobody, "S", 300, 50000)
	f.proc(103, "xterm", "xterm\x00-e\x00sleep 3600\x00", 101, nobody, "S", 20, 6000)
	f.proc(104, "sleep", "sleep\x003600\x00", 103, nobody, "S", 2, 500)
	f.proc(105, "xrdp-chansrv", "/usr/sbin/xrdp-chansrv\x00", 101, nobody, "S", 8, 4000)
	// A root helper (sudo) inside the session is not the user's; what it
	// starts as the user is.
	f.proc(106, "sudo", "sudo\x00-u\x00nobody\x00top\x00", 104, root, "S", 4, 3000)
	f.proc(107, "top) (x", "top\x00", 106, nobody, "R", 60, 1500) // a name with ") (" in it
	f.proc(108, "defunct", "", 103, nobody, "Z", 999, 0)          // a zombie has ended
	f.proc(109, "gone", "gone\x00", 103, nobody, "S", 999, -1)    // ended before smaps_rollup was read
	f.proc(110, "bash", "bash\x00", 103, "1001", "S", 999, 999)   // another user's, inside the session
	// nobody's process outside any session is not the session's.
	f.proc(200, "cron-job", "job\x00", 1, nobody, "S", 999, 9999)
	// root's session on :11, whose per-session sesman is root too: the
	// session is what is below it, not the sesman itself.
	f.proc(301, "xrdp-sesman", "xrdp-sesman\x00--nodaemon\x00", 100, root, "S", 10, 2000)
	f.proc(302, "Xvnc", "Xvnc\x00:11\x00-geometry\x001024x768\x00", 301, root, "S", 100, 20000)
	f.proc(303, "xrdp-chansrv", "/usr/sbin/xrdp-chansrv\x00", 301, root, "S", 2, 3000)
	// A directory without a status (the process ended as it was listed).
	if err := os.MkdirAll(filepath.Join(f.root, "400"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(f.root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.root, "net", "unix"), []byte("Num RefCount Protocol Flags Type St Inode Path\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSessionUsage(f.root)
	if err != nil {
		t.Fatal(err)
	}
	// Ticks are utime + utime/2.
	want := []SessionUsage{
		{User: "nobody", Display: "10", PSSBytes: (50000 + 6000 + 500 + 4000 + 1500) << 10,
			CPUTicks: (300 + 150) + (20 + 10) + (2 + 1) + (8 + 4) + (60 + 30), Processes: 5},
		{User: "root", Display: "11", PSSBytes: (20000 + 3000) << 10, CPUTicks: (100 + 50) + (2 + 1), Processes: 2},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadSessionUsage =\n%+v\nwant\n%+v", got, want)
	}

	// No session: nothing, and no error.
	empty := fakeProc{t: t, root: t.TempDir()}
	empty.proc(1, "init", "/sbin/init\x00", 0, root, "S", 1, 1)
	if err := os.MkdirAll(filepath.Join(empty.root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(empty.root, "net", "unix"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadSessionUsage(empty.root); err != nil || len(got) != 0 {
		t.Fatalf("ReadSessionUsage without sessions = %+v, %v", got, err)
	}
	if _, err := ReadSessionUsage(filepath.Join(empty.root, "nosuch")); err == nil {
		t.Fatal("ReadSessionUsage of a missing /proc gave no error")
	}
}

func TestParsePss(t *testing.T) {
	if p := parsePss([]byte("Rss: 8 kB\nPss_Anon: 3 kB\nPss: 5 kB\nPss_File: 2 kB\n")); p != 5<<10 {
		t.Fatalf("parsePss = %d, want %d (the Pss line, not Pss_Anon)", p, 5<<10)
	}
	if p := parsePss(nil); p != 0 {
		t.Fatalf("parsePss of an empty rollup = %d", p)
	}
}

// TestReadCountersPageActivity reads the vmstat counters through
// ReadCounters and turns them into rates with Between.
func TestReadCountersPageActivity(t *testing.T) {
	root := t.TempDir()
	for name, body := range map[string]string{
		"stat":      "cpu  100 0 50 800 50 0 0 0 0 0\n",
		"meminfo":   "MemTotal: 1000 kB\nMemAvailable: 500 kB\n",
		"diskstats": "",
		"vmstat":    "nr_free_pages 100\npgmajfault 7000\npswpin 30\npswpout 4500\npgmajfault_extra 1\nworkingset_refault_anon 9\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c, err := ReadCounters(root)
	if err != nil {
		t.Fatal(err)
	}
	if c.MajorFaults != 7000 || c.SwapIn != 30 || c.SwapOut != 4500 {
		t.Fatalf("counters from vmstat = %d %d %d, want 7000 30 4500", c.MajorFaults, c.SwapIn, c.SwapOut)
	}
	if err := os.Remove(filepath.Join(root, "vmstat")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadCounters(root); err == nil {
		t.Fatal("ReadCounters without vmstat gave no error")
	}

	t0 := time.Unix(1000, 0)
	a := Counters{At: t0, MajorFaults: 100, SwapIn: 10, SwapOut: 0}
	b := Counters{At: t0.Add(4 * time.Second), MajorFaults: 300, SwapIn: 12, SwapOut: 40}
	l := Between(a, b)
	if !near(l.MajorFaultsPerSec, 50) || !near(l.SwapInPerSec, 0.5) || !near(l.SwapOutPerSec, 10) {
		t.Fatalf("Between = %+v, want 50 major faults, 0.5 in and 10 out per second", l)
	}
	// Over a few milliseconds a fault says nothing of a rate.
	short := b
	short.At = t0.Add(5 * time.Millisecond)
	if l := Between(a, short); l.MajorFaultsPerSec != 0 || l.SwapInPerSec != 0 || l.SwapOutPerSec != 0 {
		t.Fatalf("Between over 5 ms = %+v, want no rates", l)
	}
	// Counters that went back (a reboot between readings) give 0, not 2^64.
	if l := Between(b, Counters{At: t0.Add(8 * time.Second), MajorFaults: 5, SwapIn: 1, SwapOut: 1}); l.MajorFaultsPerSec != 0 || l.SwapOutPerSec != 0 {
		t.Fatalf("Between over a reset = %+v", l)
	}
}

func TestParseVmstat(t *testing.T) {
	mj, in, out := parseVmstat([]byte("pgfault 99999\npgmajfault 12\npswpin 3\npswpout 4\n"))
	if mj != 12 || in != 3 || out != 4 {
		t.Fatalf("parseVmstat = %d %d %d", mj, in, out)
	}
	// A kernel without swap support has no pswp lines.
	if mj, in, out := parseVmstat([]byte("pgmajfault 5\n")); mj != 5 || in != 0 || out != 0 {
		t.Fatalf("parseVmstat without swap = %d %d %d", mj, in, out)
	}
}

// TestCPUMeter turns cumulative ticks into shares of a core between
// heartbeats.
func TestCPUMeter(t *testing.T) {
	var m cpuMeter
	t0 := time.Unix(1000, 0)
	ss := []brokerapi.Session{{User: "ann", State: "active"}, {User: "bob", State: "disconnected"}, {User: "cy", State: "active"}}
	first := m.annotate(ss, []SessionUsage{
		{User: "ann", Display: "10", PSSBytes: 300 << 20, CPUTicks: 1000},
		{User: "bob", Display: "11", PSSBytes: 100 << 20, CPUTicks: 50},
	}, t0)
	want := []brokerapi.Session{{User: "ann", State: "active", MemoryBytes: 300 << 20}, {User: "bob", State: "disconnected", MemoryBytes: 100 << 20},
		{User: "cy", State: "active"}}
	if !reflect.DeepEqual(first, want) {
		t.Fatalf("first heartbeat = %+v, want %+v (no CPU yet)", first, want)
	}
	if ss[0].MemoryBytes != 0 {
		t.Fatal("annotate changed the caller's sessions")
	}
	// Two seconds later: ann used 150 ticks (0.75 of a core) and opened a
	// second session, which counts from the next heartbeat on; bob's
	// session was replaced by one with fewer ticks.
	second := m.annotate(ss, []SessionUsage{
		{User: "ann", Display: "10", PSSBytes: 310 << 20, CPUTicks: 1150},
		{User: "ann", Display: "12", PSSBytes: 50 << 20, CPUTicks: 400},
		{User: "bob", Display: "11", PSSBytes: 90 << 20, CPUTicks: 10},
	}, t0.Add(2*time.Second))
	if s := second[0]; s.MemoryBytes != 360<<20 || !near(s.CPU, 0.75) {
		t.Fatalf("ann's second heartbeat = %+v, want 360 MiB and 0.75 of a core", s)
	}
	if s := second[1]; s.MemoryBytes != 90<<20 || s.CPU != 0 {
		t.Fatalf("bob's second heartbeat = %+v, want 90 MiB and no CPU", s)
	}
	third := m.annotate(ss, []SessionUsage{
		{User: "ann", Display: "10", PSSBytes: 310 << 20, CPUTicks: 1250},
		{User: "ann", Display: "12", PSSBytes: 50 << 20, CPUTicks: 800},
		{User: "bob", Display: "11", PSSBytes: 90 << 20, CPUTicks: 10},
	}, t0.Add(6*time.Second))
	if s := third[0]; !near(s.CPU, 1.25) {
		t.Fatalf("ann's third heartbeat = %+v, want 1.25 cores (100 + 400 ticks over 4 s)", s)
	}
	// A failed reading reports nothing and starts over.
	if out := m.annotate(ss, nil, t0.Add(8*time.Second)); out[0].MemoryBytes != 0 || out[0].CPU != 0 {
		t.Fatalf("heartbeat without usage = %+v", out[0])
	}
	if out := m.annotate(ss, []SessionUsage{{User: "ann", Display: "10", PSSBytes: 1, CPUTicks: 9999}}, t0.Add(10*time.Second)); out[0].CPU != 0 {
		t.Fatalf("first heartbeat after a failed reading = %+v, want no CPU", out[0])
	}
	if out := m.annotate(nil, nil, t0); out == nil {
		t.Fatal("annotate of no sessions is nil, which a heartbeat would send as null")
	}
}

// TestHeartbeatCarriesUsage looks at the heartbeat on the wire: the
// host's page rates since the previous reading, and each session's
// memory and CPU; when reading usage fails, the heartbeat goes anyway
// with none.
func TestHeartbeatCarriesUsage(t *testing.T) {
	srv, got := heartbeatSink(t, 4)
	root := t.TempDir()
	for name, body := range map[string]string{
		"stat": "cpu  100 0 50 800 50 0 0 0 0 0\n", "meminfo": "MemTotal: 1000 kB\nMemAvailable: 500 kB\n", "diskstats": "",
		"vmstat": "pgmajfault 1400\npswpin 200\npswpout 600\n",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var usageErr error
	logs := &strings.Builder{}
	a, err := New(&config.Agent{Name: "h1"}, Deps{Logger: slog.New(slog.NewTextHandler(logs, nil)), Proc: root,
		Client: &brokerclient.Client{Base: srv.URL, HTTP: srv.Client()},
		Usage: func() ([]SessionUsage, error) {
			return []SessionUsage{{User: "ann", Display: "10", PSSBytes: 250 << 20, CPUTicks: 700, Processes: 3}}, usageErr
		}})
	if err != nil {
		t.Fatal(err)
	}
	a.cred = "credential"
	// The previous reading, two seconds ago: 1,000 major faults, 100 pages
	// in and none out since.
	w := newLoadWindow(Counters{At: time.Now().Add(-2 * time.Second), MajorFaults: 400, SwapIn: 100, SwapOut: 600})
	sessions := []brokerapi.Session{{User: "ann", State: "active"}}
	if err := a.heartbeat(context.Background(), w, sessions); err != nil {
		t.Fatal(err)
	}
	hb := <-got
	within := func(v any, want float64) bool { f, ok := v.(float64); return ok && f > want*0.9 && f <= want }
	if !within(hb["major_faults_per_s"], 500) || !within(hb["swap_in_per_s"], 50) || hb["swap_out_per_s"] != 0.0 {
		t.Fatalf("heartbeat's page rates: faults %v, in %v, out %v; want about 500, 50, 0", hb["major_faults_per_s"], hb["swap_in_per_s"], hb["swap_out_per_s"])
	}
	session := func(hb map[string]any) map[string]any {
		ss, _ := hb["sessions"].([]any)
		if len(ss) != 1 {
			t.Fatalf("heartbeat's sessions = %v, want ann's", hb["sessions"])
		}
		s, _ := ss[0].(map[string]any)
		return s
	}
	if s := session(hb); s["user"] != "ann" || s["memory_bytes"] != float64(250<<20) || s["cpu"] != 0.0 {
		t.Fatalf("heartbeat's session = %v, want ann's 250 MiB and no CPU yet", s)
	}
	usageErr = errors.New("permission denied")
	for range 2 {
		if err := a.heartbeat(context.Background(), w, sessions); err != nil {
			t.Fatal(err)
		}
		if s := session(<-got); s["user"] != "ann" || s["memory_bytes"] != 0.0 || s["cpu"] != 0.0 {
			t.Fatalf("heartbeat's session while usage fails = %v", s)
		}
	}
	if n := strings.Count(logs.String(), "permission denied"); n != 1 {
		t.Fatalf("the failure was logged %d times, want once:\n%s", n, logs)
	}
}

// heartbeatSink is a broker that takes up to n heartbeats and hands each
// to the test as decoded JSON.
func heartbeatSink(t *testing.T, n int) (*httptest.Server, <-chan map[string]any) {
	got := make(chan map[string]any, n)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var hb map[string]any
		if err := json.NewDecoder(r.Body).Decode(&hb); err != nil {
			t.Error(err)
		}
		got <- hb
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// TestProcStat reads a process whose command name holds spaces and
// parentheses, and refuses a stat cut short.
func TestProcStat(t *testing.T) {
	root := t.TempDir()
	write := func(pid, body string) {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "stat"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("42", "42 (a (b) c) S 1 42 42 0 -1 4194560 10 0 0 0 1234 567 0 0 20 0 1 0 99 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
	write("43", "43 (x) S 1 43 43 0 -1 0 0 0 0 0\n")
	st, err := procStat(root, 42)
	if err != nil || st.State != "S" || st.UTime+st.STime != 1801 || st.Starttime != 99 {
		t.Fatalf("procStat = %+v, %v", st, err)
	}
	if _, err := procStat(root, 43); err == nil || ignoreEnded(err) == nil {
		t.Errorf("a short stat read as %v, want an error that is not taken for an ended process", err)
	}
	if _, err := procStat(root, 44); ignoreEnded(err) != nil {
		t.Errorf("a process gone read as %v, want it taken for ended", err)
	}
}
