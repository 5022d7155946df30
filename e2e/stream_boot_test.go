package e2e

import (
	"bytes"
	"context"
	"fmt"
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
  vdisks:
  - {name: golden, base: %[4]s, description: ext4 golden image}
`

// bootScript runs in each VM with the vDisk mounted on /mnt: it reads the
// golden file, writes its own, gives the other VM time to write, and
// lists what it sees.
const bootScript = `
  echo "DESKWAY golden: $(cat /mnt/golden.txt)"
  echo "written by $ID" > /mnt/$ID.txt
  sync
  sleep 4
  echo "DESKWAY files: $(ls /mnt | tr '\n' ' ')"
  echo "DESKWAY mine: $(cat /mnt/$ID.txt)"
`

// TestStreamBootTwoVMs boots two qemu VMs (TCG) at the same time from one
// ext4 golden image served by deskway stream over qemu's own NBD client:
// both mount it and write a file, and neither sees the other's file.
func TestStreamBootTwoVMs(t *testing.T) {
	testkit.Require(t, "mkfs.ext4")
	kit := testkit.NewBootKit(t, bootScript)
	bin := build(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "golden.txt"), []byte("golden image v1\n"), 0o644)
	base := filepath.Join(dir, "golden.img")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-L", "golden", "-d", src, base, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	sum := fileSum(t, base)
	port := testkit.FreePort(t)
	cfg := filepath.Join(dir, "deskway.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(bootConfig, filepath.Join(dir, "state"), testkit.FreePort(t), port, base)), 0o600)
	srv := testkit.Start(t, nil, bin, "stream", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ids := []string{"vm1", "vm2"}
	outs := make([]string, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := kit.Command(fmt.Sprintf("nbd://127.0.0.1:%d/golden/%s/boot1", port, id), id)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				outs[i] = err.Error()
				return
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-ctx.Done():
				cmd.Process.Kill()
				<-done
			}
			outs[i] = out.String()
		}()
	}
	wg.Wait()
	for i, id := range ids {
		out := outs[i]
		if !strings.Contains(out, "DESKWAY-DONE") {
			t.Fatalf("%s did not finish its boot:\n%s", id, tailLines(out, 40))
		}
		for _, bad := range []string{"DESKWAY mount failed", "DESKWAY insmod failed"} {
			if strings.Contains(out, bad) {
				t.Fatalf("%s: %s\n%s", id, bad, tailLines(out, 40))
			}
		}
		if !strings.Contains(out, "DESKWAY golden: golden image v1") {
			t.Errorf("%s did not read the golden file:\n%s", id, tailLines(out, 20))
		}
		if !strings.Contains(out, "DESKWAY mine: written by "+id) {
			t.Errorf("%s did not read back its own file:\n%s", id, tailLines(out, 20))
		}
		files := regexp.MustCompile(`DESKWAY files: (.*)`).FindStringSubmatch(out)
		if files == nil {
			t.Fatalf("%s listed nothing:\n%s", id, tailLines(out, 20))
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
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
