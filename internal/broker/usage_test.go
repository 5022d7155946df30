package broker_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
)

// adminList GETs path from the admin API and decodes its list.
func (r *rig) adminList(path string) []map[string]any {
	r.t.Helper()
	rec := httptest.NewRecorder()
	r.admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var out []map[string]any
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
		r.t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
	}
	return out
}

// TestAdminAPIShowsUsage: what an agent's heartbeat says of page activity
// and of its sessions' memory and CPU is in the admin API's host and
// session lists; a heartbeat of an older agent, without those fields,
// reads as 0.
func TestAdminAPIShowsUsage(t *testing.T) {
	r := newRig(t, "", nil)
	cred := r.agent("h1", "desk", "")
	if _, err := r.launch(brokerclient.Bearer("frontend-token"), brokerapi.LaunchRequest{DeliveryGroup: "desk", User: "alice", Groups: []string{"staff"}}); err != nil {
		t.Fatal(err)
	}
	old := r.agent("h2", "desk", "") // an older agent, joined after alice's launch went to h1
	r.beat("h1", cred, brokerapi.Heartbeat{DiskIdle: 0.9, MajorFaultsPerSec: 120.5, SwapInPerSec: 8, SwapOutPerSec: 33,
		Sessions: []brokerapi.Session{{User: "alice", State: "active", MemoryBytes: 400 << 20, CPU: 0.75},
			{User: "dave", State: "disconnected", MemoryBytes: 200 << 20, CPU: 0}}})
	r.beat("h2", old, brokerapi.Heartbeat{DiskIdle: 0.9})
	hosts := map[string]map[string]any{}
	for _, h := range r.adminList("/api/v1/broker/hosts") {
		hosts[h["name"].(string)] = h
	}
	want := map[string]map[string]float64{
		"h1": {"major_faults_per_s": 120.5, "swap_in_per_s": 8, "swap_out_per_s": 33, "session_memory_bytes": 300 << 20},
		"h2": {"major_faults_per_s": 0, "swap_in_per_s": 0, "swap_out_per_s": 0, "session_memory_bytes": 0},
	}
	for name, fields := range want {
		for k, v := range fields {
			if got, ok := hosts[name][k].(float64); !ok || got != v {
				t.Fatalf("host %s's %s = %v, want %v (%v)", name, k, hosts[name][k], v, hosts[name])
			}
		}
	}
	sessions := map[string]map[string]any{}
	for _, s := range r.adminList("/api/v1/broker/sessions?host=h1") {
		sessions[s["user"].(string)] = s
	}
	if s := sessions["alice"]; s == nil || s["memory_bytes"] != float64(400<<20) || s["cpu"] != 0.75 {
		t.Fatalf("alice's session in the admin API = %v", s)
	}
	if s := sessions["dave"]; s == nil || s["memory_bytes"] != float64(200<<20) || s["cpu"] != 0.0 {
		t.Fatalf("dave's session in the admin API = %v", s)
	}
}
