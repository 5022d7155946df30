package sessionhost

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deskway/deskway/internal/bench/xrdphost"
	"github.com/deskway/deskway/internal/childproc"
	"github.com/deskway/deskway/internal/loopback"
	"github.com/deskway/deskway/internal/tlsconf"
)

//go:embed workload.sh
var workloadScript []byte

// userPrefix names the host accounts the bench logs on: dwload01, dwload02…
const userPrefix = "dwload"

// rig is one xrdp host, a deskway gateway on its own (its CPU is counted
// apart from the host's), the broker with the host's agent, an Xvfb for
// the xfreerdp clients, and the collector of the workloads' reports.
type rig struct {
	o          Options
	dir        string
	exe        string
	password   string
	users      []string
	rdpPort    int
	gwPort     int
	brokerPort int
	adminPort  int
	// gwAdminPort is the gateway's admin listener, unused but its own.
	gwAdminPort int
	adminToken  string
	display     string
	xrdpSHA256  string
	tokenKey    string
	frontToken  string
	client      *http.Client
	xrdp        []*childproc.Proc
	xvfb        *childproc.Proc
	gw, rest    *childproc.Proc
	col         *collector
	runToken    string
	// displays are the first and last X display sesman gives sessions.
	displays [2]int
}

// startwm is each user's session: an xterm that runs the workload, whose
// window shows the scrolled document.
const startwm = `#!/bin/sh
exec xterm -geometry 100x30+0+0 -bg white -fg black -e bash "$HOME/workload/workload.sh" %s %s %d
`

// setUp starts xrdp, the Xvfb and the gateway, and prepares the users;
// the broker starts with each ramp (startBroker).
func (r *rig) setUp(ctx context.Context) error {
	if err := xrdphost.Check("sessionhost", "the users "+userPrefix+"01…", "xrdp", "xrdp-sesman", "Xvfb", "xfreerdp", "xterm", "xdotool", "vim.tiny", "gzip", "bash", "useradd", "chpasswd", "pkill", "pgrep"); err != nil {
		return err
	}
	var err error
	if r.exe, err = os.Executable(); err != nil {
		return err
	}
	if r.xrdpSHA256, err = childproc.CertSHA256("/etc/xrdp/cert.pem"); err != nil {
		return fmt.Errorf("sessionhost: xrdp's certificate: %w", err)
	}
	r.runToken = xrdphost.Secret(16)
	if r.col, err = newCollector(r.runToken, r.o.Log); err != nil {
		return err
	}
	go r.col.serve(ctx)

	r.password = "Load-" + xrdphost.Secret(12)
	for i := 1; i <= r.o.Users; i++ {
		name := fmt.Sprintf("%s%02d", userPrefix, i)
		if err := r.prepareUser(name); err != nil {
			return err
		}
		r.users = append(r.users, name)
	}
	// The users' files on disk before the first logon: their writeback
	// would otherwise show as the first steps' disk latency.
	syscall.Sync()

	ports, err := loopback.FreePorts(5)
	if err != nil {
		return err
	}
	r.rdpPort, r.gwPort, r.brokerPort, r.adminPort, r.gwAdminPort = ports[0], ports[1], ports[2], ports[3], ports[4]
	if err := r.startXRDP(); err != nil {
		return err
	}
	if r.xvfb, r.display, err = childproc.StartXvfb(); err != nil {
		return fmt.Errorf("sessionhost: %w", err)
	}
	if err := tlsconf.SelfSigned(filepath.Join(r.dir, "tls.crt"), filepath.Join(r.dir, "tls.key"), []string{"127.0.0.1"}); err != nil {
		return err
	}
	trust, err := tlsconf.Trusting(filepath.Join(r.dir, "tls.crt"))
	if err != nil {
		return err
	}
	r.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: trust}}
	r.tokenKey, r.frontToken, r.adminToken = xrdphost.Secret(40), xrdphost.Secret(24), xrdphost.Secret(24)
	gwCfg := filepath.Join(r.dir, "gateway.yaml")
	if err := os.WriteFile(gwCfg, []byte(fmt.Sprintf(gatewayYAML, r.dir, r.tokenKey, r.gwPort, r.rdpPort, r.xrdpSHA256, r.gwAdminPort)), 0o600); err != nil {
		return err
	}
	if r.gw, err = childproc.Start(nil, r.exe, "gateway", "-c", gwCfg); err != nil {
		return err
	}
	if err := loopback.WaitPort(fmt.Sprintf("127.0.0.1:%d", r.gwPort), 20*time.Second); err != nil {
		return fmt.Errorf("sessionhost: the gateway: %w\n%s", err, r.gw.Tail(10))
	}
	return nil
}

// gatewayYAML is the bench's gateway; its admin API listens on a port of
// the bench's, not the default 9443 that an installed deskway holds.
const gatewayYAML = `state_dir: %[1]s/gw
log: {level: warn, format: json}
admin: {listen: "127.0.0.1:%[6]d"}
tls: {cert: %[1]s/tls.crt, key: %[1]s/tls.key}
auth:
  token_key: "%[2]s"
gateway:
  listen: "127.0.0.1:%[3]d"
  public_name: "127.0.0.1:%[3]d"
  connection_policies:
  - {name: load, groups: [load], auth_methods: [paa]}
  resource_policies:
  - {name: rdp, groups: [load], hosts: [127.0.0.1], ports: [%[4]d], host_certificate_sha256: [%[5]s]}
`

