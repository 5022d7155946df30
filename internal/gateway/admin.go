package gateway

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"
)

// TunnelInfo is one row of the admin API's tunnel list.
type TunnelInfo struct {
	ID         uint32 `json:"id"`
	User       string `json:"user"`
	Client     string `json:"client_address"`
	ClientName string `json:"client_name,omitempty"`
	Transport  string `json:"transport"`
	Method     string `json:"auth_method"`
	Target     string `json:"target,omitempty"`
	TargetName string `json:"target_name,omitempty"`
	BytesUp    uint64 `json:"bytes_up"`
	BytesDown  uint64 `json:"bytes_down"`
	// BytesToClient is what the client was sent: bytes_down for an
	// MS-TSGU tunnel; for a browser's, its websocket messages' payloads
	// after compression (the RDCleanPath answer among them).
	BytesToClient uint64    `json:"bytes_to_client"`
	Started       time.Time `json:"started"`
	// IdleSecs is the time since the client's last input.
	IdleSecs float64 `json:"idle_seconds"`
	Open     bool    `json:"channel_open"`
	// Node is the farm node holding the tunnel, when a farm database
	// lists every node's.
	Node string `json:"node,omitempty"`
}

// Tunnels lists every tunnel, handshaking or open.
func (s *Server) Tunnels() []TunnelInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]TunnelInfo, 0, len(s.tunnels))
	for _, tn := range s.tunnels {
		ti := TunnelInfo{ID: tn.id, Client: tn.hs.remote.String(), Transport: tn.transport, Method: tn.hs.method,
			BytesUp: tn.bytesUp.Load(), BytesDown: tn.bytesDown.Load(), Started: tn.started}
		ti.BytesToClient = ti.BytesDown
		if bt, ok := tn.t.(*browserTransport); ok {
			ti.BytesToClient = bt.sent.Load()
		}
		// Handshake fields are written by the tunnel goroutine before the
		// channel opens; they are read only once it is open.
		if tn.isOpen() {
			la := tn.lastInput.Load()
			ti.Open = true
			ti.User, ti.ClientName = tn.ident.User, tn.clientName
			ti.Target, ti.TargetName = tn.target.Addr.String(), tn.target.Name
			ti.IdleSecs = time.Since(time.Unix(0, la)).Seconds()
		}
		out = append(out, ti)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	if ft := s.farmTun.Load(); ft != nil {
		for i := range out {
			out[i].Node = ft.node
		}
	}
	return out
}

// Disconnect closes tunnel id for an administrator, and its token opens
// no more tunnels (the client's auto-reconnect would otherwise undo the
// disconnect); it reports whether the tunnel existed.
func (s *Server) Disconnect(id uint32, reason string) bool {
	s.mu.Lock()
	tn, ok := s.tunnels[id]
	s.mu.Unlock()
	if ok {
		tn.revoked.Store(true)
		tn.stopFor(reason, statusAborted)
	}
	return ok
}

// AdminHandler serves the gateway's part of the admin API; the caller
// mounts it behind authentication.
func (s *Server) AdminHandler() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/gateway/tunnels", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		out := map[string]any{}
		list := s.Tunnels()
		if ft := s.farmTun.Load(); ft != nil {
			// Every node's: this one's as they are now, the others' as
			// they wrote them within the last seconds.
			others, err := ft.list(r.Context())
			if err != nil {
				out["farm_error"] = "the farm's database could not be read: only this node's tunnels are listed"
				s.log.Warn("farm database: listing the farm's tunnels failed", "err", err)
			}
			list = append(list, others...)
		}
		out["tunnels"] = list
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("DELETE /api/v1/gateway/tunnels/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 32)
		if err != nil {
			http.Error(w, `{"error":"tunnel id must be a number"}`, http.StatusBadRequest)
			return
		}
		const reason = "disconnected by administrator"
		if ft, node := s.farmTun.Load(), r.URL.Query().Get("node"); ft != nil && node != "" && node != ft.node {
			// Another node's: it acts on the request within seconds.
			ok, err := ft.requestDisconnect(r.Context(), node, uint32(id), reason)
			switch {
			case err != nil:
				http.Error(w, `{"error":"the farm's database could not be reached"}`, http.StatusServiceUnavailable)
			case !ok:
				http.Error(w, `{"error":"no such tunnel"}`, http.StatusNotFound)
			default:
				s.log.Info("disconnect of a tunnel at another node requested by administrator", "tunnel", id, "node", node)
				w.WriteHeader(http.StatusAccepted)
			}
			return
		}
		if !s.Disconnect(uint32(id), reason) {
			http.Error(w, `{"error":"no such tunnel"}`, http.StatusNotFound)
			return
		}
		s.log.Info("tunnel disconnected by administrator", "tunnel", id)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}
