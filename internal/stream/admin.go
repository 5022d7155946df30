package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// AdminHandler serves the stream role's part of the admin API: the vDisk
// catalog and the live boots. The caller mounts it behind authentication.
func (s *Server) AdminHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/stream/vdisks", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"vdisks": s.VDisks()})
	})
	mux.HandleFunc("GET /api/v1/stream/boots", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"boots": s.Boots()})
	})
	mux.HandleFunc("GET /api/v1/stream/vdisks/{name}/versions", s.versionHandler(func(vd *vdisk, _ *http.Request) (any, error) {
		vs, err := vd.versionList()
		return map[string]any{"versions": vs}, err
	}))
	mux.HandleFunc("POST /api/v1/stream/vdisks/{name}/versions", s.versionHandler(func(vd *vdisk, r *http.Request) (any, error) {
		var body struct {
			Note string `json:"note"`
		}
		_ = json.NewDecoder(http.MaxBytesReader(nil, r.Body, 4096)).Decode(&body)
		v, err := vd.createVersion(body.Note)
		if err == nil {
			s.log.Info("vDisk version created for maintenance", "vdisk", vd.name, "version", v.Version)
		}
		return v, err
	}))
	mux.HandleFunc("POST /api/v1/stream/vdisks/{name}/versions/{n}/promote", s.versionHandler(func(vd *vdisk, r *http.Request) (any, error) {
		n, err := versionNumber(r)
		if err != nil {
			return nil, err
		}
		v, err := vd.promote(n)
		if err == nil {
			s.log.Info("vDisk version promoted", "vdisk", vd.name, "version", v.Version, "stage", v.Stage)
		}
		return v, err
	}))
	mux.HandleFunc("POST /api/v1/stream/vdisks/{name}/versions/{n}/demote", s.versionHandler(func(vd *vdisk, r *http.Request) (any, error) {
		n, err := versionNumber(r)
		if err != nil {
			return nil, err
		}
		v, err := s.demote(vd, n)
		if err == nil {
			s.log.Info("vDisk version demoted", "vdisk", vd.name, "version", v.Version, "stage", v.Stage)
		}
		return v, err
	}))
	mux.HandleFunc("DELETE /api/v1/stream/vdisks/{name}/versions/{n}", s.versionHandler(func(vd *vdisk, r *http.Request) (any, error) {
		n, err := versionNumber(r)
		if err != nil {
			return nil, err
		}
		if err := s.deleteVersion(vd, n); err != nil {
			return nil, err
		}
		s.log.Info("vDisk version deleted", "vdisk", vd.name, "version", n)
		return map[string]any{"vdisk": vd.name, "deleted": n}, nil
	}))
	mux.HandleFunc("POST /api/v1/stream/vdisks/{name}/private/{client}", s.versionHandler(func(vd *vdisk, r *http.Request) (any, error) {
		client := r.PathValue("client")
		if vd.mode != "private" || !validID(client, false) {
			return nil, errors.Join(errVersion, fmt.Errorf("%s is not a private-mode vDisk, or %q is not a client name", vd.name, client))
		}
		from, _, err := vd.imageFor(StageProduction)
		if err != nil {
			return nil, err
		}
		p, err := openPrivate(vd.privatePath(client), from, true)
		if errors.Is(err, errWriterBusy) {
			return map[string]string{"vdisk": vd.name, "client": client, "state": "in use"}, nil
		}
		if err != nil {
			return nil, err
		}
		p.close()
		s.log.Info("private image made", "vdisk", vd.name, "client", client)
		return map[string]string{"vdisk": vd.name, "client": client, "state": "ready"}, nil
	}))
	mux.HandleFunc("DELETE /api/v1/stream/vdisks/{name}/clients/{client}/lost", s.versionHandler(func(vd *vdisk, r *http.Request) (any, error) {
		client := r.PathValue("client")
		if !validID(client, false) {
			return nil, errors.Join(errVersion, fmt.Errorf("%q is not a client name", client))
		}
		keys, err := s.ForgetLost(vd.name, client)
		return map[string]any{"vdisk": vd.name, "client": client, "forgotten": append([]string{}, keys...)}, err
	}))
	mux.HandleFunc("POST /api/v1/stream/vdisks/{name}/merge", s.versionHandler(func(vd *vdisk, _ *http.Request) (any, error) {
		v, err := vd.merge()
		if err == nil {
			s.log.Info("vDisk versions merged into a new base", "vdisk", vd.name, "version", v.Version, "base", v.MergedBase)
		}
		return v, err
	}))
	return mux
}

