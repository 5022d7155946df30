package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// testRDPServiceDownTurnsHostUnhealthy stops a real xrdp under a
// registered host: within one heartbeat the agent's check (X.224
// Connection Request, then TLS) fails, the broker lists the host as
// unhealthy saying why, and a launch is refused rather than placed on a
// host nobody can reach; xrdp started again makes it healthy and a
// launch lands there again.
func testRDPServiceDownTurnsHostUnhealthy(t *testing.T, xs testkit.XRDPSetup) {
	b := newBrokerRig(t, xs)
	b.waitHost(func(h map[string]any) bool { return h != nil && h["unhealthy"] == "" }, "registered and healthy")
	why := fmt.Sprintf("RDP service not answering on port %d", b.rdpPort)
	b.xrdp.Stop()
	stopped := time.Now()
	b.waitHost(func(h map[string]any) bool { return h["unhealthy"] == why }, "unhealthy: "+why)
	// The heartbeat is 1 s: one heartbeat, with the time to send it.
	if took := time.Since(stopped); took > 3*time.Second {
		t.Errorf("the host turned unhealthy %v after xrdp stopped, want within one heartbeat (1 s)", took)
	}
	if out, err := exec.Command(b.bin, "host", "ls", "-c", b.cfg).CombinedOutput(); err != nil || !strings.Contains(string(out), "unhealthy ("+why+")") {
		t.Errorf("deskway host ls with xrdp down: %v\n%s", err, out)
	}
	status, body := b.tryLaunch()
	if status != http.StatusServiceUnavailable || !strings.Contains(body, why) {
		t.Fatalf("a launch with xrdp down: %d %s", status, body)
	}
	b.xrdp.Restart()
	b.waitHost(func(h map[string]any) bool { return h["unhealthy"] == "" }, "healthy again")
	if lr := b.launch(); lr.Host != "xrdp-host" {
		t.Fatalf("launch after xrdp came back = %+v", lr)
	}
}

// host is the broker's admin listing of the rig's host, nil before it
// registers.
func (b *brokerRig) host() map[string]any {
	t := b.t
	t.Helper()
	req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/api/v1/broker/hosts", b.adminPort), nil)
	req.Header.Set("Authorization", "Bearer e2e-admin-token")
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var hs []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&hs); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h["name"] == "xrdp-host" {
			return h
		}
	}
	return nil
}

// waitHost waits until the host's listing satisfies ok.
func (b *brokerRig) waitHost(ok func(map[string]any) bool, what string) {
	t := b.t
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		h := b.host()
		if ok(h) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host is not %s: %v\n%s", what, h, lastLines(b.gwLog.Log.String(), 20))
		}
	}
}

// tryLaunch asks the broker for the test user's desktop once.
func (b *brokerRig) tryLaunch() (int, string) {
	t := b.t
	t.Helper()
	req, _ := http.NewRequest("POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/launch", b.brokerPort), strings.NewReader(`{"delivery_group":"desk"}`))
	req.SetBasicAuth(b.xrdp.User, b.xrdp.Password)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
