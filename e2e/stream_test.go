package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

func TestStreamRealClients(t *testing.T) {
	parallel(t)
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
	parallel(t)
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
	parallel(t)
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
	parallel(t)
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

// TestStreamRestartRefusesALostBoot: without shared caches a boot's
// writes live in the server, so a server that stops (killed, or even
// stopped cleanly) loses them. A client that comes back to that boot must
// be refused with the reason, never handed the base disk as if nothing
// had been written; a new boot of the same client starts clean.
func TestStreamRestartRefusesALostBoot(t *testing.T) {
	parallel(t)
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
	parallel(t)
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

// TestStreamClientCertificates: with stream.clients: certificate a client
// is who its certificate from deskway's CA says, with qemu's tls-creds
// and libnbd's tls-certificates; it opens its own boots and private
// image only, and maintenance needs the role.
func TestStreamClientCertificates(t *testing.T) {
	parallel(t)
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
