package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
	"github.com/deskway/deskway/internal/testkit"
)

const streamConfig = `state_dir: %[1]s
log: {level: debug, format: text}
admin: {listen: "127.0.0.1:%[2]d", tokens: [tok]}
tls: {cert: %[3]s, key: %[4]s}
stream:
  listen: "127.0.0.1:%[5]d"
  tls: %[6]s
  clients: %[9]s
  cache_ram_mb: 1
  reconnect_window: %[7]s
%[10]s  vdisks:
  - {name: golden, base: %[8]s, description: golden test image}
  - {name: personal, base: %[8]s, mode: private, clients: [alice, racer0, racer1, racer2]}
`

type streamRig struct {
	base, uri, dir string
	admin          string
	sum            string
	log            *testkit.Process
	bin, cfg       string
	addr           string
}

// restart stops the server with sig (SIGKILL: it dies at once) and
// starts it again with the same configuration and store.
func (r *streamRig) restart(t *testing.T, sig syscall.Signal) {
	t.Helper()
	_ = syscall.Kill(-r.log.Cmd.Process.Pid, sig)
	_, _ = r.log.Cmd.Process.Wait()
	r.log = testkit.Start(t, nil, r.bin, "stream", "-c", r.cfg)
	if err := testkit.WaitPort(r.addr, 10*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, r.log.Log.String())
	}
}

// startStream writes a base image (random head, a marked region, a sparse
// tail) and runs deskway stream in front of it.
func startStream(t *testing.T, tlsMode, window string) *streamRig {
	t.Helper()
	_, _, cert, key := testkit.TLS(t)
	return startStreamCert(t, tlsMode, window, cert, key)
}

// startStreamCert is startStream with the server's certificate and key.
func startStreamCert(t *testing.T, tlsMode, window, cert, key string) *streamRig {
	t.Helper()
	return startStreamClients(t, tlsMode, window, cert, key, "open")
}

// startStreamClients is startStreamCert with stream.clients set.
func startStreamClients(t *testing.T, tlsMode, window, cert, key, clients string) *streamRig {
	t.Helper()
	return startStreamWith(t, tlsMode, window, cert, key, clients, "")
}

// startStreamWith is startStreamClients with more lines for the stream
// section (each indented two spaces and ending in a newline).
func startStreamWith(t *testing.T, tlsMode, window, cert, key, clients, extra string) *streamRig {
	t.Helper()
	testkit.Require(t, "nbdinfo", "nbdcopy", "qemu-io", "qemu-img")
	bin := build(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "golden.img")
	f, err := os.Create(base)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 3<<20)
	rand.New(rand.NewSource(1)).Read(head)
	f.Write(head)
	f.WriteAt([]byte(strings.Repeat("golden image ", 1000)), 40<<20)
	f.Truncate(64 << 20)
	f.Close()
	ports := testkit.FreePorts(t, 2)
	port, adminPort := ports[0], ports[1]
	cfg := filepath.Join(dir, "deskway.yaml")
	body := fmt.Sprintf(streamConfig, filepath.Join(dir, "state"), adminPort, cert, key, port, tlsMode, window, base, clients, extra)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &streamRig{base: base, dir: dir, uri: fmt.Sprintf("nbd://127.0.0.1:%d", port), sum: fileSum(t, base),
		admin: fmt.Sprintf("https://127.0.0.1:%d", adminPort), bin: bin, cfg: cfg, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	r.log = testkit.Start(t, nil, bin, "stream", "-c", cfg)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, r.log.Log.String())
	}
	t.Cleanup(func() {
		// Whatever the clients did, the golden image is byte for byte the same.
		if got := fileSum(t, base); got != r.sum {
			t.Errorf("base image changed: sha256 %s, was %s", got, r.sum)
		}
	})
	return r
}

func fileSum(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil))
}