// versionNumber is the version the path names.
func versionNumber(r *http.Request) (int, error) {
	n, err := strconv.Atoi(r.PathValue("n"))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %q is not a version number", errVersion, r.PathValue("n"))
	}
	return n, nil
}

// versionHandler finds the vDisk named in the path, runs fn and writes
// its result as JSON: 404 for an unknown vDisk, 409 when the chain's
// state does not allow the request.
func (s *Server) versionHandler(fn func(*vdisk, *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		vd := s.byName[r.PathValue("name")]
		if vd == nil {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "no vDisk named " + r.PathValue("name")})
			return
		}
		out, err := fn(vd, r)
		switch {
		case errors.Is(err, errVersion):
			// The refusal is a sentence for people; the marker is for code.
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": strings.TrimPrefix(err.Error(), errVersion.Error()+": ")})
		case err != nil:
			s.log.Error("vDisk version operation failed", "vdisk", vd.name, "err", err)
			w.WriteHeader(http.StatusInternalServerError)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		default:
			if r.Method == http.MethodPost && r.PathValue("n") == "" {
				w.WriteHeader(http.StatusCreated) // a new version
			}
			_ = json.NewEncoder(w).Encode(out)
		}
	}
}

// VDiskInfo is one row of the admin API's catalog.
type VDiskInfo struct {
	Name        string `json:"name"`
	Base        string `json:"base"`
	Mode        string `json:"mode"`
	Description string `json:"description,omitempty"`
	Size        int64  `json:"size"`
}

// VDisks lists the catalog.
func (s *Server) VDisks() []VDiskInfo {
	out := make([]VDiskInfo, 0, len(s.vdisks))
	for _, v := range s.vdisks {
		out = append(out, VDiskInfo{Name: v.name, Base: v.path, Mode: v.mode, Description: v.desc, Size: v.size})
	}
	return out
}

// BootInfo is one row of the admin API's boot list.
type BootInfo struct {
	VDisk  string `json:"vdisk"`
	Client string `json:"client"`
	Boot   string `json:"boot"`
	// Version is the vDisk version the boot started on, and runs to its
	// end; Stage the stage its export named (production when none).
	Version     int       `json:"version"`
	Stage       string    `json:"stage"`
	Connections int       `json:"connections"`
	Started     time.Time `json:"started"`
	CacheRAM    int64     `json:"cache_ram_bytes"`
	CacheSpill  int64     `json:"cache_spill_bytes"`
}

// Boots lists the boots whose write caches are alive.
func (s *Server) Boots() []BootInfo {
	s.mu.Lock()
	bs := make([]*boot, 0, len(s.boots))
	for _, b := range s.boots {
		bs = append(bs, b)
	}
	out := make([]BootInfo, 0, len(bs))
	for _, b := range bs {
		stage := StageProduction
		if _, st, ok := strings.Cut(strings.SplitN(b.key, "/", 2)[0], "@"); ok {
			stage = st
		}
		out = append(out, BootInfo{VDisk: b.vd.name, Client: b.client, Boot: b.id, Version: b.img.version, Stage: stage, Connections: b.conns, Started: b.started})
	}
	s.mu.Unlock()
	s.mu.Lock()
	caches := make([]bootCache, len(bs))
	for i, b := range bs {
		caches[i] = b.cache
	}
	s.mu.Unlock()
	for i, c := range caches {
		if c != nil {
			out[i].CacheRAM, out[i].CacheSpill = c.bytes()
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	return out
}
