package stream

import (
	"encoding/json"
	"net/http"
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
	return mux
}
