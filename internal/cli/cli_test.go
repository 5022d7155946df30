package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/auth"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/obs"
	"github.com/deskway/deskway/internal/testkit"
	"github.com/deskway/deskway/internal/tsgclient"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if code := Main(context.Background(), []string{"version"}, &out, io.Discard); code != 0 || !strings.HasPrefix(out.String(), "deskway ") {
		t.Fatalf("version: %d %q", code, out.String())
	}
}

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("gateway:\n  auth_methods: [ntlm]\n"), 0o600)
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"config", "validate", good}, &out, &errb); code != 0 || !strings.Contains(out.String(), "keepalive: 30s") {
		t.Fatalf("validate good: %d %s %s", code, out.String(), errb.String())
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("gateway:\n  listen: :1\n  keepalvie: 3s\n"), 0o600)
	errb.Reset()
	if code := Main(context.Background(), []string{"config", "validate", bad}, io.Discard, &errb); code == 0 || !strings.Contains(errb.String(), "line 3") || !strings.Contains(errb.String(), "keepalvie") {
		t.Fatalf("validate bad: %d %s", code, errb.String())
	}
}

func TestTokenAndNTHash(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	key := strings.Repeat("k", 32)
	os.WriteFile(cfg, []byte("auth:\n  token_key: "+key+"\n"), 0o600)
	var out bytes.Buffer
	if code := Main(context.Background(), []string{"token", "-c", cfg, "--user", "alice", "--host", "h1", "--port", "3390"}, &out, io.Discard); code != 0 {
		t.Fatal("token failed")
	}
	tk, _ := auth.NewTokens([]byte(key), nil)
	c, err := tk.Verify(strings.TrimSpace(out.String()))
	if err != nil || c.User() != "alice" || c.Host != "h1" || c.Port != 3390 {
		t.Fatalf("minted token: %+v %v", c, err)
	}
	out.Reset()
	Main(context.Background(), []string{"nthash", "Password"}, &out, io.Discard)
	if strings.TrimSpace(out.String()) != "a4f49c406510bdcab6824ee7c30fd852" {
		t.Fatalf("nthash: %s", out.String())
	}
}