// prepareUser makes a host account with the workload's files and a
// session that runs it. Every user has files of their own, as every
// worker has their own documents: their page cache grows with the users.
func (r *rig) prepareUser(name string) error {
	wm := fmt.Sprintf(startwm, r.col.Addr(), r.runToken, r.o.Think.Milliseconds())
	if err := xrdphost.Account(name, r.password, wm); err != nil {
		return err
	}
	home := "/home/" + name
	dir := filepath.Join(home, "workload")
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(filepath.Join(dir, "files"), 0o755); err != nil {
		return err
	}
	rng := mrand.New(mrand.NewPCG(uint64(len(name)), uint64(name[len(name)-1])))
	files := map[string][]byte{
		"workload.sh": workloadScript,
		"big.txt":     words(rng, r.o.Files.SearchBytes),
		"doc.txt":     words(rng, r.o.Files.CompressBytes),
		"long.txt":    lines(rng, r.o.Files.ScrollLines),
		"note.txt":    []byte("Notes\n"),
	}
	for i := 0; i < r.o.Files.FolderFiles; i++ {
		files[fmt.Sprintf("files/letter-%03d.txt", i)] = words(rng, 16<<10)
	}
	for f, b := range files {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return err
		}
	}
	if out, err := exec.Command("chown", "-R", name+":", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("chown: %v %s", err, out)
	}
	return nil
}

// vocabulary is what the generated documents are written in; "meridian"
// is the word the search action looks for.
var vocabulary = strings.Fields(`the a report quarter budget team meeting figures sales customer
project review plan draft invoice schedule office account meridian market growth cost
forecast supplier contract delivery region manager policy agenda update summary`)

// words is n bytes of text made of the vocabulary, in lines of about 70.
func words(rng *mrand.Rand, n int) []byte {
	var b bytes.Buffer
	b.Grow(n + 80)
	col := 0
	for b.Len() < n {
		w := vocabulary[rng.IntN(len(vocabulary))]
		b.WriteString(w)
		col += len(w) + 1
		if col > 70 {
			b.WriteByte('\n')
			col = 0
		} else {
			b.WriteByte(' ')
		}
	}
	return b.Bytes()[:n]
}

// lines is a numbered document of n lines, for the terminal to scroll.
func lines(rng *mrand.Rand, n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%5d  %s\n", i, strings.TrimSpace(string(words(rng, 70))))
	}
	return b.Bytes()
}

// startXRDP starts xrdp on the bench's port, from the system's
// configuration, and its session manager with room for every user: the
// system's MaxSessions (50 on Debian) would refuse users past it, which
// is the configuration's limit, not the host's.
func (r *rig) startXRDP() error {
	sesman, err := os.ReadFile("/etc/xrdp/sesman.ini")
	if err != nil {
		return err
	}
	r.displays[0], r.displays[1] = 10, 60
	if m := regexp.MustCompile(`(?m)^X11DisplayOffset=(\d+)`).FindSubmatch(sesman); m != nil {
		r.displays[0], _ = strconv.Atoi(string(m[1]))
	}
	r.displays[1] = r.displays[0] + max(50, r.o.Users+10)
	sesman = regexp.MustCompile(`(?m)^MaxSessions=\d+`).ReplaceAll(sesman, []byte(fmt.Sprintf("MaxSessions=%d", r.displays[1]-r.displays[0])))
	sesmanPath := filepath.Join(r.dir, "sesman.ini")
	if err := os.WriteFile(sesmanPath, sesman, 0o644); err != nil {
		return err
	}
	childproc.RemoveStaleX(r.displays[0], r.displays[1])
	if r.xrdp, err = xrdphost.StartXRDP(r.dir, r.rdpPort, "--config", sesmanPath); err != nil {
		return fmt.Errorf("sessionhost: %w", err)
	}
	return nil
}

const restYAML = `state_dir: %[1]s
log: {level: info, format: json}
admin: {listen: "127.0.0.1:%[11]d", tokens: ["%[12]s"]}
tls: {cert: %[2]s/tls.crt, key: %[2]s/tls.key}
auth:
  token_key: "%[3]s"
  users:
%[4]sbroker:
  listen: "127.0.0.1:%[5]d"
  gateway: "127.0.0.1:%[6]d"
  frontend_tokens: ["%[7]s"]
  heartbeat_interval: 1s
  health: {cpu_pressure_max_pct: %[13]g}
  delivery_groups:
  - {name: desk, groups: [load], host_username: user, session_limit: %[8]d}
agent:
  broker: https://127.0.0.1:%[5]d
  broker_ca: %[2]s/tls.crt
  join_token: "%[9]s"
  name: xrdp-host
  address: 127.0.0.1
  port: %[10]d
  sessions: xrdp
  session_poll: 500ms
`