func runOK(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// qemuIO runs qemu-io commands on uri and reports whether all passed;
// qemu-io exits 0 even when a pattern check fails, so its output is read.
func qemuIO(t *testing.T, uri string, readOnly bool, cmds ...string) (bool, string) {
	t.Helper()
	args := []string{"-f", "raw"}
	if readOnly {
		args = append(args, "-r")
	}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := exec.Command("qemu-io", append(args, uri)...).CombinedOutput()
	s := string(out)
	return err == nil && !strings.Contains(s, "failed") && !strings.Contains(s, "error"), s
}

func TestStreamRealClients(t *testing.T) {
	r := startStream(t, "on", "1m")

	t.Run("nbdinfo", func(t *testing.T) {
		var info struct {
			Exports []struct {
				Name     string   `json:"export-name"`
				Size     int64    `json:"export-size"`
				ReadOnly bool     `json:"is_read_only"`
				Desc     string   `json:"description"`
				Contexts []string `json:"contexts"`
				MultiCon bool     `json:"can_multi_conn"`
			} `json:"exports"`
		}
		out := runOK(t, "nbdinfo", "--json", r.uri+"/golden")
		if err := json.Unmarshal([]byte(out), &info); err != nil || len(info.Exports) != 1 {
			t.Fatalf("nbdinfo --json: %v\n%s", err, out)
		}
		e := info.Exports[0]
		if e.Size != 64<<20 || !e.ReadOnly || e.Desc != "golden test image" || !e.MultiCon ||
			len(e.Contexts) != 1 || e.Contexts[0] != "base:allocation" {
			t.Errorf("bare vDisk export: %+v", e)
		}
		out = runOK(t, "nbdinfo", "--json", r.uri+"/golden/vm1/boot1")
		if err := json.Unmarshal([]byte(out), &info); err != nil || len(info.Exports) != 1 || info.Exports[0].ReadOnly {
			t.Errorf("client export should be writable: %v\n%s", err, out)
		}
		// The base is sparse after its first 3 MiB but for a marked region.
		if out := runOK(t, "nbdinfo", "--map", r.uri+"/golden"); !strings.Contains(out, "hole,zero") || !strings.Contains(out, "data") {
			t.Errorf("nbdinfo --map shows no holes:\n%s", out)
		}
		if out := runOK(t, "nbdinfo", "--list", r.uri); !strings.Contains(out, `export="golden"`) {
			t.Errorf("nbdinfo --list:\n%s", out)
		}
		nosuch := exec.Command("nbdinfo", r.uri+"/nosuch")
		nosuch.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
		if out, err := nosuch.CombinedOutput(); err == nil {
			t.Errorf("unknown export accepted:\n%s", out)
		} else if !strings.Contains(string(out), "no vDisk named") {
			t.Errorf("unknown export: the server's reason is not shown:\n%s", out)
		}
	})

	t.Run("nbdcopy and qemu-img compare", func(t *testing.T) {
		copyTo := filepath.Join(r.dir, "copy.img")
		runOK(t, "nbdcopy", r.uri+"/golden", copyTo)
		if got := fileSum(t, copyTo); got != r.sum {
			t.Errorf("nbdcopy image sha256 %s, base %s", got, r.sum)
		}
		runOK(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", r.base, r.uri+"/golden")
		// A client that has not written sees the base too.
		runOK(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", r.base, r.uri+"/golden/vm9/boot1")
	})

	t.Run("write caches are private per client", func(t *testing.T) {
		a := r.uri + "/golden/vmA/boot1"
		// Writes inside the RAM part and beyond it (1 MiB RAM, then spill).
		if ok, out := qemuIO(t, a, false, "write -P 0xab 4096 8192", "write -P 0xcd 2000001 3000000",
			"read -P 0xab 4096 8192", "read -P 0xcd 2000001 3000000"); !ok {
			t.Fatalf("client A write/read:\n%s", out)
		}
		// qemu-io sent NBD_CMD_DISC when it quit: A's boot ended, its writes are gone.
		expectMismatch(t, a, "read -P 0xab 4096 8192", "client A's writes survived the end of its boot")
		runOK(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", r.base, a)
	})

	t.Run("a client that reconnects gets its writes back", func(t *testing.T) {
		a := r.uri + "/golden/vmB/boot7"
		// qemu-io kills itself after its write is acknowledged: no
		// NBD_CMD_DISC, as when a diskless machine loses the network.
		killedAfterWrite(t, a, "write -P 0x5a 1048576 65536")
		// Another client sees the base, the same client sees its write.
		expectMismatch(t, r.uri+"/golden/vmC/boot1", "read -P 0x5a 1048576 65536", "client C sees client B's write")
		if ok, out := qemuIO(t, a, true, "read -P 0x5a 1048576 65536"); !ok {
			t.Fatalf("client B lost its write across a reconnect:\n%s", out)
		}
		// A connection that only read (a probe such as nbdinfo, or a
		// reader beside the client) does not end the boot when it leaves.
		runOK(t, "nbdinfo", a)
		if ok, out := qemuIO(t, a, true, "read -P 0x5a 1048576 65536"); !ok {
			t.Fatalf("a probe's clean disconnect ended client B's boot:\n%s", out)
		}
		// The client itself, writing and leaving cleanly, ends it.
		if ok, out := qemuIO(t, a, false, "write -P 0x5a 1048576 512"); !ok {
			t.Fatalf("client B's last write:\n%s", out)
		}
		expectMismatch(t, a, "read -P 0x5a 1048576 65536", "client B's write outlived its boot")
	})

	t.Run("writes to the bare vDisk are refused", func(t *testing.T) {
		expectRefused(t, r.uri+"/golden", false, "Could not open image: Permission denied", "write to the read-only export", "write -P 0x11 0 512")
	})

	t.Run("private mode: one persistent image per client, one writer", func(t *testing.T) {
		a := r.uri + "/personal/alice"
		if ok, out := qemuIO(t, a, false, "write -P 0x42 65536 4096"); !ok {
			t.Fatalf("private write:\n%s", out)
		}
		// Unlike a standard-mode boot, the write outlives the disconnect.
		if ok, out := qemuIO(t, a, true, "read -P 0x42 65536 4096"); !ok {
			t.Fatalf("private image lost its write:\n%s", out)
		}
		// bob is not listed: his image is made through the admin API, and a
		// client nobody made one for is refused without costing a copy.
		if ok, out := qemuIO(t, r.uri+"/personal/mallory", true, "read 0 512"); ok || !strings.Contains(out, "has no private image") {
			t.Fatalf("an unknown client got a private image, or was not told why:\n%s", out)
		}
		if _, err := os.Stat(filepath.Join(r.dir, "state", "vdisks", "private", "personal", "mallory.img")); err == nil {
			t.Fatal("a private image was made for an unknown client")
		}
		r.api(t, "POST", "/api/v1/stream/vdisks/personal/private/bob", http.StatusCreated, nil)
		expectMismatch(t, r.uri+"/personal/bob", "read -P 0x42 65536 4096", "bob sees alice's private write")
		runOK(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", r.base, r.uri+"/personal/bob")
		// A second writer while the first is connected is refused, and told why.
		opened := strings.Count(r.log.Log.String(), "private image opened")
		first := exec.Command("qemu-io", "-f", "raw", a)
		stdin, _ := first.StdinPipe()
		if err := first.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { stdin.Close(); first.Wait() }()
		deadline := time.Now().Add(10 * time.Second)
		for strings.Count(r.log.Log.String(), "private image opened") <= opened {
			if time.Now().After(deadline) {
				t.Fatalf("first writer never connected:\n%s", r.log.Log.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		second := exec.Command("nbdinfo", a)
		second.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
		out, err := second.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "allows one writer") {
			t.Fatalf("second writer: %v\n%s", err, out)
		}
	})

	t.Run("versions through the admin API", func(t *testing.T) {
		var v struct {
			Version int    `json:"version"`
			Stage   string `json:"stage"`
		}
		r.api(t, "POST", "/api/v1/stream/vdisks/golden/versions", http.StatusCreated, &v)
		if v.Stage != "maintenance" {
			t.Fatalf("new version: %+v", v)
		}
		// A reader looking at the version meanwhile holds up neither the
		// maintenance writer nor, below, the promotion.
		viewer := exec.Command("qemu-io", "-f", "raw", "-r", "-c", "read 0 512", "-c", "sleep 4000", r.uri+"/golden@maintenance")
		var viewed testkit.Buffer
		viewer.Stdout, viewer.Stderr = &viewed, &viewed
		if err := viewer.Start(); err != nil {
			t.Fatal(err)
		}
		// The viewer is connected (it has read) before the writer comes.
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(viewed.String(), "read 512/512"); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the viewer never read:\n%s", viewed.String())
			}
		}
		if ok, out := qemuIO(t, r.uri+"/golden@maintenance/admin", false, "write -P 0x77 8192 4096"); !ok {
			t.Fatalf("maintenance write beside a reader:\n%s", out)
		}
		path := fmt.Sprintf("/api/v1/stream/vdisks/golden/versions/%d/promote", v.Version)
		r.api(t, "POST", path, http.StatusOK, &v)
		// ...and was still connected through the write and the promotion.
		if err := viewer.Wait(); err != nil || strings.Contains(viewed.String(), "failed") {
			t.Fatalf("the viewer: %v\n%s", err, viewed.String())
		}
		expectMismatch(t, r.uri+"/golden/vmP/b1", "read -P 0x77 8192 4096", "production sees a test version")
		if ok, out := qemuIO(t, r.uri+"/golden@test/vmT/b1", true, "read -P 0x77 8192 4096"); !ok {
			t.Fatalf("test client does not see the test version:\n%s", out)
		}
		r.api(t, "POST", path, http.StatusOK, &v)
		if v.Stage != "production" {
			t.Fatalf("after two promotions: %+v", v)
		}
		if ok, out := qemuIO(t, r.uri+"/golden/vmP/b2", true, "read -P 0x77 8192 4096"); !ok {
			t.Fatalf("production does not boot the promoted version:\n%s", out)
		}
		r.api(t, "POST", path, http.StatusConflict, nil)
	})

	t.Run("TLS", func(t *testing.T) {
		out := runOK(t, "nbdinfo", strings.Replace(r.uri, "nbd://", "nbds://", 1)+"/golden?tls-verify-peer=false")
		if !strings.Contains(out, "with TLS") {
			t.Errorf("nbds:// did not use TLS:\n%s", out)
		}
	})
}

func TestStreamTLSRequired(t *testing.T) {
	r := startStream(t, "require", "1m")
	plain := exec.Command("nbdinfo", r.uri+"/golden")
	plain.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
	out, err := plain.CombinedOutput()
	if err == nil {
		t.Fatalf("plain-text client accepted when TLS is required:\n%s", out)
	}
	if !strings.Contains(string(out), "requires TLS") {
		t.Errorf("refusal does not say TLS is required:\n%s", out)
	}
	out2 := runOK(t, "nbdinfo", strings.Replace(r.uri, "nbd://", "nbds://", 1)+"/golden?tls-verify-peer=false")
	if !strings.Contains(out2, "with TLS") {
		t.Errorf("nbds://:\n%s", out2)
	}
}

// TestStreamQemuTLS has qemu's own NBD client (GnuTLS, tls-creds-x509,
// verifying the server's chain and address) write and read a boot's cache
// over TLS, and shows that without tls-creds the server refuses it.
func TestStreamQemuTLS(t *testing.T) {
	caDir, cert, key := testkit.CA(t)
	r := startStreamCert(t, "require", "1m", cert, key)
	port := strings.TrimPrefix(r.uri, "nbd://127.0.0.1:")
	qemuTLS := func(export string, cmds ...string) (bool, string) { return qemuIOTLS(caDir, port, export, cmds...) }
	// Write, read back, and die without a clean disconnect: the boot stays.
	if ok, out := qemuTLS("golden/vmT/boot1", "write -P 0x5a 4096 8192", "read -P 0x5a 4096 8192", "sigraise 9"); ok ||
		!strings.Contains(out, "wrote 8192/8192") || strings.Contains(out, "verification failed") {
		t.Fatalf("qemu-io over TLS should have written, read back and been killed:\n%s", out)
	}
	// The reconnect gets the write back; another client does not see it.
	if ok, out := qemuTLS("golden/vmT/boot1", "read -P 0x5a 4096 8192"); !ok {
		t.Fatalf("the boot's write is gone on reconnect over TLS:\n%s", out)
	}
	if ok, out := qemuTLS("golden/vmU/boot1", "read -P 0x5a 4096 8192"); ok {
		t.Fatalf("another client sees the write:\n%s", out)
	}
	// A reconnect that writes and disconnects cleanly ends the boot.
	if ok, out := qemuTLS("golden/vmT/boot1", "write -P 0x5a 4096 512"); !ok {
		t.Fatalf("last write over TLS:\n%s", out)
	}
	ok, out := qemuTLS("golden/vmT/boot1", "read -P 0x5a 4096 8192")
	expectMismatchOut(t, ok, out, "the write outlived its boot")
	expectRefused(t, r.uri+"/golden/vmT/boot1", true, "server reported: this server requires TLS", "plain-text qemu-io when TLS is required", "read 0 4096")
}

func TestStreamBootEndsAfterReconnectWindow(t *testing.T) {
	r := startStream(t, "off", "1s")
	a := r.uri + "/golden/vmD/boot1"
	killedAfterWrite(t, a, "write -P 0x77 0 4096")
	r.waitBootDiscarded(t)
	// The cache is gone, so the boot is refused with the reason: a client
	// that comes back late (qemu reconnects only on its next request, so
	// an idle desktop does) must not read the base where its write was.
	expectRefused(t, a, true, "no client reconnected within 1s", "a boot whose cache the window discarded was served", "read -P 0x77 0 4096")
	// A new boot of the same client starts clean.
	runOK(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", r.base, r.uri+"/golden/vmD/boot2")
}

// waitBootDiscarded waits for the server to discard a boot whose client
// stayed away past the rig's reconnect window of 1 s.
func (r *streamRig) waitBootDiscarded(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.log.Log.String(), "no reconnect within 1s") {
		if time.Now().After(deadline) {
			t.Fatalf("boot not discarded after the reconnect window:\n%s", r.log.Log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killedAfterWrite runs a qemu-io write on uri and has qemu-io kill
// itself with SIGKILL once the write is acknowledged.
func killedAfterWrite(t *testing.T, uri, write string) {
	t.Helper()
	out, err := exec.Command("qemu-io", "-f", "raw", "-c", write, "-c", "sigraise 9", uri).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 137 && !strings.Contains(ee.Error(), "killed") {
		t.Fatalf("qemu-io should have died by SIGKILL: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "wrote ") {
		t.Fatalf("qemu-io never acknowledged the write:\n%s", out)
	}
}

// api calls the admin API with the test's token and decodes the answer.
func (r *streamRig) api(t *testing.T, method, path string, want int, out any) {
	t.Helper()
	req, _ := http.NewRequest(method, r.admin+path, nil)
	req.Header.Set("Authorization", "Bearer tok")
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, body)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, body)
		}
	}
}

// TestStreamRestartRefusesALostBoot: without shared caches a boot's
// writes live in the server, so a server that stops (killed, or even
// stopped cleanly) loses them. A client that comes back to that boot must
// be refused with the reason, never handed the base disk as if nothing
// had been written; a new boot of the same client starts clean.
func TestStreamRestartRefusesALostBoot(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			r := startStream(t, "off", "1m")
			a := r.uri + "/golden/vmR/boot1"
			killedAfterWrite(t, a, "write -P 0x3c 1048576 65536")
			r.restart(t, sig)
			ok, out := qemuIO(t, a, true, "read -P 0x3c 1048576 65536")
			if ok || !strings.Contains(out, "write cache was lost") {
				t.Fatalf("a lost boot was served, or refused without its reason:\n%s", out)
			}
			if !strings.Contains(r.log.Log.String(), "lost their write caches") {
				t.Fatalf("the restart did not log the lost boot:\n%s", r.log.Log.String())
			}
			runOK(t, "qemu-img", "compare", "-f", "raw", "-F", "raw", r.base, r.uri+"/golden/vmR/boot2")
		})
	}
	// A client that stays connected across the restart, as qemu does with
	// reconnect-delay, gets I/O errors once it reconnects: its disk fails
	// loudly instead of reading the base where its write was.
	t.Run("qemu reconnecting", func(t *testing.T) {
		r := startStream(t, "off", "1m")
		port := strings.TrimPrefix(r.uri, "nbd://127.0.0.1:")
		cmd := exec.Command("qemu-io", "--image-opts",
			"-c", "write -P 0x3c 0 65536", "-c", "sleep 3000", "-c", "read -P 0x3c 0 65536",
			"driver=raw,file.driver=nbd,file.host=127.0.0.1,file.port="+port+",file.export=golden/vmQ/boot1,file.reconnect-delay=4")
		var out testkit.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // written, sleeping
		r.restart(t, syscall.SIGKILL)
		_ = cmd.Wait()
		s := out.String()
		if !strings.Contains(s, "wrote 65536/65536") || strings.Contains(s, "verification failed") || !strings.Contains(s, "read failed") {
			t.Fatalf("after the restart the client should get a read error, not another disk:\n%s", s)
		}
	})
}

// TestStreamPrivateFirstUseRace: two machines named alike connect to a
// private image that does not exist yet, at once. One is the writer, the
// other is refused, and the writer's flushed write is in the image.
func TestStreamPrivateFirstUseRace(t *testing.T) {
	r := startStream(t, "off", "1m")
	for round := range 3 {
		name := fmt.Sprintf("personal/racer%d", round)
		type result struct {
			pattern string
			out     string
		}
		results := make(chan result, 2)
		for _, p := range []string{"0x61", "0x62"} {
			go func() {
				// Write, flush, and stay connected a while, as a booted machine does.
				out, _ := exec.Command("qemu-io", "-f", "raw", "-c", "write -P "+p+" 0 65536", "-c", "flush",
					"-c", "sleep 1500", r.uri+"/"+name).CombinedOutput()
				results <- result{p, string(out)}
			}()
		}
		var wrote []string
		for range 2 {
			res := <-results
			switch {
			case strings.Contains(res.out, "wrote 65536/65536"):
				wrote = append(wrote, res.pattern)
			case !strings.Contains(res.out, "one writer"):
				t.Fatalf("round %d: a refused writer was not told why:\n%s", round, res.out)
			}
		}
		if len(wrote) != 1 {
			t.Fatalf("round %d: %d writers were accepted at once: %v", round, len(wrote), wrote)
		}
		if ok, out := qemuIO(t, r.uri+"/"+name, true, "read -P "+wrote[0]+" 0 65536"); !ok {
			t.Fatalf("round %d: the accepted writer's flushed write is gone:\n%s", round, out)
		}
	}
}

// rssOf reads the resident set of process pid.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestStreamGreedyReadersAreBounded: clients that ask for the largest
// reads the server allows and never read a reply must not make it hold
// what they asked for: over TLS (served by goroutines) and on plain TCP
// (served on event loops, from a write cache so no sendfile applies).
func TestStreamGreedyReadersAreBounded(t *testing.T) {
	_, clientTLS, cert, key := testkit.TLS(t)
	for _, tc := range []struct {
		name  string
		tls   bool
		conns int
		extra string // more stream settings
		limit int64  // growth allowed
	}{
		{"tls", true, 4, "", 400 << 20},                                  // four connections of at most 64 MiB each, and TLS buffers
		{"plain", false, 24, "", 400 << 20},                              // event loops send a cached READ 1 MiB at a time
		{"all connections", true, 8, "  max_buffer_mb: 64\n", 200 << 20}, // 64 MiB over all of them, not 8 × 64
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startStreamWith(t, "on", "1m", cert, key, "open", tc.extra)
			pid := r.log.Cmd.Process.Pid
			export := "golden/greedy/boot1"
			// Data in the boot's write cache: reads over it are copied.
			if ok, out := qemuIO(t, r.uri+"/"+export, false, "write -P 0x42 0 65536", "write -P 0x42 33554432 65536", "sigraise 9"); ok {
				t.Fatalf("qemu-io should have been killed after writing:\n%s", out)
			}
			before := rssOf(t, pid)
			for i := range tc.conns {
				raw, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				_ = raw.(*net.TCPConn).SetReadBuffer(4096)
				t.Cleanup(func() { raw.Close() })
				o := nbdclient.Options{}
				if tc.tls {
					o.TLS = clientTLS
				}
				conn, _, err := nbdclient.Handshake(raw, export, o)
				if err != nil {
					t.Fatal(err)
				}
				var reqs []byte
				for k := range 16 {
					req := nbd.Request{Cmd: nbd.CmdRead, Cookie: uint64(i*100 + k), Offset: uint64(k%2) << 25, Length: 32 << 20}
					reqs = req.Append(reqs)
				}
				if _, err := conn.Write(reqs); err != nil {
					t.Fatal(err)
				}
			}
			var peak int64
			for range 30 {
				time.Sleep(100 * time.Millisecond)
				peak = max(peak, rssOf(t, pid))
			}
			grown := peak - before
			t.Logf("RSS %d MiB before, %d MiB at peak with %d connections of 16 unread 32 MiB reads", before>>20, peak>>20, tc.conns)
			if grown > tc.limit {
				t.Fatalf("the server grew by %d MiB for clients that read nothing (at most %d MiB allowed)", grown>>20, tc.limit>>20)
			}
			// The server still serves a well-behaved client meanwhile.
			if ok, out := qemuIO(t, r.uri+"/golden/other/boot1", true, "read -P 0 63m 4096"); !ok {
				t.Fatalf("a normal client is not served:\n%s", out)
			}
		})
	}
}

// TestStreamClientCertificates: with stream.clients: certificate a client
// is who its certificate from deskway's CA says, with qemu's tls-creds
// and libnbd's tls-certificates; it opens its own boots and private
// image only, and maintenance needs the role.
func TestStreamClientCertificates(t *testing.T) {
	// No tls.cert: the server shows a certificate deskway's CA issued.
	r := startStreamClients(t, "on", "1m", "", "", "certificate")
	port := strings.TrimPrefix(r.uri, "nbd://127.0.0.1:")
	issue := func(client string, roles ...string) string {
		out := filepath.Join(t.TempDir(), client)
		args := []string{"stream", "cert", "issue", "-c", r.cfg, "--client", client, "--out", out}
		for _, role := range roles {
			args = append(args, "--role", role)
		}
		runOK(t, r.bin, args...)
		if fi, err := os.Stat(filepath.Join(out, "client-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("client key: %v %v", fi, err)
		}
		return out
	}
	pc1, pc2, admin := issue("pc1"), issue("pc2"), issue("admin1", "maintenance")
	qemu := func(dir, export string, cmds ...string) (bool, string) { return qemuIOTLS(dir, port, export, cmds...) }
	// pc1 writes into its boot and dies without a clean disconnect.
	if ok, out := qemu(pc1, "golden/pc1/b1", "write -P 0x5a 4096 4096", "sigraise 9"); ok || !strings.Contains(out, "wrote 4096/4096") {
		t.Fatalf("pc1 could not write its boot:\n%s", out)
	}
	if ok, out := qemu(pc1, "golden/pc1/b1", "read -P 0x5a 4096 4096", "sigraise 9"); ok || strings.Contains(out, "verification failed") || !strings.Contains(out, "read 4096/4096") {
		t.Fatalf("pc1 lost its boot's write:\n%s", out)
	}
	// pc2's certificate opens neither pc1's boot nor pc1's private image.
	for _, export := range []string{"golden/pc1/b1", "personal/pc1"} {
		if ok, out := qemu(pc2, export, "read 4096 4096"); ok || !strings.Contains(out, "may not open the boots or private image of pc1") {
			t.Fatalf("pc2 opened %s, or was refused without the reason:\n%s", export, out)
		}
	}
	// Its own private image, yes; and the base, read-only.
	if ok, out := qemu(pc2, "personal/pc2", "write -P 0x33 0 512"); !ok {
		t.Fatalf("pc2's own private image:\n%s", out)
	}
	runOK(t, "nbdinfo", "nbds://127.0.0.1:"+port+"/golden?tls-certificates="+pc2)
	// Maintenance needs the role.
	r.api(t, "POST", "/api/v1/stream/vdisks/golden/versions", http.StatusCreated, nil)
	if ok, out := qemu(pc1, "golden@maintenance/pc1", "write -P 0x77 8192 512"); ok || !strings.Contains(out, "maintenance role") {
		t.Fatalf("pc1 wrote the maintenance version:\n%s", out)
	}
	if ok, out := qemu(admin, "golden@maintenance/admin1", "write -P 0x77 8192 512"); !ok {
		t.Fatalf("the maintenance certificate could not write:\n%s", out)
	}
	// libnbd with the same files.
	runOK(t, "nbdinfo", "nbds://127.0.0.1:"+port+"/golden/pc1/b1?tls-certificates="+pc1)
	nbdinfoRefused(t, "nbds://127.0.0.1:"+port+"/golden/pc1/b1?tls-certificates="+pc2, "may not open the boots or private image of pc1",
		"nbdinfo with pc2's certificate on pc1's boot")
	// Without a certificate: plain text is refused, and so is TLS.
	expectRefused(t, r.uri+"/golden/pc1/b1", true, "server reported: this server requires TLS", "a client without TLS", "read 4096 4096")
	nbdinfoRefused(t, "nbds://127.0.0.1:"+port+"/golden/pc1/b1?tls-verify-peer=false", "A TLS fatal alert has been received",
		"a TLS client without a certificate")
	if !strings.Contains(r.log.Log.String(), "certificate") {
		t.Fatalf("the server did not log why it refused a TLS client without a certificate:\n%s", r.log.Log.String())
	}
}

// nbdinfoRefused runs nbdinfo on uri, with libnbd's debug output, which
// carries the server's messages, and requires that it fails saying
// reason.
func nbdinfoRefused(t *testing.T, uri, reason, why string) {
	t.Helper()
	cmd := exec.Command("nbdinfo", uri)
	cmd.Env = append(os.Environ(), "LIBNBD_DEBUG=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), reason) {
		t.Fatalf("%s: want a refusal saying %q (%v):\n%s", why, reason, err, lastLines(string(out), 30))
	}
}

// expectMismatch runs a qemu-io read with a pattern (read -P) on uri and
// requires that qemu connected, read the range and found other bytes: a
// refused connection, a crash or a missing export does not pass.
func expectMismatch(t *testing.T, uri, read, why string) {
	t.Helper()
	ok, out := qemuIO(t, uri, true, read)
	expectMismatchOut(t, ok, out, why)
}

func expectMismatchOut(t *testing.T, ok bool, out, why string) {
	t.Helper()
	if ok || !strings.Contains(out, "Pattern verification failed") || !strings.Contains(out, "read ") {
		t.Fatalf("%s: the read should succeed and find other bytes:\n%s", why, out)
	}
}

// expectRefused runs qemu-io cmds on uri and requires that they fail with
// reason, the server's words or errno, in qemu's output.
func expectRefused(t *testing.T, uri string, readOnly bool, reason, why string, cmds ...string) {
	t.Helper()
	ok, out := qemuIO(t, uri, readOnly, cmds...)
	if ok || !strings.Contains(out, reason) {
		t.Fatalf("%s: want a refusal saying %q:\n%s", why, reason, out)
	}
}

// nbdsh runs a libnbd (python) script with h connected to uri, with the
// client-side checks that would keep odd requests from the server off.
func nbdsh(t *testing.T, uri, script string) (string, error) {
	t.Helper()
	testkit.Require(t, "/usr/bin/python3")
	pre := "import nbd\nh.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_ZERO_SIZE & ~nbd.STRICT_BOUNDS)\nh.connect_uri(" +
		fmt.Sprintf("%q", uri) + ")\n"
	out, err := exec.Command("/usr/bin/python3", "-m", "nbd", "-c", pre+script).CombinedOutput()
	return string(out), err
}

// TestStreamOddRequests: requests a client may legally send get the
// answers nbdkit gives, and the connection carries on.
func TestStreamOddRequests(t *testing.T) {
	r := startStream(t, "off", "1m")
	out, err := nbdsh(t, r.uri+"/golden/odd/b1", `
h.pwrite(b"", 4096)
assert len(h.pread(0, 4096)) == 0
try:
    h.trim(8192, h.get_size() - 4096)
    print("trim past the end: accepted")
except nbd.Error as e:
    print("trim past the end:", e.errno)
h.pwrite(b"x" * 512, 0)
assert h.pread(512, 0) == b"x" * 512
print("still connected")
`)
	if err != nil || !strings.Contains(out, "trim past the end: EINVAL") || !strings.Contains(out, "still connected") {
		t.Fatalf("odd requests: %v\n%s", err, out)
	}
	// A stage names another boot: golden@v0/pc/b1 is not golden/pc/b1.
	if ok, out := qemuIO(t, r.uri+"/golden/stage/b1", false, "write -P 0x61 0 4096", "sigraise 9"); ok || !strings.Contains(out, "wrote 4096/4096") {
		t.Fatalf("write:\n%s", out)
	}
	expectMismatch(t, r.uri+"/golden@v0/stage/b1", "read -P 0x61 0 4096", "golden@v0/stage/b1 reads golden/stage/b1's write")
	// ...but spellings of one stage name one boot: golden@production is
	// golden, and golden@v00 is golden@v0.
	for _, same := range [][2]string{{"golden/stage/b1", "golden@production/stage/b1"}, {"golden@v0/stage/b2", "golden@v00/stage/b2"}} {
		if ok, out := qemuIO(t, r.uri+"/"+same[0], false, "write -P 0x62 8192 4096", "sigraise 9"); ok || !strings.Contains(out, "wrote 4096/4096") {
			t.Fatalf("write to %s:\n%s", same[0], out)
		}
		if ok, out := qemuIO(t, r.uri+"/"+same[1], true, "read -P 0x62 8192 4096"); !ok {
			t.Fatalf("%s does not read %s's write:\n%s", same[1], same[0], out)
		}
	}
}

// TestStreamBootCapInAll: many client names together cannot make the
// server hold more live boots than stream.max_boots.
func TestStreamBootCapInAll(t *testing.T) {
	_, _, cert, key := testkit.TLS(t)
	r := startStreamWith(t, "off", "1m", cert, key, "open", "  max_boots: 2\n")
	for _, c := range []string{"pcA", "pcB"} {
		killedAfterWrite(t, r.uri+"/golden/"+c+"/b1", "write -P 0x01 0 512")
	}
	expectRefused(t, r.uri+"/golden/pcC/b1", true, "max_boots", "a third live boot with max_boots 2", "read 0 512")
	// The base's read-only view is no boot, and stays open to all.
	if ok, out := qemuIO(t, r.uri+"/golden", true, "read 0 512"); !ok {
		t.Fatalf("the base's view with every boot slot taken:\n%s", out)
	}
}

// TestStreamSecondConnectionDoesNotEndTheBoot: a boot ends when its last
// connection leaves cleanly after writing. A second connection of the
// boot that writes and leaves cleanly while the first is still connected
// must not end it: the first one's writes stay, and so do the second's.
func TestStreamSecondConnectionDoesNotEndTheBoot(t *testing.T) {
	r := startStream(t, "off", "1m")
	a := r.uri + "/golden/vmS/boot1"
	port := strings.TrimPrefix(r.uri, "nbd://127.0.0.1:")
	// Line-buffered, so that its output shows the write as it happens.
	first := exec.Command("stdbuf", "-oL", "qemu-io", "--image-opts",
		"-c", "write -P 0x11 0 4096", "-c", "sleep 2000", "-c", "read -P 0x11 0 4096", "-c", "read -P 0x22 65536 4096",
		"driver=raw,file.driver=nbd,file.host=127.0.0.1,file.port="+port+",file.export=golden/vmS/boot1")
	var out testkit.Buffer
	first.Stdout, first.Stderr = &out, &out
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "wrote 4096/4096") {
		if time.Now().After(deadline) {
			t.Fatalf("the first connection never wrote:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, o := qemuIO(t, a, false, "write -P 0x22 65536 4096"); !ok {
		t.Fatalf("the second connection's write:\n%s", o)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first connection: %v\n%s", err, out.String())
	}
	if s := out.String(); strings.Count(s, "read 4096/4096") != 2 || strings.Contains(s, "failed") {
		t.Fatalf("after a second connection wrote and left, the first one's boot lost writes:\n%s", s)
	}
}

// TestStreamBootCaps: one client name cannot make the server hold boots
// (each with a write cache) without end.
func TestStreamBootCaps(t *testing.T) {
	r := startStream(t, "off", "1m") // stream.max_boots_per_client: 4 by default
	for i := range 4 {
		killedAfterWrite(t, fmt.Sprintf("%s/golden/greedy/b%d", r.uri, i), "write -P 0x01 0 512")
	}
	if ok, out := qemuIO(t, r.uri+"/golden/greedy/b9", true, "read 0 512"); ok || !strings.Contains(out, "max_boots_per_client") {
		t.Fatalf("a fifth live boot of one client was accepted, or refused without the reason:\n%s", out)
	}
	if ok, out := qemuIO(t, r.uri+"/golden/modest/b1", true, "read 0 512"); !ok {
		t.Fatalf("another client was refused:\n%s", out)
	}
}

// qemuIOTLS is qemuIO through qemu's own NBD client over TLS, with the
// credentials (ca-cert.pem, and a client certificate when present) in dir.
func qemuIOTLS(dir, port, export string, cmds ...string) (bool, string) {
	args := []string{"--object", "tls-creds-x509,id=tls0,endpoint=client,dir=" + dir, "--image-opts"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	args = append(args, "driver=raw,file.driver=nbd,file.host=127.0.0.1,file.port="+port+",file.export="+export+",file.tls-creds=tls0")
	out, err := exec.Command("qemu-io", args...).CombinedOutput()
	s := string(out)
	return err == nil && !strings.Contains(s, "failed") && !strings.Contains(s, "error"), s
}

// mapScript runs its arguments after the URI on the export: "w OFF"
// writes 64 KiB at OFF, "z OFF" zeroes 64 KiB there, "one OFF" asks for
// the status from OFF with NBD_CMD_FLAG_REQ_ONE and prints "one N" for
// the N extents the server sent, and "map" prints the base:allocation map
// with adjacent extents of one kind merged, one "offset length flags" a
// line, and a "--" line after it.
const mapScript = `
import nbd, sys
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(sys.argv[1])
def show():
    ext = []
    def cb(meta, off, entries, err):
        if meta == nbd.CONTEXT_BASE_ALLOCATION:
            ext.extend(zip(entries[0::2], entries[1::2]))
    off, size = 0, h.get_size()
    while off < size:
        n = len(ext)
        h.block_status(size - off, off, cb)
        off += sum(l for l, _ in ext[n:])
    merged = []
    for l, f in ext:
        if merged and merged[-1][1] == f:
            merged[-1][0] += l
        else:
            merged.append([l, f])
    pos = 0
    for l, f in merged:
        print(pos, l, f)
        pos += l
    print("--")
for cmd in sys.argv[2:]:
    op, _, off = cmd.partition(" ")
    if op == "w":
        h.pwrite(b"w" * 65536, int(off))
    elif op == "z":
        h.zero(65536, int(off))
    elif op == "one":
        got = []
        def one(meta, o, entries, err):
            if meta == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(entries[0::2])
        h.block_status(h.get_size() - int(off), int(off), one, nbd.CMD_FLAG_REQ_ONE)
        print("one", len(got))
    else:
        show()
`

// blockMap runs mapScript on uri with cmds and returns what it printed.
func blockMap(t *testing.T, uri string, cmds ...string) string {
	t.Helper()
	testkit.Require(t, "/usr/bin/python3")
	out, err := exec.Command("/usr/bin/python3", append([]string{"-c", mapScript, uri}, cmds...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("block status of %s: %v\n%s", uri, err, out)
	}
	return string(out)
}

// TestStreamBlockStatusByLayer: after a client writes, block status still
// reports the base's holes and exactly the written blocks as data, as
// nbdkit's cow filter does over the same base: in a boot, in a private
// image and on a version whose delta changed blocks; zeroes written
// read as zero.
func TestStreamBlockStatusByLayer(t *testing.T) {
	testkit.Require(t, "nbdkit")
	r := startStream(t, "off", "1m")
	port := testkit.FreePort(t)
	cow := testkit.Start(t, nil, "nbdkit", "-f", "-i", "127.0.0.1", "-p", fmt.Sprint(port), "--filter=cow", "file", r.base)
	if err := testkit.WaitPort(fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, cow.Log.String())
	}
	// 64 KiB into a base hole, over base data, and beside base data.
	writes := []string{"w 8388608", "w 1048576", "w 42008576"}
	cowURI := fmt.Sprintf("nbd://127.0.0.1:%d", port)
	want := blockMap(t, cowURI, append(writes, "map")...)
	if !strings.Contains(want, "8388608 65536 0\n") || strings.Count(want, "\n") < 7 {
		t.Fatalf("nbdkit cow map is not the one this test expects:\n%s", want)
	}
	got := blockMap(t, r.uri+"/golden/mapper/b1", append(writes, "map", "one 0", "z 20971520", "map")...)
	before, after, _ := strings.Cut(got, "--\n")
	if before+"--\n" != want {
		t.Errorf("boot map differs from nbdkit cow's\ndeskway:\n%s\nnbdkit cow:\n%s", before, want)
	}
	if !strings.Contains(after, "one 1\n") {
		t.Errorf("a status request with NBD_CMD_FLAG_REQ_ONE got other than one extent:\n%s", after)
	}
	if !strings.Contains(after, "20971520 65536 2\n") {
		t.Errorf("64 KiB of written zeroes at 20 MiB not reported as zero:\n%s", after)
	}
	if got := blockMap(t, r.uri+"/personal/alice", append(writes, "map")...); got != want {
		t.Errorf("private image map differs from nbdkit cow's\ndeskway:\n%s\nnbdkit cow:\n%s", got, want)
	}
	// A version that changed 64 KiB in a base hole: a boot of it writing
	// the same three blocks sees four, as cow does after four writes.
	var v struct {
		Version int `json:"version"`
	}
	r.api(t, "POST", "/api/v1/stream/vdisks/golden/versions", http.StatusCreated, &v)
	blockMap(t, r.uri+"/golden@maintenance/admin", "w 31457280")
	path := fmt.Sprintf("/api/v1/stream/vdisks/golden/versions/%d/promote", v.Version)
	r.api(t, "POST", path, http.StatusOK, nil)
	r.api(t, "POST", path, http.StatusOK, nil)
	want = blockMap(t, cowURI, "w 31457280", "map")
	if got := blockMap(t, r.uri+"/golden/mapper/b2", append(writes, "map")...); got != want {
		t.Errorf("map over a version's delta differs from nbdkit cow's\ndeskway:\n%s\nnbdkit cow:\n%s", got, want)
	}
}

// TestStreamCacheQuota: one client, or all of them together, cannot make
// the server hold write-cache bytes without end. A write past a cap fails
// with ENOSPC and the server's reason, as on a full disk; what the client
// wrote before stays, rewriting it and zeroing whole blocks still work,
// and the bytes come back when a boot ends.
func TestStreamCacheQuota(t *testing.T) {
	t.Run("RAM and spill", func(t *testing.T) { testCacheQuota(t, "") })
	t.Run("shared cache", func(t *testing.T) { testCacheQuota(t, "  shared_cache: true\n") })
}

func testCacheQuota(t *testing.T, extra string) {
	_, _, cert, key := testkit.TLS(t)
	r := startStreamWith(t, "off", "1m", cert, key, "open", extra+"  max_cache_mb: 2\n  max_cache_mb_per_client: 1\n")
	// A session that leaves without NBD_CMD_DISC keeps its boot alive.
	const hangUp = "\nimport os\nos._exit(0)\n"
	try := func(what string) string {
		return fmt.Sprintf(`
try:
    %s
    print("ok")
except nbd.Error as e:
    print("refused:", e.errno, e.string)
`, what)
	}
	out, err := nbdsh(t, r.uri+"/golden/filler/b1", `
h.pwrite(b"a" * (1 << 20), 0)
`+try(`h.pwrite(b"b" * 4096, 8 << 20)`)+`
h.pwrite(b"c" * (1 << 20), 0)
h.zero(1 << 20, 4 << 20)
assert h.pread(1 << 20, 0) == b"c" * (1 << 20)
assert h.pread(4096, 8 << 20) == bytes(4096)
print("rewrote")
`+hangUp)
	if err != nil || !strings.Contains(out, "refused: ENOSPC") || !strings.Contains(out, "rewrote") {
		t.Fatalf("per-client cap: %v\n%s", err, out)
	}
	if !strings.Contains(r.log.Log.String(), "max_cache_mb_per_client") {
		t.Errorf("the refusal does not name stream.max_cache_mb_per_client in the server log:\n%s", r.log.Log.String())
	}
	if out, err := nbdsh(t, r.uri+"/golden/other/b1", `h.pwrite(b"o" * (1 << 20), 0)`+hangUp); err != nil {
		t.Fatalf("another client under its cap: %v\n%s", err, out)
	}
	out, err = nbdsh(t, r.uri+"/golden/third/b1", try(`h.pwrite(b"t" * 4096, 0)`)+hangUp)
	if err != nil || !strings.Contains(out, "refused: ENOSPC") {
		t.Fatalf("global cap: %v\n%s", err, out)
	}
	if !strings.Contains(r.log.Log.String(), "stream.max_cache_mb (2 MiB)") {
		t.Errorf("the refusal does not name stream.max_cache_mb in the server log:\n%s", r.log.Log.String())
	}
	// filler ends its boot cleanly: its megabyte is free again.
	if out, err := nbdsh(t, r.uri+"/golden/filler/b1", `
h.pwrite(b"c" * 4096, 0)
h.shutdown()
`); err != nil {
		t.Fatalf("ending filler's boot: %v\n%s", err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err = nbdsh(t, r.uri+"/golden/third/b1", try(`h.pwrite(b"t" * 4096, 0)`)+hangUp)
		if err == nil && strings.Contains(out, "ok") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bytes of an ended boot did not come back: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// floodFrom opens n TCP connections to addr from the loopback address src
// that send nothing, and says how many the server greeted (the rest it
// closed at once). The connections stay open until the test ends.
func floodFrom(t *testing.T, addr, src string, n int) (greeted int, conns []net.Conn) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			continue // the listen queue is full: as good as refused
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		magic := make([]byte, 8)
		if _, err := io.ReadFull(c, magic); err == nil && string(magic) == "NBDMAGIC" {
			greeted++
		}
	}
	return greeted, conns
}

// greets reports whether a new connection to addr gets the NBD greeting.
func greets(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	magic := make([]byte, 8)
	_, err = io.ReadFull(c, magic)
	return err == nil && string(magic) == "NBDMAGIC"
}

// TestStreamUnauthenticatedFloodCannotEndBoots: anyone who reaches the
// port can open connections that never negotiate. They are capped per
// source address and in all, and a server that runs out of descriptors
// waits and accepts again instead of stopping: stopping would end every
// live boot, whose writes then are lost.
func TestStreamUnauthenticatedFloodCannotEndBoots(t *testing.T) {
	_, _, cert, key := testkit.TLS(t)
	r := startStreamWith(t, "off", "5m", cert, key, "open", "  max_unauthenticated: 24\n  max_unauthenticated_per_address: 8\n")
	a := r.uri + "/golden/vmF/boot1"
	killedAfterWrite(t, a, "write -P 0x5e 0 65536")

	t.Run("caps per address and in all", func(t *testing.T) {
		if greeted, _ := floodFrom(t, r.addr, "127.0.0.3", 40); greeted != 8 {
			t.Fatalf("one address holds %d negotiating connections, want the cap of 8", greeted)
		}
		floodFrom(t, r.addr, "127.0.0.4", 8)
		floodFrom(t, r.addr, "127.0.0.5", 8) // 24 in all now
		if greeted, _ := floodFrom(t, r.addr, "127.0.0.6", 4); greeted != 0 {
			t.Fatalf("%d connections greeted past the cap of 24 in all", greeted)
		}
		if !strings.Contains(r.log.Log.String(), "connection refused before negotiation") {
			t.Fatalf("refusals not logged:\n%s", r.log.Log.String())
		}
	})
	// The flood's connections are closed: the caps are free again, and
	// the boot (whose client comes from 127.0.0.1) reads its write.
	if ok, out := qemuIO(t, a, true, "read -P 0x5e 0 65536"); !ok {
		t.Fatalf("the boot's write after the flood:\n%s", out)
	}

	t.Run("out of descriptors", func(t *testing.T) {
		pid := r.log.Cmd.Process.Pid
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			t.Fatal(err)
		}
		// Room for a few more descriptors only: the flood takes them all.
		// Only the soft limit is lowered, so that it can be raised again.
		soft := strings.TrimSpace(runOK(t, "prlimit", "--pid", fmt.Sprint(pid), "--nofile", "--output", "SOFT", "--noheadings"))
		runOK(t, "prlimit", "--pid", fmt.Sprint(pid), fmt.Sprintf("--nofile=%d:", len(fds)+4))
		var flood []net.Conn
		for _, src := range []string{"127.0.0.7", "127.0.0.8"} {
			_, cs := floodFrom(t, r.addr, src, 8)
			flood = append(flood, cs...)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(r.log.Log.String(), "accept failed; retrying") {
			if time.Now().After(deadline) {
				t.Fatalf("the server never ran out of descriptors:\n%s", r.log.Log.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, c := range flood {
			c.Close()
		}
		// With the flood's descriptors back the server greets again; a
		// server that gave up has exited by then.
		deadline = time.Now().Add(10 * time.Second)
		for !greets(r.addr) {
			if exited(t, pid) {
				t.Fatalf("the server stopped when it ran out of descriptors:\n%s", r.log.Log.String())
			}
			if time.Now().After(deadline) {
				t.Fatalf("the server does not greet once descriptors are free again:\n%s", r.log.Log.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		if exited(t, pid) {
			t.Fatalf("the server stopped when it ran out of descriptors:\n%s", r.log.Log.String())
		}
		runOK(t, "prlimit", "--pid", fmt.Sprint(pid), "--nofile="+soft+":")
		if ok, out := qemuIO(t, a, true, "read -P 0x5e 0 65536"); !ok {
			t.Fatalf("the boot after the server ran out of descriptors:\n%s", out)
		}
	})
}
