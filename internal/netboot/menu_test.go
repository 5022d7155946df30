package netboot

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/config"
)

func menuService(t *testing.T) (*Service, *httptest.Server) {
	t.Helper()
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	os.WriteFile(kernel, []byte("kernel"), 0o644)
	var vds []config.VDisk
	for _, n := range []string{"golden", "other", "secret"} {
		vds = append(vds, config.VDisk{Name: n, Mode: "standard", Kernel: kernel, Initrd: kernel})
	}
	st := &config.Stream{Listen: "10.77.0.1:10809", VDisks: vds,
		Netboot: &config.Netboot{Interface: "br0", Address: "10.77.0.1", HTTPPort: 8069, DHCP: "proxy"}}
	s, err := New(st, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: dir, StreamPort: "10809"})
	if err != nil {
		t.Fatal(err)
	}
	s.Devices().Add(Device{MAC: "52:54:00:77:00:01", Name: "pc1", Collection: "lab", VDisk: "golden", Enabled: true})
	s.Devices().Add(Device{MAC: "52:54:00:77:00:02", Name: "pc2", Collection: "lab", VDisk: "golden", Enabled: true})
	api := httptest.NewServer(s.AdminHandler())
	t.Cleanup(api.Close)
	return s, api
}

// put sends body to path on the admin API and returns the status and
// the error it answered with, if any.
func put(t *testing.T, api *httptest.Server, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("PUT", api.URL+path, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	msg, _ := out["error"].(string)
	return resp.StatusCode, msg
}

// TestBootMenuScript: a device's menu, set over the admin API, is its
// iPXE script, line for line: an item with its key per entry, the
// default at the timeout (and at Escape), and the choice chained back
// with the device's MAC. The chosen entry boots that vDisk and stage;
// a collection's menu reaches each of its devices; menus naming what
// does not exist, or another vDisk's maintenance, are refused in words.
func TestBootMenuScript(t *testing.T) {
	s, api := menuService(t)
	if code, msg := put(t, api, "/api/v1/stream/devices/pc1/menu", `{"menu":{"entries":["golden","golden@maintenance","other"],"default":"other","timeout":5}}`); code != http.StatusOK {
		t.Fatalf("PUT menu: %d %s", code, msg)
	}
	script := func(query string) string {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/netboot/device?"+query, nil))
		return rec.Body.String()
	}
	want := "#!ipxe\n" +
		"menu deskway: device pc1, choose what to boot\n" +
		"item --key 1 golden 1. golden\n" +
		"item --key 2 golden@maintenance 2. golden (maintenance)\n" +
		"item --key 3 other 3. other\n" +
		"choose --timeout 5000 --default other entry || set entry other\n" +
		"chain http://10.77.0.1:8069/netboot/device?mac=52%3A54%3A00%3A77%3A00%3A01&entry=${entry}\n"
	if got := script("mac=52:54:00:77:00:01"); got != want {
		t.Fatalf("pc1's menu script:\n%s\nwant:\n%s", got, want)
	}
	for entry, export := range map[string]string{"other": "deskway.export=other/pc1/", "golden@maintenance": "deskway.export=golden@maintenance/pc1/"} {
		if got := script("mac=52:54:00:77:00:01&entry=" + url.QueryEscape(entry)); !strings.Contains(got, "\nkernel http://10.77.0.1:8069/netboot/vdisks/"+strings.Split(entry, "@")[0]+"/kernel ") || !strings.Contains(got, export) {
			t.Errorf("entry %s: script\n%s\nwant %s", entry, got, export)
		}
	}
	for body, msg := range map[string]string{
		`{"menu":{"entries":["golden","nothere"]}}`:         `boot menu entry "nothere": no vDisk "nothere" in stream.vdisks`,
		`{"menu":{"entries":["other@maintenance"]}}`:        `a device may boot maintenance only of the vDisk assigned to it (golden)`,
		`{"menu":{"entries":["golden@staging"]}}`:           `stage "staging" is not production, test or maintenance`,
		`{"menu":{"entries":["golden"],"default":"other"}}`: `the boot menu's default "other" is not one of its entries`,
		`{"menu":{"entries":["golden"],"timeout":3600}}`:    `the boot menu's timeout is 3600 s`,
		`{"menu":{"entries":[]}}`:                           `a boot menu lists 1 to 9 entries, not 0`,
		`{"menu":{"entries":["golden","other","golden"]}}`:  `boot menu entry "golden" is listed twice`,
	} {
		if code, got := put(t, api, "/api/v1/stream/devices/pc1/menu", body); code != http.StatusBadRequest || !strings.Contains(got, msg) {
			t.Errorf("PUT %s: %d %q, want 400 %q", body, code, got, msg)
		}
	}
	// A collection's menu: every device of it.
	if code, msg := put(t, api, "/api/v1/stream/collections/lab/menu", `{"menu":{"entries":["golden","other"],"timeout":3}}`); code != http.StatusOK {
		t.Fatalf("PUT collection menu: %d %s", code, msg)
	}
	if got := script("mac=52:54:00:77:00:02"); !strings.Contains(got, "item --key 2 other 2. other\nchoose --timeout 3000 --default golden entry || set entry golden\n") {
		t.Fatalf("pc2's menu after its collection's:\n%s", got)
	}
	// No menu: the assigned vDisk again.
	if code, msg := put(t, api, "/api/v1/stream/devices/pc2/menu", `{"menu":null}`); code != http.StatusOK {
		t.Fatalf("PUT no menu: %d %s", code, msg)
	}
	if got := script("mac=52:54:00:77:00:02"); !strings.Contains(got, "deskway.export=golden/pc2/") {
		t.Fatalf("pc2 without a menu:\n%s", got)
	}
}

// TestBootMenuChoiceIsChecked plays a machine on the boot network that
// edits its menu's request, against the boot HTTP server: a vDisk that
// exists but is not on its menu, another stage of a menu's vDisk, a
// device with no menu naming an entry, and an entry that would write
// iPXE commands into the answer. Each is refused, and no answer names a
// kernel to boot.
func TestBootMenuChoiceIsChecked(t *testing.T) {
	s, api := menuService(t)
	if code, msg := put(t, api, "/api/v1/stream/devices/pc1/menu", `{"menu":{"entries":["golden","other"]}}`); code != http.StatusOK {
		t.Fatalf("PUT menu: %d %s", code, msg)
	}
	boot := httptest.NewServer(s.Handler())
	t.Cleanup(boot.Close)
	for _, q := range []string{
		"mac=52:54:00:77:00:01&entry=secret",
		"mac=52:54:00:77:00:01&entry=golden@maintenance",
		"mac=52:54:00:77:00:01&entry=golden@test",
		"mac=52:54:00:77:00:02&entry=secret",
		"mac=52:54:00:77:00:01&entry=" + url.QueryEscape("secret\nkernel http://evil/kernel"),
	} {
		resp, err := http.Get(boot.URL + "/netboot/device?" + q)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body := string(b)
		if strings.Contains(body, "\nkernel ") || strings.Contains(body, "secret") || !strings.Contains(body, "deskway: device pc") {
			t.Errorf("GET ?%s answered:\n%s", q, body)
		}
	}
}
