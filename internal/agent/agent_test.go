package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

func TestParseCountersAndLoad(t *testing.T) {
	busy, total, err := parseStat([]byte("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n"))
	if err != nil || busy != 150 || total != 1000 {
		t.Fatalf("parseStat = %d %d %v", busy, total, err)
	}
	if _, _, err := parseStat([]byte("intr 1 2 3\n")); err == nil {
		t.Fatal("a /proc/stat without the cpu line parsed")
	}
	memT, memA := parseMeminfo([]byte("MemTotal:       1000 kB\nMemFree:  10 kB\nMemAvailable:    250 kB\n"))
	if memT != 1000<<10 || memA != 250<<10 {
		t.Fatalf("parseMeminfo = %d %d", memT, memA)
	}
	disks := parseDiskstats([]byte(
		"   8       0 sda 100 0 800 200 50 0 400 300 0 500 500 0 0 0 0\n"+
			"   8       1 sda1 1 0 8 2 0 0 0 0 0 5 5 0 0 0 0\n"+
			"   7       0 loop0 9 0 9 9 9 0 9 9 0 9 9 0 0 0 0\n"), func(n string) bool { return n == "sda" })
	if len(disks) != 1 || disks["sda"] != (DiskCounters{IOs: 150, IOms: 500, BusyMS: 500}) {
		t.Fatalf("parseDiskstats = %+v", disks)
	}
	if p := parsePSI([]byte("some avg10=12.50 avg60=1.00 avg300=0.00 total=1\nfull avg10=3.00 avg60=0 avg300=0 total=0\n")); p != 12.5 {
		t.Fatalf("parsePSI = %v", p)
	}
	t0 := time.Unix(1000, 0)
	a := Counters{At: t0, CPUBusy: 100, CPUTotal: 1000, Disks: map[string]DiskCounters{"sda": {IOs: 100, IOms: 1000, BusyMS: 10000}}}
	b := Counters{At: t0.Add(2 * time.Second), CPUBusy: 400, CPUTotal: 2000, MemTotal: 100, MemAvail: 25, MemSome10: 30,
		Disks: map[string]DiskCounters{"sda": {IOs: 120, IOms: 1820, BusyMS: 11200}}}
	l := Between(a, b)
	// 300 of 1000 jiffies busy; 1,200 of 2,000 ms busy; 820 ms over 20 requests.
	want := Load{CPU: 0.3, Memory: 0.75, DiskIdle: 0.4, DiskLatencyMS: 41, MemoryPressure: 0.3}
	if !near(l.CPU, want.CPU) || !near(l.Memory, want.Memory) || !near(l.DiskIdle, want.DiskIdle) ||
		!near(l.DiskLatencyMS, want.DiskLatencyMS) || !near(l.MemoryPressure, want.MemoryPressure) {
		t.Fatalf("Between = %+v, want %+v", l, want)
	}
	// A window of a few milliseconds (the heartbeat right after
	// registering) with a request in flight says nothing of the disk.
	c := Counters{At: t0.Add(5 * time.Millisecond), CPUBusy: 100, CPUTotal: 1000, Disks: map[string]DiskCounters{"sda": {IOs: 101, IOms: 1005, BusyMS: 10005}}}
	if l := Between(a, c); l.DiskIdle != 1 || l.DiskLatencyMS != 0 {
		t.Fatalf("Between over 5 ms of a busy disk = %+v, want the disk unjudged (idle 1)", l)
	}
}

func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

func TestReadCountersFromThisMachine(t *testing.T) {
	a, err := ReadCounters("/proc")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	b, err := ReadCounters("/proc")
	if err != nil {
		t.Fatal(err)
	}
	l := Between(a, b)
	if a.CPUTotal == 0 || a.MemTotal == 0 || l.Memory <= 0 || l.Memory >= 1 || l.DiskIdle < 0 || l.DiskIdle > 1 {
		t.Fatalf("counters %+v, load %+v", a, l)
	}
}

