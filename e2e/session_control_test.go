package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/deskway/deskway/internal/testkit"
)

// testSessionControlOnXRDP is an administrator controlling a user's real
// xrdp session with deskway session message, disconnect and logoff, as
// the README shows them: the message appears in the session (on the
// user's screen, through xfreerdp), the disconnect drops the client and
// keeps the session, and the logoff leaves no process of the user on the
// host and ends the broker's record.
func testSessionControlOnXRDP(t *testing.T, xs testkit.XRDPSetup) {
	testkit.Require(t, "xmessage", "xwininfo", "xrdp-dis")
	b := newBrokerRig(t, xs)
	lr := b.launch()
	rdp := filepath.Join(b.dir, "desk.rdp")
	if err := os.WriteFile(rdp, []byte(lr.RDP), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := exec.CommandContext(ctx, "xfreerdp", rdp, "/cert:ignore", "/u:"+b.xrdp.User, "/p:"+b.xrdp.Password, "/size:800x600", "/gt:http")
	client.Env = append(os.Environ(), "DISPLAY="+b.display)
	client.Stdin = strings.NewReader("y\n")
	out := &testkit.Buffer{}
	client.Stdout, client.Stderr = out, out
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- client.Wait() }()
	b.waitState("active")
	deskway := func(args ...string) (string, error) {
		o, err := exec.Command(b.bin, append(args, "-c", b.cfg)...).CombinedOutput()
		return string(o), err
	}
	must := func(args ...string) string {
		t.Helper()
		o, err := deskway(args...)
		if err != nil {
			t.Fatalf("deskway %s: %v\n%s\n%s", strings.Join(args, " "), err, o, lastLines(b.gwLog.Log.String(), 30))
		}
		return o
	}
	if o := must("session", "ls", "--user", b.xrdp.User); !strings.Contains(o, lr.SessionID) || !strings.Contains(o, "active") {
		t.Fatalf("session ls:\n%s", o)
	}
	display := sessionDisplay(t, b.xrdp.User)
	// The session is active once its X server has the client; the
	// desktop's xterm starts a moment later.
	var desk []int
	eventually(t, 20*time.Second, "the session's xterm", func() (bool, string) {
		desk = userProcs(t, b.xrdp.User, "xterm")
		return len(desk) == 1, b.xrdp.User + " runs xterms " + strconv.Itoa(len(desk)) + ", want 1"
	})

	// A message shows in the session, and so on the user's screen.
	white := func() int { return testkit.CountColor(testkit.Screenshot(t, b.display, ""), 255, 255, 255) }
	before := white()
	if o := must("session", "message", lr.SessionID, "Deskway: this host restarts at 18:00. Save your work."); !strings.Contains(o, "message done on xrdp-host") {
		t.Fatalf("session message said:\n%s", o)
	}
	wininfo := exec.Command("xwininfo", "-display", display, "-root", "-tree")
	wininfo.Env = append(os.Environ(), "XAUTHORITY=/home/"+b.xrdp.User+"/.Xauthority")
	tree, err := wininfo.CombinedOutput()
	if err != nil {
		t.Fatalf("xwininfo: %v %s", err, tree)
	}
	if !strings.Contains(string(tree), `"xmessage"`) {
		t.Fatalf("no xmessage window on the session's display %s:\n%s", display, tree)
	}
	for deadline := time.Now().Add(5 * time.Second); white() < before+5000; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the message did not reach the client's screen: %d white pixels, %d before", white(), before)
		}
	}
	testkit.Screenshot(t, b.display, filepath.Join(b.artifacts, "message.png"))

	// A disconnect ends the client and keeps the session.
	if o := must("session", "disconnect", lr.SessionID); !strings.Contains(o, "disconnect done on xrdp-host") {
		t.Fatalf("session disconnect said:\n%s", o)
	}
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("xfreerdp still runs 15 s after the disconnect:\n%s", out.String())
	}
	b.waitState("disconnected")
	if now := userProcs(t, b.xrdp.User, "xterm"); len(now) != 1 || now[0] != desk[0] {
		t.Fatalf("after the disconnect %s runs xterms %v, want the session's %v", b.xrdp.User, now, desk)
	}
	if o, err := deskway("session", "disconnect", lr.SessionID); err == nil || !strings.Contains(o, "already disconnected") {
		t.Fatalf("a second disconnect: %v\n%s", err, o)
	}

	// A logoff leaves nothing of the user on the host, and the record ends.
	if o := must("session", "logoff", lr.SessionID); !strings.Contains(o, "logoff done on xrdp-host") {
		t.Fatalf("session logoff said:\n%s", o)
	}
	if left := running(t, b.xrdp.User); len(left) > 0 {
		t.Fatalf("after the logoff %s still runs:\n%s", b.xrdp.User, strings.Join(left, "\n"))
	}
	b.waitState("none (<nil>)")
	if o := must("session", "ls", "--all", "--user", b.xrdp.User); !regexp.MustCompile(lr.SessionID + `\s.*\sended\s`).MatchString(o) {
		t.Fatalf("session ls --all after the logoff:\n%s", o)
	}
	if o, err := deskway("session", "logoff", lr.SessionID); err == nil || !strings.Contains(o, "has ended") {
		t.Fatalf("a logoff of the ended session: %v\n%s", err, o)
	}
	// Every command is in the audit trail.
	for _, kind := range []string{"message", "disconnect", "logoff"} {
		b.gatewayLogHas(t, 0, `"msg":"admin action"`, `/api/v1/broker/sessions/`+lr.SessionID+`/`+kind)
	}
}

// sessionDisplay is the X display of user's xrdp session (:N).
func sessionDisplay(t *testing.T, user string) string {
	t.Helper()
	o, err := exec.Command("pgrep", "-a", "-u", user, "-x", "Xorg").Output()
	if err != nil {
		t.Fatalf("no Xorg of %s: %v", user, err)
	}
	m := regexp.MustCompile(`\s(:\d+)\s`).FindStringSubmatch(string(o))
	if m == nil {
		t.Fatalf("no display in %q", o)
	}
	return m[1]
}

// running lists user's processes that run (a zombie, whose end is only
// not yet collected by its parent, has ended).
func running(t *testing.T, user string) []string {
	t.Helper()
	out, _ := exec.Command("ps", "-u", user, "-o", "pid=,stat=,args=").Output()
	var left []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && !strings.HasPrefix(f[1], "Z") {
			left = append(left, line)
		}
	}
	return left
}
