package web

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"strings"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// browserClientFile is the browser RDP client's backend, present when the
// binary was built with `make` (scripts/web-assets.sh).
const browserClientFile = "static/vendor/iron-remote-desktop-rdp.js"

// browserClientBuilt reports whether the binary embeds the browser client.
func browserClientBuilt() bool {
	_, err := fs.Stat(assets, browserClientFile)
	return err == nil
}

// browserData is what the browser desktop page needs to connect: the
// gateway's websocket, the host, the one-use token and the user's name on
// the desktop where the broker names it, which the person may change (a
// portal account need not be one of the host's). The password is asked for on the page and goes from
// the browser to the host only.
type browserData struct {
	Title, Group, User, Gateway, Destination, Token string
	// SSO: the gateway logs the session on with the user's desktop
	// account, so the page asks for nothing.
	SSO bool
	// Session, CSRF and Opened (the portal's clock, Unix ms) let the page
	// ask the portal, when its connection ends, why (POST /browser/end).
	Session, CSRF, Opened string
}

// openInBrowser launches a desktop like launch does, but answers with a
// page that runs the desktop in the tab, through the gateway's /rdp.
func (s *Server) openInBrowser(w http.ResponseWriter, r *http.Request) {
	si, ok := s.current(w, r)
	if !ok {
		http.Redirect(w, r, "/signin", http.StatusSeeOther)
		return
	}
	if !s.checkForm(w, r, si) {
		return
	}
	if !s.browserClient {
		s.desktopsFailed(w, r, si, "This portal was built without the browser client: build deskway with make, or launch the .rdp file.")
		return
	}
	group := r.PostFormValue("delivery_group")
	res, ok := s.startDesktop(w, r, si, group)
	if !ok {
		return
	}
	// The form names the desktop's user only where the broker says who
	// that is (the group's host_username): the portal's name is no guess
	// to make, since a wrong one costs the person the desktop's pass.
	user := rdpField(res.RDP, "username")
	d := browserData{Title: group, Group: group, User: user, Gateway: "wss://" + res.Gateway + "/rdp",
		Destination: res.Address + ":" + strconv.Itoa(res.Port), Token: res.Token, SSO: res.SingleSignOn, Session: res.SessionID, CSRF: s.codec.csrf(si),
		Opened: strconv.FormatInt(s.d.Now().UnixMilli(), 10)}
	if strings.Contains(res.Address, ":") {
		d.Destination = "[" + res.Address + "]:" + strconv.Itoa(res.Port)
	}
	// The client is WebAssembly, which it fetches from a data: URL inside
	// its module; it draws its own styles into its shadow root, shows the
	// host's cursor as a data: image and speaks to the gateway, whose
	// origin differs from the portal's.
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self' data: wss://"+res.Gateway+"; frame-ancestors 'none'; form-action 'none'; base-uri 'none'")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := s.browserPage.Execute(w, d); err != nil {
		s.d.Logger.Error("browser page", "error", err)
	}
}

// rdpField is the value of key in an .rdp file's "key:type:value" lines.
func rdpField(rdp, key string) string {
	for _, line := range strings.Split(rdp, "\n") {
		k, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.EqualFold(k, key) {
			continue
		}
		if _, v, ok := strings.Cut(rest, ":"); ok {
			return v
		}
	}
	return ""
}

// browserPass answers the browser desktop page, as JSON, with a new
// one-use pass to its desktop ({"token", "gateway", "destination",
// "session", "opened"}), or why there is none ({"message"}): the desktop
// refused the user name or password typed on the page, and the pass the
// page had is spent.
func (s *Server) browserPass(w http.ResponseWriter, r *http.Request) {
	si, ok := s.current(w, r)
	if !ok {
		http.Error(w, "Your sign-in to the portal has ended.", http.StatusUnauthorized)
		return
	}
	if !s.checkForm(w, r, si) {
		return
	}
	group := r.PostFormValue("delivery_group")
	w.Header().Set("Content-Type", "application/json")
	res, err := s.d.Broker.Launch(r.Context(), brokerapi.LaunchRequest{DeliveryGroup: group, User: si.User, Groups: si.Groups})
	if err != nil {
		s.d.Logger.Warn("portal launch failed", "user", si.User, "delivery_group", group, "error", err, "for", "another logon in the browser")
		_ = json.NewEncoder(w).Encode(map[string]string{"message": launchRefusal(group, err)})
		return
	}
	s.d.Logger.Info("portal launch", "user", si.User, "delivery_group", group, "host", res.Host, "reconnect", res.Reconnect, "for", "another logon in the browser")
	dest := res.Address + ":" + strconv.Itoa(res.Port)
	if strings.Contains(res.Address, ":") {
		dest = "[" + res.Address + "]:" + strconv.Itoa(res.Port)
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"token": res.Token, "gateway": "wss://" + res.Gateway + "/rdp", "destination": dest,
		"session": res.SessionID, "opened": strconv.FormatInt(s.d.Now().UnixMilli(), 10)})
}
