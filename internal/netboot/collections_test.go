package netboot

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/config"
)

// TestCollectionsActAsUnits drives the admin API's collections over
// HTTP: assign, disable and enable change every device of a collection
// and no other; a change that does not fit leaves every device as it
// was; an empty collection is refused in words; the device list shows
// what each device runs now beside its assignment, and Assigned names
// the devices of a stage.
func TestCollectionsActAsUnits(t *testing.T) {
	dir := t.TempDir()
	st := &config.Stream{Listen: "10.77.0.1:10809", VDisks: []config.VDisk{{Name: "golden"}, {Name: "win11"}},
		Netboot: &config.Netboot{Interface: "br0", Address: "10.77.0.1", HTTPPort: 8069, DHCP: "proxy"}}
	live := []LiveBoot{{Client: "lab1", Running: Running{VDisk: "golden", Version: 3, Stage: "production", Boot: "b1"}}}
	s, err := New(st, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: dir, StreamPort: "10809",
		Live: func() []LiveBoot { return live }})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(s.AdminHandler())
	t.Cleanup(api.Close)
	call := func(method, path, body string, want int) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(method, api.URL+path, strings.NewReader(body))
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
	for i, name := range []string{"lab1", "lab2", "lab3", "office1"} {
		coll := "lab"
		if name == "office1" {
			coll = "office"
		}
		call("POST", "/api/v1/stream/devices", `{"mac":"52:54:00:77:01:0`+string(rune('1'+i))+`","name":"`+name+`","collection":"`+coll+`","vdisk":"golden","disabled":true}`, http.StatusCreated)
	}
	devices := func() map[string]DeviceStatus {
		out := map[string]DeviceStatus{}
		for _, d := range s.statuses() {
			out[d.Name] = d
		}
		return out
	}
	got := call("POST", "/api/v1/stream/collections/lab/assign", `{"vdisk":"win11","stage":"test"}`, http.StatusOK)
	if n := len(got["devices"].([]any)); n != 3 {
		t.Fatalf("assign answered %d devices, want the collection's 3: %v", n, got)
	}
	call("POST", "/api/v1/stream/collections/lab/enable", ``, http.StatusOK)
	for name, d := range devices() {
		inLab := strings.HasPrefix(name, "lab")
		if inLab != (d.VDisk == "win11" && d.Stage == "test" && d.Enabled) {
			t.Errorf("%s after the collection lab's assign and enable: %+v", name, d.Device)
		}
	}
	if a := s.Assigned("win11", []string{"test"}); !slices.Equal(a, []string{"lab1 (test)", "lab2 (test)", "lab3 (test)"}) {
		t.Errorf("Assigned(win11, test) = %v", a)
	}
	if a := s.Assigned("golden", []string{"production"}); !slices.Equal(a, []string{"office1 (production)"}) {
		t.Errorf("Assigned(golden, production) = %v", a)
	}

	// One device the change does not fit: none changes.
	s.Devices().Update("lab2", func(d *Device) error { d.Name = "../lab2"; return nil })
	msg := call("POST", "/api/v1/stream/collections/lab/assign", `{"vdisk":"golden"}`, http.StatusBadRequest)["error"].(string)
	if !strings.Contains(msg, "device ../lab2: device name") || !strings.Contains(msg, "no device of collection lab was changed") {
		t.Fatalf("a change one device does not fit: %q", msg)
	}
	if d := devices()["lab1"]; d.VDisk != "win11" {
		t.Fatalf("lab1 changed by a refused collection change: %+v", d.Device)
	}
	s.Devices().Update("../lab2", func(d *Device) error { d.Name = "lab2"; return nil })

	msg = call("POST", "/api/v1/stream/collections/lab/assign", `{"vdisk":"nope"}`, http.StatusBadRequest)["error"].(string)
	if !strings.Contains(msg, `no vDisk "nope" in stream.vdisks (there are: golden, win11)`) {
		t.Fatalf("an unknown vDisk: %q", msg)
	}
	if msg := call("POST", "/api/v1/stream/collections/lab/assign", `{}`, http.StatusBadRequest)["error"].(string); !strings.Contains(msg, "name the vDisk") {
		t.Fatalf("no vDisk: %q", msg)
	}
	if msg := call("POST", "/api/v1/stream/collections/kiosk/disable", ``, http.StatusNotFound)["error"].(string); !strings.Contains(msg, `no device is in collection "kiosk"`) {
		t.Fatalf("an empty collection: %q", msg)
	}
	call("POST", "/api/v1/stream/collections/lab/disable", ``, http.StatusOK)
	for name, d := range devices() {
		if d.Enabled {
			t.Errorf("%s enabled after disable of lab (office1 was never enabled)", name)
		}
	}
	cs := call("GET", "/api/v1/stream/collections", ``, http.StatusOK)["collections"].([]any)
	if len(cs) != 2 || cs[0].(map[string]any)["name"] != "lab" || cs[0].(map[string]any)["devices"].(float64) != 3 {
		t.Fatalf("collections: %v", cs)
	}

	// What each device runs now, beside its assignment.
	list := call("GET", "/api/v1/stream/devices", ``, http.StatusOK)["devices"].([]any)
	for _, d := range list {
		d := d.(map[string]any)
		r, _ := d["running"].([]any)
		if d["name"] == "lab1" {
			if len(r) != 1 || r[0].(map[string]any)["version"].(float64) != 3 || r[0].(map[string]any)["vdisk"] != "golden" {
				t.Errorf("lab1's running: %v", d)
			}
		} else if len(r) != 0 {
			t.Errorf("%s runs %v, but has no live boot", d["name"], r)
		}
	}
}
