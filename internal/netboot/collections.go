package netboot

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Running is a live boot of a device on this stream server: the vDisk
// version its current connection reads, which may be older than what its
// assignment boots now (a boot keeps its version to its end).
type Running struct {
	VDisk   string `json:"vdisk"`
	Version int    `json:"version"`
	Stage   string `json:"stage"`
	Boot    string `json:"boot"`
}

// LiveBoot is one of the stream server's live boots, as Deps.Live gives
// them: Client is the device name a network-booted export carries.
type LiveBoot struct {
	Client string
	Running
}

// DeviceStatus is a device record with what it runs now.
type DeviceStatus struct {
	Device
	Running []Running `json:"running,omitempty"`
}

// Collection is a named set of devices, which act as one unit.
type Collection struct {
	Name     string `json:"name"`
	Devices  int    `json:"devices"`
	Enabled  int    `json:"enabled"`
	Disabled int    `json:"disabled"`
}

// statuses returns the devices with the live boots of each.
func (s *Service) statuses() []DeviceStatus {
	var live []LiveBoot
	if s.live != nil {
		live = s.live()
	}
	list := s.devices.List()
	out := make([]DeviceStatus, len(list))
	for i, d := range list {
		out[i].Device = d
		for _, b := range live {
			if b.Client == d.Name {
				out[i].Running = append(out[i].Running, b.Running)
			}
		}
	}
	return out
}

// Assigned names the devices assigned to vdisk at any of stages, each
// as "NAME (STAGE)"; a device with no stage boots production.
func (s *Service) Assigned(vdisk string, stages []string) []string {
	var out []string
	for _, d := range s.devices.List() {
		st := d.Stage
		if st == "" {
			st = "production"
		}
		if d.VDisk == vdisk && slices.Contains(stages, st) {
			out = append(out, d.Name+" ("+st+")")
		}
	}
	return out
}

// collections lists the collections with their device counts, by name.
func (ds *Devices) collections() []Collection {
	var out []Collection
	for _, d := range ds.List() {
		if d.Collection == "" {
			continue
		}
		i := slices.IndexFunc(out, func(c Collection) bool { return c.Name == d.Collection })
		if i < 0 {
			out = append(out, Collection{Name: d.Collection})
			i = len(out) - 1
		}
		out[i].Devices++
		if d.Enabled {
			out[i].Enabled++
		} else {
			out[i].Disabled++
		}
	}
	slices.SortFunc(out, func(a, b Collection) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// UpdateCollection changes every device of collection with change, all
// or none: one device the change does not fit leaves every record as it
// was. It returns the devices as saved.
func (ds *Devices) UpdateCollection(collection string, change func(*Device) error) ([]Device, error) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	next := slices.Clone(ds.list)
	var changed []Device
	for i := range next {
		if !strings.EqualFold(next[i].Collection, collection) {
			continue
		}
		if err := change(&next[i]); err != nil {
			return nil, fmt.Errorf("device %s: %w; no device of collection %s was changed", next[i].Name, err, collection)
		}
		changed = append(changed, next[i])
	}
	if len(changed) == 0 {
		return nil, fmt.Errorf("%w: no device is in collection %q (a device joins one with deskway device add --collection)", ErrNoDevice, collection)
	}
	if err := ds.save(next); err != nil {
		return nil, err
	}
	return changed, nil
}

// collectionRoutes adds the collections' part of the admin API to mux.
func (s *Service) collectionRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/stream/collections", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"collections": append([]Collection{}, s.devices.collections()...)})
	})
	act := func(w http.ResponseWriter, r *http.Request, what string, fn func(*Device) error) {
		name := r.PathValue("name")
		ds, err := s.devices.UpdateCollection(name, fn)
		if err != nil {
			fail(w, status(err), err)
			return
		}
		s.log.Info("collection changed", "collection", name, "change", what, "devices", len(ds))
		writeJSON(w, http.StatusOK, map[string]any{"collection": name, "devices": ds})
	}
	mux.HandleFunc("POST /api/v1/stream/collections/{name}/assign", func(w http.ResponseWriter, r *http.Request) {
		var req DeviceRequest
		if !decode(w, r, &req) {
			return
		}
		if req.VDisk == "" {
			fail(w, http.StatusBadRequest, fmt.Errorf("name the vDisk the devices of collection %s boot (vdisk; there are: %s)", r.PathValue("name"), strings.Join(s.names, ", ")))
			return
		}
		act(w, r, "assign", func(d *Device) error {
			d.VDisk, d.Stage = req.VDisk, req.Stage
			return d.Check(s.names)
		})
	})
	for path, on := range map[string]bool{"enable": true, "disable": false} {
		mux.HandleFunc("POST /api/v1/stream/collections/{name}/"+path, func(w http.ResponseWriter, r *http.Request) {
			act(w, r, path, func(d *Device) error { d.Enabled = on; return nil })
		})
	}
}