func TestDiff(t *testing.T) {
	prev := []brokerapi.Session{{User: "a", State: "active"}, {User: "b", State: "active"}, {User: "c", State: "disconnected"}}
	cur := []brokerapi.Session{{User: "b", State: "disconnected"}, {User: "c", State: "active"}, {User: "d", State: "active"}}
	got := Diff(prev, cur)
	want := []brokerapi.Event{{User: "b", State: "disconnected"}, {User: "c", State: "active"}, {User: "d", State: "active"}, {User: "a", State: "ended"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Diff = %+v, want %+v", got, want)
	}
	if ev := Diff(cur, cur); len(ev) != 0 {
		t.Fatalf("Diff of equal lists = %+v", ev)
	}
}

// TestXRDPSessionsFromProc lays out the /proc entries an xrdp host has (as
// seen under xrdp 0.9 on Debian 12) and reads them back.
func TestXRDPSessionsFromProc(t *testing.T) {
	root := t.TempDir()
	proc := func(pid, comm, cmdline, ppid, uid string) {
		dir := filepath.Join(root, pid)
		_ = os.MkdirAll(dir, 0o755)
		_ = os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "status"), []byte("Name:\t"+comm+"\nPPid:\t"+ppid+"\nUid:\t"+uid+"\t"+uid+"\t"+uid+"\t"+uid+"\n"), 0o644)
		exe := "/usr/bin/" + comm
		if comm == "xrdp-sesman" {
			exe = "/usr/sbin/xrdp-sesman"
		}
		_ = os.Symlink(exe, filepath.Join(dir, "exe"))
	}
	proc("100", "xrdp-sesman", "xrdp-sesman\x00--nodaemon\x00", "1", "0")
	proc("101", "xrdp-sesman", "xrdp-sesman\x00--nodaemon\x00", "100", "0")
	proc("102", "Xorg", "/usr/lib/xorg/Xorg\x00:11\x00-auth\x00.Xauthority\x00", "101", "0")
	proc("201", "xrdp-sesman", "xrdp-sesman\x00--nodaemon\x00", "100", "0")
	proc("202", "Xorg", "/usr/lib/xorg/Xorg\x00:12\x00-auth\x00.Xauthority\x00", "201", "65534")
	proc("300", "Xorg", "/usr/lib/xorg/Xorg\x00:0\x00", "1", "0") // a console X server: not a session
	// A user's decoy: a script named xrdp-sesman starting a program named
	// Xorg. Neither the parent's executable nor its owner is xrdp-sesman's.
	proc("400", "xrdp-sesman", "/bin/bash\x00./xrdp-sesman\x00", "1", "65534")
	_ = os.Remove(filepath.Join(root, "400", "exe"))
	_ = os.Symlink("/usr/bin/bash", filepath.Join(root, "400", "exe"))
	proc("401", "Xorg", "Xorg\x00:77\x00", "400", "65534")
	proc("500", "xrdp-sesman", "xrdp-sesman\x00", "1", "65534") // the real program, run by a user
	proc("501", "Xorg", "Xorg\x00:78\x00", "500", "65534")
	_ = os.MkdirAll(filepath.Join(root, "net"), 0o755)
	unix := "Num       RefCount Protocol Flags    Type St Inode Path\n" +
		"00000000d1f94aff: 00000002 00000000 00010000 0001 01 52396 /run/xrdp/sockdir/xrdp_display_11\n" +
		"00000000e59d10be: 00000003 00000000 00000000 0001 03 52405 /run/xrdp/sockdir/xrdp_display_11\n" +
		"000000001642051a: 00000002 00000000 00000000 0002 01 52397 /run/xrdp/sockdir/xrdp_disconnect_display_12\n" +
		"00000000d1f94b00: 00000002 00000000 00010000 0001 01 52398 /run/xrdp/sockdir/xrdp_display_12\n"
	_ = os.WriteFile(filepath.Join(root, "net", "unix"), []byte(unix), 0o644)
	got, err := XRDPSessions(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []brokerapi.Session{{User: "nobody", State: "disconnected"}, {User: "root", State: "active"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("XRDPSessions = %+v, want %+v", got, want)
	}
}