// TestUp starts every role with embedded defaults, connects through the
// gateway with the printed credentials, and checks the admin listener.
// The session host is a stand-in that answers the agent's check of its
// RDP service on a port of its own (--rdp-port).
func TestUp(t *testing.T) {
	dir := t.TempDir()
	rdpPort := testkit.FakeRDP(t)
	gwPort, adminPort, streamPort, brokerPort, webPort := testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t), testkit.FreePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	out, errb := &lockedBuf{}, &lockedBuf{}
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"up", "--session-host=false", "--state-dir", dir, "--listen", fmt.Sprintf(":%d", gwPort), "--admin-listen", fmt.Sprintf("127.0.0.1:%d", adminPort),
			"--stream-listen", fmt.Sprintf("127.0.0.1:%d", streamPort), "--broker-listen", fmt.Sprintf(":%d", brokerPort), "--web-listen", fmt.Sprintf(":%d", webPort), "--rdp-port", fmt.Sprint(rdpPort)}, out, errb)
	}()
	defer func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("up exited %d: %s", code, errb.String())
			}
		case <-time.After(40 * time.Second):
			t.Error("up did not stop")
		}
	}()
	gw := fmt.Sprintf("127.0.0.1:%d", gwPort)
	// Listeners open role by role; the broker's comes after its store is migrated.
	for _, addr := range []string{gw, fmt.Sprintf("127.0.0.1:%d", brokerPort)} {
		if err := testkit.WaitPort(addr, 20*time.Second); err != nil {
			t.Fatalf("%v\n%s", err, errb.String())
		}
	}
	time.Sleep(100 * time.Millisecond)
	// Secrets are in a file only its owner reads, never on the terminal.
	credsPath := filepath.Join(dir, "credentials")
	creds, err := os.ReadFile(credsPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(credsPath); fi.Mode().Perm() != 0o600 {
		t.Fatalf("credentials file mode %v", fi.Mode().Perm())
	}
	m := regexp.MustCompile(`(?m)^demo password: (\S+)$`).FindStringSubmatch(string(creds))
	tok := regexp.MustCompile(`(?m)^admin token: (\S+)$`).FindStringSubmatch(string(creds))
	if m == nil || tok == nil || !strings.Contains(out.String(), "xfreerdp /v:127.0.0.1") || !strings.Contains(out.String(), credsPath) {
		t.Fatalf("up did not print where to connect and where the credentials are:\n%s\n%s", out.String(), creds)
	}
	for _, secret := range []string{m[1], tok[1]} {
		if strings.Contains(out.String()+errb.String(), secret) {
			t.Fatalf("up printed a secret to the terminal:\n%s", out.String())
		}
	}
	// Every listener is on loopback unless --public is given.
	for _, p := range []int{gwPort, brokerPort, streamPort, adminPort} {
		if a := listenAddr(t, p); a != "127.0.0.1" {
			t.Fatalf("port %d listens on %s, want 127.0.0.1 only", p, a)
		}
	}
	if _, err := config.Load(filepath.Join(dir, "up.yaml")); err != nil {
		t.Fatalf("generated config does not validate: %v", err)
	}
	// The demo user logs in; port 1 is outside the default policy, so the
	// refusal comes from RAP, after a successful login.
	cfg := tsgclient.Config{Gateway: gw, TLS: &tls.Config{InsecureSkipVerify: true}, User: "demo", Password: m[1]}
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	_, err = tsgclient.Dial(cctx, cfg, "127.0.0.1", 1)
	if err == nil || !strings.Contains(err.Error(), "E_PROXY_TS_CONNECTFAILED") && !strings.Contains(err.Error(), "E_PROXY_RAP_ACCESSDENIED") {
		t.Fatalf("demo login: %v", err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	admin := fmt.Sprintf("https://127.0.0.1:%d", adminPort)
	resp, err := client.Get(admin + "/api/v1/gateway/tunnels")
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("admin API without token: %v %v", resp, err)
	}
	req, _ := http.NewRequest("GET", admin+"/api/v1/gateway/tunnels", nil)
	req.Header.Set("Authorization", "Bearer "+tok[1])
	resp, err = client.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin API with token: %v %v", resp, err)
	}
	// The refused tunnel is counted as the gateway ends it, which may be
	// just after the client read the refusal: wait for it.
	wants := []string{"deskway_gateway_tunnels_active", `deskway_gateway_auth_total{method="ntlm",result="ok"} 1`, "deskway_gateway_tunnels_total", "go_goroutines",
		"deskway_stream_connections"}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err = client.Get(admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var missing []string
		for _, want := range wants {
			if !strings.Contains(string(body), want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %s", strings.Join(missing, ", "))
		}
	}
	// The local agent registers this machine and the demo user gets an
	// .rdp file for it through the gateway.
	var rdp []byte
	for deadline := time.Now().Add(20 * time.Second); ; {
		req, _ := http.NewRequest("POST", fmt.Sprintf("https://localhost:%d/api/v1/launch", brokerPort), strings.NewReader(`{"delivery_group":"desktops"}`))
		req.SetBasicAuth("demo", m[1])
		req.Header.Set("Accept", "application/x-rdp")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rdp, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("launch: %d %s\n%s", resp.StatusCode, rdp, errb.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, want := range []string{fmt.Sprintf("full address:s:127.0.0.1:%d\r\n", rdpPort), fmt.Sprintf("gatewayhostname:s:localhost:%d\r\n", gwPort), "gatewayaccesstoken:s:ey"} {
		if !strings.Contains(string(rdp), want) {
			t.Fatalf(".rdp from deskway up lacks %q:\n%s", want, rdp)
		}
	}
	// The portal, in the same process as the broker, calls it without a
	// socket: the demo user signs in and sees the desktop the broker
	// entitles them to.
	if !strings.Contains(errb.String(), "the portal calls this process's broker directly") {
		t.Errorf("the portal does not call its own process's broker directly:\n%s", errb.String())
	}
	jar, _ := cookiejar.New(nil)
	pc := &http.Client{Jar: jar, Transport: client.Transport}
	preq, _ := http.NewRequest("POST", fmt.Sprintf("https://localhost:%d/signin", webPort), strings.NewReader(url.Values{"user": {"demo"}, "password": {m[1]}}.Encode()))
	preq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	preq.Header.Set("Sec-Fetch-Site", "same-origin")
	presp, err := pc.Do(preq)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(presp.Body)
	presp.Body.Close()
	if presp.StatusCode != http.StatusOK || !strings.Contains(string(page), `data-group="desktops"`) {
		t.Fatalf("portal sign-in: %s\n%s", presp.Status, page)
	}
	if !strings.Contains(out.String(), fmt.Sprintf("https://localhost:%d/api/v1/launch", brokerPort)) {
		t.Errorf("up did not print the broker address:\n%s", out.String())
	}
	// The stream role serves the demo vDisk and lists it in the catalog.
	if !strings.Contains(out.String(), fmt.Sprintf("nbd://localhost:%d/demo", streamPort)) {
		t.Errorf("up did not print the stream address:\n%s", out.String())
	}
	req, _ = http.NewRequest("GET", admin+"/api/v1/stream/vdisks", nil)
	req.Header.Set("Authorization", "Bearer "+tok[1])
	resp, err = client.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream catalog: %v %v", resp, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"name":"demo"`) || !strings.Contains(string(body), `"size":268435456`) {
		t.Errorf("stream catalog: %s", body)
	}
	nc, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", streamPort))
	if err != nil {
		t.Fatalf("stream port: %v", err)
	}
	greeting := make([]byte, 8)
	if _, err := io.ReadFull(nc, greeting); err != nil || string(greeting) != "NBDMAGIC" {
		t.Errorf("stream greeting %q: %v", greeting, err)
	}
	nc.Close()
	if strings.Contains(errb.String(), m[1]) {
		t.Error("the demo password appears in the logs")
	}
}

// TestJoinTokenDefaults: a join token lives an hour unless told
// otherwise, and --uses is carried in it.
func TestJoinTokenDefaults(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	key := strings.Repeat("k", 32)
	os.WriteFile(cfg, []byte("auth:\n  token_key: "+key+"\n"), 0o600)
	var out bytes.Buffer
	if code := Main(context.Background(), []string{"token", "join", "-c", cfg, "--group", "desk", "--uses", "1"}, &out, io.Discard); code != 0 {
		t.Fatal("token join failed")
	}
	tk, _ := auth.NewTokens([]byte(key), nil)
	c, err := tk.VerifyJoin(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	if ttl := time.Until(c.ExpiresAt.Time); ttl > time.Hour || ttl < 59*time.Minute || c.Uses != 1 || c.ID == "" {
		t.Fatalf("join token: ttl %s, uses %d, id %q", ttl, c.Uses, c.ID)
	}
}

// listenAddr is the IPv4 address a TCP socket listens on at port, from
// /proc/net/tcp (0.0.0.0 for every interface); "" if none listens there.
func listenAddr(t *testing.T, port int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "0A" { // LISTEN
			continue
		}
		hexAddr, hexPort, _ := strings.Cut(f[1], ":")
		var p, a uint32
		fmt.Sscanf(hexPort, "%X", &p)
		fmt.Sscanf(hexAddr, "%X", &a)
		if int(p) == port {
			return fmt.Sprintf("%d.%d.%d.%d", byte(a), byte(a>>8), byte(a>>16), byte(a>>24))
		}
	}
	return ""
}

// TestRenewLocalAgent: deskway up keeps its own host registered however
// long it was stopped. An expired credential is minted again with its
// registration, and a host that never registered gets a fresh join token.
func TestRenewLocalAgent(t *testing.T) {
	key := "0123456789abcdef0123456789abcdef"
	dir := t.TempDir()
	cfg := &config.Config{StateDir: dir, Auth: config.Auth{TokenKey: config.NewSecret(key)}, Agent: &config.Agent{JoinToken: config.NewSecret("stale")}}
	if err := renewLocalAgent(cfg); err != nil {
		t.Fatal(err)
	}
	tk, _ := auth.NewTokens([]byte(key), nil)
	if c, err := tk.VerifyJoin(cfg.Agent.JoinToken.Value()); err != nil || c.Group != upGroup {
		t.Fatalf("no fresh join token for a host never registered: %+v %v", c, err)
	}
	past, _ := auth.NewTokens([]byte(key), func() time.Time { return time.Now().Add(-30 * 24 * time.Hour) })
	old, _ := past.MintAgent("demo-host", upGroup, "", "reg-7", 7*24*time.Hour)
	path := filepath.Join(dir, agentCredentialFile)
	if err := os.WriteFile(path, []byte(old+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := renewLocalAgent(cfg); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	c, err := tk.VerifyAgent(strings.TrimSpace(string(b)))
	if err != nil || c.Subject != "demo-host" || c.Registration != "reg-7" {
		t.Fatalf("credential after a month stopped: %+v %v", c, err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("credential file mode %v", st.Mode())
	}
}

// outageStore is the broker's real store, unreachable while down is set.
type outageStore struct {
	*store.Store
	down bool
}

func (o *outageStore) RecordAudit(ctx context.Context, a store.AuditRecord) error {
	if o.down {
		return errors.New("database unreachable")
	}
	return o.Store.RecordAudit(ctx, a)
}

// TestAuditOutlivesAnOutage: an admin action taken while the database is
// away (a drain in an outage) reaches the trail once it answers, in its
// place by time.
func TestAuditOutlivesAnOutage(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "b.db"), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	o := &outageStore{Store: st, down: true}
	a := &storeAudit{st: o}
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	if err := a.Record(ctx, obs.AuditEntry{Time: t0, Actor: "admin token 1", Action: "POST /api/v1/broker/hosts/h1/drain", Status: 200}); err == nil {
		t.Fatal("a write to an unreachable database reported no error")
	}
	o.down = false
	if err := a.Record(ctx, obs.AuditEntry{Time: t0.Add(time.Second), Actor: "admin token 1", Action: "POST /api/v1/reload", Status: 200}); err != nil {
		t.Fatal(err)
	}
	got, err := a.List(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Action != "POST /api/v1/reload" || got[1].Action != "POST /api/v1/broker/hosts/h1/drain" || !got[1].Time.Equal(t0) {
		t.Fatalf("trail after the outage: %+v", got)
	}
}
