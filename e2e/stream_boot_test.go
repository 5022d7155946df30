package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

const bootConfig = `state_dir: %[1]s
log: {level: info, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
stream:
  listen: "127.0.0.1:%[3]d"
  tls: "off"
  clients: open
  trace: %[5]s
  vdisks:
  - {name: golden, base: %[4]s, description: ext4 golden image}
`

// bootScript runs in each VM with the vDisk mounted on /mnt: it reads the
// golden file, writes its own, says so and waits for the test's word
// (a line on the serial console) that the other VM has written too, then
// remounts the disk with the page cache dropped, so that what it lists
// is read from the server, and lists what it sees.
const bootScript = `
  echo "DESKWAY golden: $(cat /mnt/golden.txt)"
  # What a boot does to its system disk: load programs and libraries
  # (small files whole, the start and a middle part of large ones) and
  # write logs.
  for f in $(find /mnt/usr -type f); do
    s=$(stat -c %s $f)
    if [ $s -le 262144 ]; then
      cat $f > /dev/null
    else
      dd if=$f bs=65536 count=4 2>/dev/null > /dev/null
      dd if=$f bs=65536 skip=$((s / 131072)) count=2 2>/dev/null > /dev/null
    fi
  done
  mkdir -p /mnt/var/log
  dd if=/dev/urandom of=/mnt/var/log/boot-$ID.log bs=65536 count=16 2>/dev/null
  echo "written by $ID" > /mnt/$ID.txt
  sync
  echo "DESKWAY written"
  read -r word
  cd /
  umount /mnt
  echo 3 > /proc/sys/vm/drop_caches
  mount -t ext4 /dev/vda /mnt || echo "DESKWAY remount failed"
  echo "DESKWAY files: $(ls /mnt | tr '\n' ' ')"
  echo "DESKWAY mine: $(cat /mnt/$ID.txt)"
`

// TestStreamBootTwoVMs boots two qemu VMs (TCG) at the same time from one
// ext4 golden image served by deskway stream over qemu's own NBD client:
// both mount it and write a file, and neither sees the other's file.
func TestStreamBootTwoVMs(t *testing.T) {
	// Beside tests that boot no guest (e2e/main_test.go); its guests take
	// both slots.
	guestTest(t)
	testkit.Require(t, "mkfs.ext4")
	kit := testkit.NewBootKit(t, bootScript)
	bin := build(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "golden.txt"), []byte("golden image v1\n"), 0o644)
	fillSystem(t, filepath.Join(src, "usr"), 96<<20)
	base := filepath.Join(dir, "golden.img")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "golden", "-d", src, base, "256M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	sum := fileSum(t, base)
	port := testkit.FreePort(t)
	cfg := filepath.Join(dir, "deskway.yaml")
	trace := filepath.Join(dir, "trace.csv")
	os.WriteFile(cfg, []byte(fmt.Sprintf(bootConfig, filepath.Join(dir, "state"), testkit.FreePort(t), port, base, trace)), 0o600)
	srv := testkit.Start(t, nil, bin, "stream", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
		t.Fatal(err)
	}

	guests(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ids := []string{"vm1", "vm2"}
	outs := make([]*lockedBuffer, len(ids))
	stdins := make([]io.WriteCloser, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		cmd := kit.Command(fmt.Sprintf("nbd://127.0.0.1:%d/golden/%s/boot1", port, id), id)
		outs[i] = &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdins[i] = in
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-ctx.Done():
				cmd.Process.Kill()
				<-done
			}
		}()
	}
	// Both VMs have written and synced their files before either lists
	// the disk: then each would see the other's file if isolation failed.
	for written := 0; written < len(ids); {
		written = 0
		for _, o := range outs {
			if strings.Contains(o.String(), "DESKWAY written") {
				written++
			}
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, in := range stdins {
		_, _ = io.WriteString(in, "go\n")
	}
	wg.Wait()
	for i, id := range ids {
		out := outs[i].String()
		if !strings.Contains(out, "DESKWAY-DONE") {
			t.Fatalf("%s did not finish its boot:\n%s", id, lastLines(out, 40))
		}
		for _, bad := range []string{"DESKWAY mount failed", "DESKWAY insmod failed", "DESKWAY remount failed"} {
			if strings.Contains(out, bad) {
				t.Fatalf("%s: %s\n%s", id, bad, lastLines(out, 40))
			}
		}
		if !strings.Contains(out, "DESKWAY golden: golden image v1") {
			t.Errorf("%s did not read the golden file:\n%s", id, lastLines(out, 20))
		}
		if !strings.Contains(out, "DESKWAY mine: written by "+id) {
			t.Errorf("%s did not read back its own file:\n%s", id, lastLines(out, 20))
		}
		files := regexp.MustCompile(`DESKWAY files: (.*)`).FindStringSubmatch(out)
		if files == nil {
			t.Fatalf("%s listed nothing:\n%s", id, lastLines(out, 20))
		}
		for _, other := range ids {
			seen := strings.Contains(files[1], other+".txt")
			if seen != (other == id) {
				t.Errorf("%s sees %s.txt: %v (files: %s)", id, other, seen, files[1])
			}
		}
	}
	// qemu closed its NBD connection cleanly at power-off: both boots ended.
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(srv.Log.String(), "boot ended, write cache discarded") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("boots not ended after power-off:\n%s", srv.Log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if fileSum(t, base) != sum {
		t.Fatal("the golden image changed")
	}
	// The server recorded each boot's requests: the bench's boot trace.
	raw, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	var vm1 []string
	var readBytes, writeBytes int64
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Split(line, ",")
		if len(f) != 6 || f[0] != "vm1" {
			continue
		}
		vm1 = append(vm1, strings.Join(f[2:], ","))
		var n int64
		fmt.Sscan(f[5], &n)
		switch f[3] {
		case "R":
			readBytes += n
		case "W":
			writeBytes += n
		}
	}
	t.Logf("vm1 boot trace: %d requests, %d MiB read, %d KiB written", len(vm1), readBytes>>20, writeBytes>>10)
	if readBytes < 20<<20 || writeBytes < 1<<20 {
		t.Errorf("trace of vm1 reads %d and writes %d bytes; the boot did more", readBytes, writeBytes)
	}
	if out := os.Getenv("DESKWAY_BOOT_TRACE_OUT"); out != "" {
		body := "# ms,op,offset,length: requests of one diskless boot recorded by deskway stream (e2e TestStreamBootTwoVMs)\n" +
			strings.Join(vm1, "\n") + "\n"
		if err := os.WriteFile(out, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// lockedBuffer is a bytes.Buffer a process writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fillSystem copies regular files under 4 MiB from the host's
// /usr/lib/x86_64-linux-gnu and /usr/bin (half of total from each, in
// name order) into dir: the programs and libraries a booting system loads.
func fillSystem(t *testing.T, dir string, total int64) {
	t.Helper()
	for _, from := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/bin"} {
		ents, err := os.ReadDir(from)
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dir, filepath.Base(from))
		os.MkdirAll(to, 0o755)
		var n int64
		for _, e := range ents {
			if n >= total/2 {
				break
			}
			fi, err := e.Info()
			if err != nil || !fi.Mode().IsRegular() || fi.Size() > 4<<20 {
				continue
			}
			b, err := os.ReadFile(filepath.Join(from, e.Name()))
			if err != nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o644); err != nil {
				t.Fatal(err)
			}
			n += fi.Size()
		}
	}
}
