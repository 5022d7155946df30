package netboot

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// DeviceRequest adds a device (POST /api/v1/stream/devices) or changes
// what it boots (POST /api/v1/stream/devices/{name}/assign: vdisk and
// stage only).
type DeviceRequest struct {
	MAC        string `json:"mac"`
	Name       string `json:"name"`
	Collection string `json:"collection"`
	VDisk      string `json:"vdisk"`
	Stage      string `json:"stage"`
	// Disabled adds the device without letting it boot yet.
	Disabled bool `json:"disabled"`
}

// AdminHandler serves the devices' part of the admin API.
func (s *Service) AdminHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/stream/devices", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"devices": s.statuses()})
	})
	mux.HandleFunc("POST /api/v1/stream/devices", func(w http.ResponseWriter, r *http.Request) {
		var req DeviceRequest
		if !decode(w, r, &req) {
			return
		}
		mac, err := ParseMAC(req.MAC)
		if err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		d := Device{MAC: mac, Name: req.Name, Collection: req.Collection, VDisk: req.VDisk, Stage: req.Stage, Enabled: !req.Disabled, Added: s.now().UTC()}
		if err := d.Check(s.names); err != nil {
			fail(w, http.StatusBadRequest, err)
			return
		}
		if err := s.devices.Add(d); err != nil {
			fail(w, http.StatusConflict, err)
			return
		}
		s.log.Info("device added", "device", d.Name, "mac", d.MAC, "vdisk", d.VDisk, "enabled", d.Enabled)
		writeJSON(w, http.StatusCreated, d)
	})
	mux.HandleFunc("POST /api/v1/stream/devices/{name}/assign", func(w http.ResponseWriter, r *http.Request) {
		var req DeviceRequest
		if !decode(w, r, &req) {
			return
		}
		s.change(w, r, func(d *Device) error {
			d.VDisk, d.Stage = req.VDisk, req.Stage
			return d.Check(s.names)
		})
	})
	mux.HandleFunc("PUT /api/v1/stream/devices/{name}/personality", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Personality map[string]string `json:"personality"`
		}
		if !decode(w, r, &req) {
			return
		}
		s.change(w, r, func(d *Device) error {
			d.Personality = req.Personality
			return d.Check(s.names)
		})
	})
	for path, on := range map[string]bool{"enable": true, "disable": false} {
		mux.HandleFunc("POST /api/v1/stream/devices/{name}/"+path, func(w http.ResponseWriter, r *http.Request) {
			s.change(w, r, func(d *Device) error { d.Enabled = on; return nil })
		})
	}
	mux.HandleFunc("DELETE /api/v1/stream/devices/{name}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.devices.Remove(r.PathValue("name")); err != nil {
			fail(w, status(err), err)
			return
		}
		s.log.Info("device removed", "device", r.PathValue("name"))
		w.WriteHeader(http.StatusNoContent)
	})
	s.collectionRoutes(mux)
	s.menuRoutes(mux)
	return mux
}

// change applies fn to the device the path names and answers with it.
func (s *Service) change(w http.ResponseWriter, r *http.Request, fn func(*Device) error) {
	d, err := s.devices.Update(r.PathValue("name"), fn)
	if err != nil {
		fail(w, status(err), err)
		return
	}
	s.log.Info("device changed", "device", d.Name, "vdisk", d.VDisk, "stage", d.Stage, "enabled", d.Enabled)
	writeJSON(w, http.StatusOK, d)
}

func status(err error) int {
	if errors.Is(err, ErrNoDevice) {
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fail(w, http.StatusBadRequest, fmt.Errorf("request body is not the expected JSON: %w", err))
		return false
	}
	return true
}

func fail(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
