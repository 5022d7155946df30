package netboot

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Device is a machine recognised by its MAC address, as Citrix PVS's
// device records are: what it boots, and whether it may.
type Device struct {
	MAC        string `json:"mac"` // lower case, colons
	Name       string `json:"name"`
	Collection string `json:"collection,omitempty"`
	// VDisk is what it boots; empty (an auto-added device) boots nothing
	// until an administrator assigns one.
	VDisk string `json:"vdisk,omitempty"`
	// Stage is the vDisk version stage it boots: production (the
	// default), test or maintenance.
	Stage   string    `json:"stage,omitempty"`
	Enabled bool      `json:"enabled"`
	Added   time.Time `json:"added"`
	// LastBoot is when it last fetched its boot script.
	LastBoot *time.Time `json:"last_boot,omitempty"`
	// Personality is the device's own settings (host name, role, site),
	// as PVS's personality strings: the kernel command line carries them
	// as deskway.p.KEY=VALUE, and the initramfs writes them to
	// /etc/deskway/personality on the root disk.
	Personality map[string]string `json:"personality,omitempty"`
	// Menu, when set, is shown at power-on: the device boots the entry
	// chosen at its console in place of VDisk and Stage.
	Menu *Menu `json:"menu,omitempty"`
}

// maxPending bounds the devices auto_add has made that still wait for an
// administrator: anyone on the boot network can send new MACs.
const maxPending = 256

// pending counts auto-added devices in collection that have no vDisk.
func (ds *Devices) pending(collection string) int {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	n := 0
	for _, d := range ds.list {
		if d.Collection == collection && d.VDisk == "" && !d.Enabled {
			n++
		}
	}
	return n
}

// ErrNoDevice says no device has that MAC or name.
var ErrNoDevice = errors.New("no such device")

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// ParseMAC returns mac as a device key: an Ethernet address, lower case
// with colons.
func ParseMAC(mac string) (string, error) {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("%q is not an Ethernet MAC address (like 52:54:00:12:34:56)", mac)
	}
	return hw.String(), nil
}

// Check says what is wrong with d, if anything; vdisks are the names
// a device may boot.
func (d *Device) Check(vdisks []string) error {
	if _, err := ParseMAC(d.MAC); err != nil {
		return err
	}
	if !namePattern.MatchString(d.Name) {
		return fmt.Errorf("device name %q: use letters, digits, dots, dashes and underscores, at most 63, starting with a letter or digit (it names the device's write cache and private image)", d.Name)
	}
	if d.Collection != "" && !namePattern.MatchString(d.Collection) {
		return fmt.Errorf("collection %q: use letters, digits, dots, dashes and underscores", d.Collection)
	}
	if d.VDisk != "" && !slices.Contains(vdisks, d.VDisk) {
		return fmt.Errorf("no vDisk %q in stream.vdisks (there are: %s)", d.VDisk, strings.Join(vdisks, ", "))
	}
	switch d.Stage {
	case "", "production", "test", "maintenance":
	default:
		return fmt.Errorf("stage %q is not production, test or maintenance", d.Stage)
	}
	if err := checkPersonality(d.Personality); err != nil {
		return err
	}
	return d.Menu.check(d, vdisks)
}

// Devices is the device records, kept in a JSON file that is replaced
// whole on every change (written, synced, renamed), so a crash leaves
// the old list or the new one.
type Devices struct {
	path string
	mu   sync.Mutex
	list []Device // sorted by name
}

// OpenDevices reads the records at path; a missing file is no devices.
func OpenDevices(path string) (*Devices, error) {
	d := &Devices{path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netboot: devices: %w", err)
	}
	if err := json.Unmarshal(b, &d.list); err != nil {
		return nil, fmt.Errorf("netboot: devices file %s: %w", path, err)
	}
	return d, nil
}

// List returns the devices, by name.
func (ds *Devices) List() []Device {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return slices.Clone(ds.list)
}

// ByMAC returns the device with mac.
func (ds *Devices) ByMAC(mac string) (Device, bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	i := slices.IndexFunc(ds.list, func(d Device) bool { return d.MAC == mac })
	if i < 0 {
		return Device{}, false
	}
	return ds.list[i], true
}

// Add records d, whose MAC and name must both be new.
func (ds *Devices) Add(d Device) error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for _, o := range ds.list {
		if o.MAC == d.MAC {
			return fmt.Errorf("MAC %s is device %q already", d.MAC, o.Name)
		}
		if strings.EqualFold(o.Name, d.Name) {
			return fmt.Errorf("a device is named %q already (MAC %s)", o.Name, o.MAC)
		}
	}
	next := append(slices.Clone(ds.list), d)
	slices.SortFunc(next, func(a, b Device) int { return strings.Compare(a.Name, b.Name) })
	return ds.save(next)
}

// Update changes the device named name (or with that MAC) with change,
// and returns it as saved.
func (ds *Devices) Update(name string, change func(*Device) error) (Device, error) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	i := ds.find(name)
	if i < 0 {
		return Device{}, fmt.Errorf("%w: %q", ErrNoDevice, name)
	}
	next := slices.Clone(ds.list)
	if err := change(&next[i]); err != nil {
		return Device{}, err
	}
	if err := ds.save(next); err != nil {
		return Device{}, err
	}
	return next[i], nil
}

// Remove deletes the device named name (or with that MAC).
func (ds *Devices) Remove(name string) error {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	i := ds.find(name)
	if i < 0 {
		return fmt.Errorf("%w: %q", ErrNoDevice, name)
	}
	return ds.save(slices.Delete(slices.Clone(ds.list), i, i+1))
}

// booted notes a boot of the device with mac at t, in memory only: a
// boot must not wait for a disk write, and the time is for people.
func (ds *Devices) booted(mac string, t time.Time) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if i := slices.IndexFunc(ds.list, func(d Device) bool { return d.MAC == mac }); i >= 0 {
		ds.list[i].LastBoot = &t
	}
}

func (ds *Devices) find(key string) int {
	mac, _ := ParseMAC(key)
	return slices.IndexFunc(ds.list, func(d Device) bool { return strings.EqualFold(d.Name, key) || mac != "" && d.MAC == mac })
}

// save writes next and makes it the list.
func (ds *Devices) save(next []Device) error {
	b, err := json.MarshalIndent(next, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(ds.path, b); err != nil {
		return fmt.Errorf("netboot: devices: %w", err)
	}
	ds.list = next
	return nil
}

// writeFileAtomic replaces path with b: a temporary file written and
// synced, renamed over it, and the directory synced.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
