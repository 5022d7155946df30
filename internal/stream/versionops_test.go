package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/nbdclient"
)

// TestVersionDemoteAndDelete drives the admin API of a running server:
// a production version is demoted (reverted) and the next boot gets the
// one before it while a running boot keeps its version; the only
// production version is not demoted, and the refusal says what to do; a
// version is not deleted while a device runs it, is assigned to it, or
// another version is built on it, and each refusal names the devices or
// the version; deleted, its files are gone; the newest test version goes
// back to maintenance and can be written again.
func TestVersionDemoteAndDelete(t *testing.T) {
	dir := t.TempDir()
	basePath := filepath.Join(dir, "base.img")
	os.WriteFile(basePath, bytes.Repeat([]byte{'b'}, 1<<20), 0o400)
	cfg := &config.Config{StateDir: dir, Stream: &config.Stream{TLS: "off", Clients: "open", ReconnectWindow: config.Duration(time.Minute),
		VDisks: []config.VDisk{{Name: "golden", Base: basePath}}}}
	cfg.ApplyDefaults()
	s, err := New(cfg.Stream, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	assigned := map[string][]string{} // stage: devices
	s.SetAssigned(func(vdisk string, stages []string) []string {
		var out []string
		for _, st := range stages {
			for _, d := range assigned[st] {
				out = append(out, d+" ("+st+")")
			}
		}
		return out
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	api := httptest.NewServer(s.AdminHandler())
	t.Cleanup(api.Close)
	call := func(method, path string, want int) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(method, api.URL+"/api/v1/stream/vdisks/golden"+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %v, want %d", method, path, resp.StatusCode, out, want)
		}
		return out
	}
	refused := func(method, path string, words ...string) {
		t.Helper()
		msg, _ := call(method, path, http.StatusConflict)["error"].(string)
		for _, w := range words {
			if !strings.Contains(msg, w) {
				t.Fatalf("%s %s refused with %q, which lacks %q", method, path, msg, w)
			}
		}
	}
	dial := func(export string) *nbdclient.Client {
		t.Helper()
		c, err := nbdclient.Dial(ctx, ln.Addr().String(), export, nbdclient.Options{Structured: true})
		if err != nil {
			t.Fatalf("%s: %v", export, err)
		}
		return c
	}
	// A version with block 0 written as fill, taken to production.
	release := func(fill byte) int {
		t.Helper()
		n := int(call("POST", "/versions", http.StatusCreated)["version"].(float64))
		m := dial("golden@maintenance/admin")
		if err := m.WriteAt(bytes.Repeat([]byte{fill}, 4096), 0, true); err != nil {
			t.Fatal(err)
		}
		m.Close()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			req, _ := http.NewRequest("POST", api.URL+"/api/v1/stream/vdisks/golden/versions/"+strconv.Itoa(n)+"/promote", nil)
			resp, err := http.DefaultClient.Do(req)
			if err == nil && resp.StatusCode == http.StatusOK {
				resp.Body.Close()
				break
			}
			if resp != nil {
				resp.Body.Close()
			}
			if time.Now().After(deadline) {
				t.Fatalf("version %d could not be promoted out of maintenance", n)
			}
		}
		call("POST", "/versions/"+strconv.Itoa(n)+"/promote", http.StatusOK)
		return n
	}
	first := release('1')
	refused("POST", "/versions/1/demote", "version 1 is the only production version of golden", "Promote the version they should boot to production first")
	refused("POST", "/versions/0/demote", "version 0 is the base image")
	second := release('2')

	pc1 := dial("golden/pc1/b1")
	if err := pc1.WriteAt(bytes.Repeat([]byte{'w'}, 4096), 8192, true); err != nil {
		t.Fatal(err)
	}
	running := func(client string) float64 {
		t.Helper()
		for _, b := range s.Boots() {
			if b.Client == client {
				return float64(b.Version)
			}
		}
		t.Fatalf("no live boot of %s in %+v", client, s.Boots())
		return 0
	}
	if v := running("pc1"); v != float64(second) {
		t.Fatalf("pc1 booted version %v, want %d", v, second)
	}
	refused("DELETE", "/versions/1", "version 2 is built on version 1")
	assigned["production"] = []string{"pc1"}
	refused("DELETE", "/versions/2", "version 2 is what production clients of golden boot (device pc1 (production))", "demote it first")

	// Reverted: production clients boot version 1 again; pc1 keeps 2.
	if v := call("POST", "/versions/2/demote", http.StatusOK); v["stage"] != StageTest {
		t.Fatalf("demoted: %v", v)
	}
	pc2 := dial("golden/pc2/b1")
	b := make([]byte, 4096)
	if _, err := pc2.ReadAt(b, 0); err != nil || b[0] != '1' {
		t.Fatalf("a new production boot after the revert reads %q, want version 1's", b[0])
	}
	if _, err := pc1.ReadAt(b, 0); err != nil || b[0] != '2' {
		t.Fatalf("the boot that started on version 2 reads %q after the revert, want version 2's", b[0])
	}
	pc2.Close()

	assigned = map[string][]string{"test": {"lab1", "lab2"}}
	refused("DELETE", "/versions/2", "devices lab1 (test), lab2 (test) are assigned to vDisk golden at the stage that boots version 2")
	assigned = nil
	refused("DELETE", "/versions/2", "device pc1 is running version 2 of golden")
	refused("POST", "/versions/2/demote", "device pc1 is running version 2")
	pc1.Close()
	for deadline := time.Now().Add(10 * time.Second); slices.ContainsFunc(s.Boots(), func(b BootInfo) bool { return b.Client == "pc1" }); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("pc1's boot did not end with its clean disconnect")
		}
	}

	// Back to maintenance, written again, promoted again.
	if v := call("POST", "/versions/2/demote", http.StatusOK); v["stage"] != StageMaintenance {
		t.Fatalf("demoted from test: %v", v)
	}
	refused("POST", "/versions/1/demote", "version 1 is the only production version")
	m := dial("golden@maintenance/admin")
	if err := m.WriteAt(bytes.Repeat([]byte{'3'}, 4096), 0, true); err != nil {
		t.Fatal(err)
	}
	refused("DELETE", "/versions/2", "version 2 is open for maintenance by a client")
	m.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		req, _ := http.NewRequest("DELETE", api.URL+"/api/v1/stream/vdisks/golden/versions/2", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("version 2 not deleted once its writer left: %d", resp.StatusCode)
		}
	}
	if _, err := os.Stat(s.byName["golden"].deltaDir(2)); !os.IsNotExist(err) {
		t.Fatalf("version 2's delta is still there: %v", err)
	}
	vs := call("GET", "/versions", http.StatusOK)["versions"].([]any)
	if len(vs) != 2 || vs[1].(map[string]any)["version"].(float64) != float64(first) {
		t.Fatalf("versions after the delete: %v", vs)
	}
	refused("DELETE", "/versions/0", "version 0 is the base image")
	refused("DELETE", "/versions/7", "vDisk golden has no version 7")
}