// startBroker starts the broker with the host's agent, a fresh database
// and the delivery group's session limit (0: none the ramp can reach).
func (r *rig) startBroker(ctx context.Context, name string, limit int) error {
	if limit <= 0 {
		limit = 10 * r.o.Users
	}
	state := filepath.Join(r.dir, "broker-"+name)
	var users strings.Builder
	for _, u := range r.users {
		fmt.Fprintf(&users, "  - {name: %s, password: %q, groups: [load]}\n", u, r.password)
	}
	cfg := filepath.Join(r.dir, "broker-"+name+".yaml")
	write := func(join string) error {
		return os.WriteFile(cfg, []byte(fmt.Sprintf(restYAML, state, r.dir, r.tokenKey, users.String(), r.brokerPort, r.gwPort, r.frontToken, limit, join, r.rdpPort, r.adminPort, r.adminToken, r.o.CPUPressureMaxPct)), 0o600)
	}
	if err := write("placeholder"); err != nil {
		return err
	}
	out, err := exec.Command(r.exe, "token", "join", "-c", cfg, "--group", "desk", "--ttl", "1h").CombinedOutput()
	if err != nil {
		return fmt.Errorf("deskway token join: %v %s", err, out)
	}
	if err := write(strings.TrimSpace(string(out))); err != nil {
		return err
	}
	if r.rest, err = childproc.Start(nil, r.exe, "run", "-c", cfg); err != nil {
		return err
	}
	if err := loopback.WaitPort(fmt.Sprintf("127.0.0.1:%d", r.brokerPort), 20*time.Second); err != nil {
		return fmt.Errorf("sessionhost: the broker: %w\n%s", err, r.rest.Tail(10))
	}
	// The host is registered once its agent's first heartbeat is in.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		if h, err := r.host(ctx); err == nil && h.LastSeen != "" {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("sessionhost: the agent did not register the host: %v\n%s", err, r.rest.Tail(20))
		}
	}
}

func (r *rig) stopBroker() {
	r.rest.Stop()
	r.rest = nil
}

// hostView is the broker's view of the session host.
type hostView struct {
	Name     string `json:"name"`
	Sessions int    `json:"sessions"`
	Status   string `json:"status"`
	LastSeen string `json:"last_seen"`
}

// host asks the broker's admin API about the session host.
func (r *rig) host(ctx context.Context) (hostView, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("https://127.0.0.1:%d/api/v1/broker/hosts", r.adminPort), nil)
	req.Header.Set("Authorization", "Bearer "+r.adminToken)
	resp, err := r.client.Do(req)
	if err != nil {
		return hostView{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return hostView{}, fmt.Errorf("GET /api/v1/broker/hosts: %s %s", resp.Status, b)
	}
	var hosts []hostView
	if err := json.Unmarshal(b, &hosts); err != nil {
		return hostView{}, err
	}
	for _, h := range hosts {
		if h.Name == "xrdp-host" {
			return h, nil
		}
	}
	return hostView{}, errors.New("the broker lists no host xrdp-host")
}

// launch asks the broker for user's desktop: an .rdp file through the
// gateway, or the broker's refusal (503 when no host takes the launch).
func (r *rig) launch(ctx context.Context, user string) (rdp string, status int, err error) {
	req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("https://127.0.0.1:%d/api/v1/launch", r.brokerPort), strings.NewReader(`{"delivery_group":"desk"}`))
	req.SetBasicAuth(user, r.password)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", resp.StatusCode, fmt.Errorf("launch: %s %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var lr struct {
		RDP string `json:"rdp"`
	}
	if err := json.Unmarshal(b, &lr); err != nil {
		return "", resp.StatusCode, err
	}
	return lr.RDP, resp.StatusCode, nil
}

// mintToken is a gateway token for user to the host, as `deskway token`
// mints it.
func (r *rig) mintToken(user string) (string, error) {
	out, err := exec.Command(r.exe, "token", "-c", filepath.Join(r.dir, "gateway.yaml"), "--user", user, "--groups", "load",
		"--host", "127.0.0.1", "--port", strconv.Itoa(r.rdpPort), "--ttl", "10m").Output()
	if err != nil {
		return "", fmt.Errorf("deskway token: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// close stops everything and ends the users' sessions.
func (r *rig) close() {
	if r.rest != nil {
		r.rest.Stop()
	}
	r.gw.Stop()
	r.xvfb.Stop()
	for i := len(r.xrdp) - 1; i >= 0; i-- {
		r.xrdp[i].Stop()
	}
	r.endSessions()
}

// endSessions ends every bench user's processes, the sessions of a
// ramp: asked first, so that each X server removes its display's socket
// and lock, then killed; displays left behind are freed.
func (r *rig) endSessions() {
	for _, u := range r.users {
		_ = exec.Command("pkill", "-TERM", "-u", u).Run()
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		left := false
		for _, u := range r.users {
			if exec.Command("pgrep", "-u", u).Run() == nil {
				left = true
				break
			}
		}
		if !left {
			break
		}
	}
	for _, u := range r.users {
		_ = exec.Command("pkill", "-KILL", "-u", u).Run()
	}
	childproc.RemoveStaleX(r.displays[0], r.displays[1])
}
