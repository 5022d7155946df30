package netboot

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Menu is a boot menu, as LTSP's: the device's console lists the
// entries at power-on and boots the one chosen, or Default when Timeout
// passes with no key pressed.
type Menu struct {
	// Entries are what the device may boot, each VDISK or VDISK@STAGE;
	// the first is key 1 on its console, and so on.
	Entries []string `json:"entries"`
	// Default is the entry booted at the timeout; empty is the first.
	Default string `json:"default,omitempty"`
	// Timeout is how many seconds the menu waits for a key; 0 waits
	// until one is pressed.
	Timeout int `json:"timeout"`
}

// Limits of a menu: a key 1-9 for each entry, and a timeout no one
// waits out by mistake.
const (
	maxMenuEntries = 9
	maxMenuTimeout = 600
)

// check says what is wrong with m for device d, if anything: every entry
// names a vDisk of vdisks and a stage, maintenance only of d's own
// vDisk (the one an administrator assigned it, whose maintenance
// version it may write), each once.
func (m *Menu) check(d *Device, vdisks []string) error {
	if m == nil {
		return nil
	}
	if len(m.Entries) == 0 || len(m.Entries) > maxMenuEntries {
		return fmt.Errorf("a boot menu lists 1 to %d entries, not %d (to remove the menu, set none)", maxMenuEntries, len(m.Entries))
	}
	for i, e := range m.Entries {
		vd, stage := splitEntry(e)
		if !slices.Contains(vdisks, vd) {
			return fmt.Errorf("boot menu entry %q: no vDisk %q in stream.vdisks (there are: %s)", e, vd, strings.Join(vdisks, ", "))
		}
		switch stage {
		case "production", "test":
		case "maintenance":
			if vd != d.VDisk {
				return fmt.Errorf("boot menu entry %q: a device may boot maintenance only of the vDisk assigned to it (%s)", e, orNone(d.VDisk))
			}
		default:
			return fmt.Errorf("boot menu entry %q: stage %q is not production, test or maintenance", e, stage)
		}
		if slices.Contains(m.Entries[:i], e) {
			return fmt.Errorf("boot menu entry %q is listed twice", e)
		}
	}
	if m.Default != "" && !slices.Contains(m.Entries, m.Default) {
		return fmt.Errorf("the boot menu's default %q is not one of its entries (%s)", m.Default, strings.Join(m.Entries, ", "))
	}
	if m.Timeout < 0 || m.Timeout > maxMenuTimeout {
		return fmt.Errorf("the boot menu's timeout is %d s: use 0 (wait for a key) to %d", m.Timeout, maxMenuTimeout)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// splitEntry returns an entry's vDisk and stage, production if it names
// none.
func splitEntry(e string) (vdisk, stage string) {
	vdisk, stage, ok := strings.Cut(e, "@")
	if !ok {
		stage = "production"
	}
	return vdisk, stage
}

// menuScript is the iPXE menu of device d: each entry with its key, the
// default chosen at the timeout (or at Escape), and the choice asked
// for with the device's script URL.
func (s *Service) menuScript(d Device) string {
	m := d.Menu
	def := m.Default
	if def == "" {
		def = m.Entries[0]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "menu deskway: device %s, choose what to boot\n", d.Name)
	for i, e := range m.Entries {
		vd, stage := splitEntry(e)
		label := vd
		if stage != "production" {
			label += " (" + stage + ")"
		}
		fmt.Fprintf(&b, "item --key %d %s %d. %s\n", i+1, e, i+1, label)
	}
	fmt.Fprintf(&b, "choose --timeout %d --default %s entry || set entry %s\n", m.Timeout*1000, def, def)
	fmt.Fprintf(&b, "chain %s/netboot/device?mac=%s&entry=${entry}\n", s.base(), url.QueryEscape(d.MAC))
	return b.String()
}

// choose makes d boot entry of its menu, which it chose at its console:
// an entry that is not its menu's is refused, whatever the request says,
// since anyone on the boot network can ask for a device's script. No
// entry leaves d as it is.
func (d *Device) choose(entry string) error {
	switch {
	case entry == "":
		return nil
	case d.Menu == nil:
		return fmt.Errorf("device %s has no boot menu to choose %q from", d.Name, entry)
	case !slices.Contains(d.Menu.Entries, entry):
		return fmt.Errorf("%q is not an entry of device %s's boot menu (%s)", entry, d.Name, strings.Join(d.Menu.Entries, ", "))
	}
	d.VDisk, d.Stage = splitEntry(entry)
	if d.Stage == "production" {
		d.Stage = ""
	}
	return nil
}

// menuRoutes adds the boot menus' part of the admin API to mux: a
// device's, and every device's of a collection at once.
func (s *Service) menuRoutes(mux *http.ServeMux) {
	type request struct {
		// Menu nil removes the menu.
		Menu *Menu `json:"menu"`
	}
	set := func(req request) func(*Device) error {
		return func(d *Device) error {
			d.Menu = req.Menu
			return d.Check(s.names)
		}
	}
	mux.HandleFunc("PUT /api/v1/stream/devices/{name}/menu", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if !decode(w, r, &req) {
			return
		}
		s.change(w, r, set(req))
	})
	mux.HandleFunc("PUT /api/v1/stream/collections/{name}/menu", func(w http.ResponseWriter, r *http.Request) {
		var req request
		if !decode(w, r, &req) {
			return
		}
		name := r.PathValue("name")
		ds, err := s.devices.UpdateCollection(name, set(req))
		if err != nil {
			fail(w, status(err), err)
			return
		}
		s.log.Info("collection changed", "collection", name, "change", "menu", "devices", len(ds))
		writeJSON(w, http.StatusOK, map[string]any{"collection": name, "devices": ds})
	})
}
