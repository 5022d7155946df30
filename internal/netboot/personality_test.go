package netboot

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/config"
)

// TestPersonality sets a device's personality over the admin API and
// finds it on the kernel command line of its boot script, by key; keys
// and values that would break the command line or the file the
// initramfs writes are refused in words, and the device keeps the
// personality it had.
func TestPersonality(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	st := &config.Stream{Listen: "10.77.0.1:10809", VDisks: []config.VDisk{{Name: "golden", Mode: "standard", Kernel: kernel, Initrd: kernel}},
		Netboot: &config.Netboot{Interface: "br0", Address: "10.77.0.1", HTTPPort: 8069, DHCP: "proxy"}}
	s, err := New(st, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: dir, StreamPort: "10809"})
	if err != nil {
		t.Fatal(err)
	}
	s.Devices().Add(Device{MAC: "52:54:00:77:00:01", Name: "pc1", VDisk: "golden", Enabled: true})
	api := httptest.NewServer(s.AdminHandler())
	t.Cleanup(api.Close)
	put := func(body string, want int) string {
		t.Helper()
		req, _ := http.NewRequest("PUT", api.URL+"/api/v1/stream/devices/pc1/personality", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		if resp.StatusCode != want {
			t.Fatalf("PUT %s: %d %v, want %d", body, resp.StatusCode, out, want)
		}
		msg, _ := out["error"].(string)
		return msg
	}
	script := func() string {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/netboot/device?mac=52:54:00:77:00:01", nil))
		return rec.Body.String()
	}
	put(`{"personality":{"role":"kiosk","host_name":"pc1.lab","site":"north"}}`, http.StatusOK)
	if sc := script(); !strings.Contains(sc, " BOOTIF=01-52-54-00-77-00-01 deskway.p.host_name=pc1.lab deskway.p.role=kiosk deskway.p.site=north\n") {
		t.Fatalf("pc1's script has no personality after BOOTIF, by key:\n%s", sc)
	}
	for body, want := range map[string]string{
		`{"personality":{"role":"kiosk lab"}}`:                     `personality value of role, "kiosk lab": use letters, digits`,
		`{"personality":{"role":"a;reboot"}}`:                      `personality value of role, "a;reboot"`,
		`{"personality":{"Role":"kiosk"}}`:                         `personality key "Role": use lower-case letters`,
		`{"personality":{"x":"` + strings.Repeat("v", 129) + `"}}`: `personality value of x`,
	} {
		if msg := put(body, http.StatusBadRequest); !strings.Contains(msg, want) {
			t.Errorf("PUT %s refused with %q, want %q", body, msg, want)
		}
	}
	big := `{"personality":{`
	for i := 0; i < 12; i++ {
		big += `"k` + string(rune('a'+i)) + `":"` + strings.Repeat("v", 100) + `",`
	}
	if msg := put(strings.TrimSuffix(big, ",")+`}}`, http.StatusBadRequest); !strings.Contains(msg, "bytes of the kernel command line; at most 1024") {
		t.Errorf("a personality too long for the command line: %q", msg)
	}
	if sc := script(); !strings.Contains(sc, "deskway.p.role=kiosk") {
		t.Fatalf("a refused personality changed pc1's:\n%s", sc)
	}
	put(`{"personality":{}}`, http.StatusOK)
	if sc := script(); strings.Contains(sc, "deskway.p.") {
		t.Fatalf("a cleared personality is still on the command line:\n%s", sc)
	}
}
