package web

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/obs"
)

// Console roles, from the least to the most allowed.
const (
	roleReadOnly = "readonly"
	roleHelpdesk = "helpdesk"
	roleAdmin    = "admin"
)

// consolePageSize is how many rows a console list shows at once; the
// admin API pages on the server, so a farm's 10,000 sessions stay fast.
const consolePageSize = 50

// console is the admin console: pages over the admin API, which it calls
// with a console token (admin.console_tokens), naming the person it acts
// for.
type console struct {
	cfg    *config.Console
	client *http.Client
	charts sampler
	// tabs maps each tab's path to its page, so that a refused action
	// shows the page it returns to, with its data, under the refusal.
	tabs map[string]http.HandlerFunc
}

// refusalKey carries a refused action's words and status to the tab
// page rendered in its answer.
type refusalKey struct{}

type refusal struct {
	status int
	msg    string
}

// role is what si may do in the console, "" for nothing.
func (c *console) role(si signIn) string {
	in := func(groups []string) bool {
		return slices.ContainsFunc(groups, func(g string) bool {
			return slices.ContainsFunc(si.Groups, func(h string) bool { return strings.EqualFold(g, h) })
		})
	}
	switch {
	case in(c.cfg.Admins):
		return roleAdmin
	case in(c.cfg.Helpdesk):
		return roleHelpdesk
	case in(c.cfg.ReadOnly):
		return roleReadOnly
	}
	return ""
}

// apiError is the admin API's refusal, in its words.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

// call sends method path to the admin API for si and decodes the answer
// into out; hdr, when given, receives the answer's headers.
func (c *console) call(ctx context.Context, si signIn, role, method, path string, body, out any, hdr *http.Header) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.cfg.API, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.cfg.Token.Value())
	// The role first: a long name must not push it out of the record.
	req.Header.Set(obs.ActorHeader, fmt.Sprintf("%s, web console: %s", role, actorName(si.User)))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("the admin API does not answer: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if hdr != nil {
		*hdr = resp.Header
	}
	if resp.StatusCode >= 300 {
		var e struct{ Error string }
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = resp.Status
		}
		return &apiError{status: resp.StatusCode, msg: e.Error}
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

// The admin API's rows, as the console reads them.
type (
	consoleHost struct {
		Name          string    `json:"name"`
		DeliveryGroup string    `json:"delivery_group"`
		Address       string    `json:"address"`
		Port          int       `json:"port"`
		Sessions      int       `json:"sessions"`
		SessionLimit  int       `json:"session_limit"`
		CPU           float64   `json:"cpu"`
		Memory        float64   `json:"memory"`
		Unhealthy     string    `json:"unhealthy"`
		AdminDrain    bool      `json:"admin_drain"`
		AgentDrain    bool      `json:"agent_drain"`
		LastSeen      time.Time `json:"last_seen"`
		Status        string    `json:"status"`
		// Memory per session, and the page activity that tells a host
		// out of memory from one merely using it.
		SessionMemory uint64  `json:"session_memory_bytes"`
		MajorFaults   float64 `json:"major_faults_per_s"`
		SwapIn        float64 `json:"swap_in_per_s"`
		SwapOut       float64 `json:"swap_out_per_s"`
		// CPUPressure is the share of time runnable tasks waited for a
		// CPU: what users feel of a busy CPU.
		CPUPressure float64 `json:"cpu_pressure"`
	}
	consoleSession struct {
		ID            string    `json:"id"`
		User          string    `json:"user"`
		DeliveryGroup string    `json:"delivery_group"`
		Host          string    `json:"host"`
		State         string    `json:"state"`
		Updated       time.Time `json:"updated"`
		// MemoryBytes is 0 until the host's agent reports it; CPU is
		// the share of one core.
		MemoryBytes uint64  `json:"memory_bytes"`
		CPU         float64 `json:"cpu"`
	}
	consoleTunnel struct {
		ID        uint32    `json:"id"`
		User      string    `json:"user"`
		Client    string    `json:"client_address"`
		Target    string    `json:"target"`
		Transport string    `json:"transport"`
		BytesUp   uint64    `json:"bytes_up"`
		BytesDown uint64    `json:"bytes_down"`
		Started   time.Time `json:"started"`
		Open      bool      `json:"channel_open"`
		// Node is the gateway holding the tunnel, in a farm.
		Node string `json:"node"`
	}
	consoleGroup struct {
		Name             string     `json:"name"`
		Description      string     `json:"description"`
		Kind             string     `json:"kind"`
		Users            []string   `json:"users"`
		Groups           []string   `json:"groups"`
		SessionLimit     int        `json:"session_limit"`
		LogonLimit       int        `json:"logon_limit"`
		EntitlementsFrom string     `json:"entitlements_from"`
		SetBy            string     `json:"set_by"`
		SetAt            *time.Time `json:"set_at"`
		ConfiguredUsers  []string   `json:"configured_users"`
		ConfiguredGroups []string   `json:"configured_groups"`
	}
	consoleVersion struct {
		Version int       `json:"version"`
		Stage   string    `json:"stage"`
		Created time.Time `json:"created"`
		Note    string    `json:"note"`
		// Running are the clients whose live boots run it.
		Running []string
	}
	consoleVDisk struct {
		Name        string `json:"name"`
		Mode        string `json:"mode"`
		Description string `json:"description"`
		Size        uint64 `json:"size"`
		Versions    []consoleVersion
	}
	consoleBoot struct {
		VDisk       string    `json:"vdisk"`
		Client      string    `json:"client"`
		Boot        string    `json:"boot"`
		Version     int       `json:"version"`
		Connections int       `json:"connections"`
		Started     time.Time `json:"started"`
		CacheRAM    uint64    `json:"cache_ram_bytes"`
		CacheSpill  uint64    `json:"cache_spill_bytes"`
	}
	consoleDevice struct {
		MAC        string     `json:"mac"`
		Name       string     `json:"name"`
		Collection string     `json:"collection"`
		VDisk      string     `json:"vdisk"`
		Stage      string     `json:"stage"`
		Enabled    bool       `json:"enabled"`
		LastBoot   *time.Time `json:"last_boot"`
		Menu       *struct {
			Entries []string `json:"entries"`
			Default string   `json:"default"`
			Timeout int      `json:"timeout"`
		} `json:"menu"`
		Running []struct {
			VDisk   string `json:"vdisk"`
			Version int    `json:"version"`
		} `json:"running"`
	}
	consoleCollection struct {
		Name     string `json:"name"`
		Devices  int    `json:"devices"`
		Enabled  int    `json:"enabled"`
		Disabled int    `json:"disabled"`
	}
	consoleAudit struct {
		Time   time.Time `json:"time"`
		Actor  string    `json:"actor"`
		Action string    `json:"action"`
		Source string    `json:"source"`
		Status int       `json:"status"`
	}
)

// FarmTunnels says whether the tunnels come from a gateway farm's list,
// which names the node holding each.
func (d *consoleData) FarmTunnels() bool {
	for _, t := range d.Tunnels {
		if t.Node != "" {
			return true
		}
	}
	return false
}

// consoleData is what a console page shows.
type consoleData struct {
	Role, Tab string
	Hosts     []consoleHost
	Sessions  []consoleSession
	Tunnels   []consoleTunnel
	Audit     []consoleAudit
	Groups    []consoleGroup
	VDisks    []consoleVDisk
	Boots     []consoleBoot
	// Devices are the network-booted machines; NetbootOff says the
	// stream role serves none (no stream.netboot).
	Devices     []consoleDevice
	Collections []consoleCollection
	NetbootOff  bool
	// Problems need a person: unhealthy, unreachable or draining hosts,
	// the broker's database away.
	Problems []string
	// Counts and charts on the dashboard.
	TunnelCount, SessionCount, HostCount int
	Charts                               []chart
	// Paging and filters of the sessions list.
	User, Host            string
	Page, Pages, Total    int
	PrevPage, NextPage    int
	CanControl, CanManage bool
	// Confirm is the question of a confirmation page.
	Confirm *consoleConfirm
}

// consoleAccess returns the sign-in and role of a console request, or
// answers it (sign-in page, or refusal) and returns false.
func (s *Server) consoleAccess(w http.ResponseWriter, r *http.Request) (signIn, string, bool) {
	si, ok := s.current(w, r)
	if !ok {
		http.Redirect(w, r, "/signin", http.StatusSeeOther)
		return si, "", false
	}
	role := s.console.role(si)
	if role == "" {
		s.render(w, http.StatusForbidden, "console.html", page{User: si.User, CSRF: s.codec.csrf(si),
			Error: "Your account has no console role: an administrator adds one of your groups to web.console."})
		return si, "", false
	}
	return si, role, true
}

// consoleShow renders a tab's page; in the answer to a refused action
// (consoleRefused) the refusal leads and the status is the refusal's.
func (s *Server) consoleShow(w http.ResponseWriter, r *http.Request, si signIn, d consoleData, errMsg string) {
	status := http.StatusOK
	if rf, ok := r.Context().Value(refusalKey{}).(refusal); ok {
		status = rf.status
		errMsg = strings.TrimSpace(rf.msg + " " + errMsg)
	}
	s.consolePage(w, si, status, d, errMsg, notice(r))
}

// consoleRefused answers a refused action with the page it returns to,
// its data listed as usual, and msg above it; before, the answer was
// that page's frame alone, which read as if it had nothing in it.
func (s *Server) consoleRefused(w http.ResponseWriter, r *http.Request, si signIn, role, back string, status int, msg string) {
	page, ok := s.console.tabs[back]
	if !ok {
		s.consolePage(w, si, status, consoleData{Role: role, Tab: strings.TrimPrefix(back, "/admin/")}, msg, "")
		return
	}
	get := r.Clone(context.WithValue(r.Context(), refusalKey{}, refusal{status: status, msg: msg}))
	get.Method, get.URL, get.Body = http.MethodGet, &url.URL{Path: back}, http.NoBody
	get.Form, get.PostForm = nil, nil
	page(w, get)
}

func (s *Server) consolePage(w http.ResponseWriter, si signIn, status int, d consoleData, errMsg, notice string) {
	d.CanControl = d.Role == roleAdmin || d.Role == roleHelpdesk
	d.CanManage = d.Role == roleAdmin
	s.render(w, status, "console.html", page{User: si.User, CSRF: s.codec.csrf(si), Console: &d, Error: errMsg, Notice: notice})
}

func (s *Server) consoleDashboard(w http.ResponseWriter, r *http.Request) {
	si, role, ok := s.consoleAccess(w, r)
	if !ok {
		return
	}
	s.console.charts.fresh(r.Context(), 2*time.Second)
	d := consoleData{Role: role, Tab: "dashboard", Charts: s.console.charts.charts()}
	var errs []string
	var hdr http.Header
	if err := s.console.call(r.Context(), si, role, "GET", "/api/v1/broker/hosts", nil, &d.Hosts, &hdr); err != nil {
		errs = append(errs, "The hosts cannot be listed: "+s.apiWords(err))
	} else if hdr.Get("Deskway-Source") != "" {
		d.Problems = append(d.Problems, "The broker's database does not answer: launches are placed from its local host cache.")
	}
	d.HostCount = len(d.Hosts)
	for _, h := range d.Hosts {
		if h.Status != "ok" {
			d.Problems = append(d.Problems, fmt.Sprintf("Host %s: %s", h.Name, h.Status))
		}
	}
	if err := s.console.call(r.Context(), si, role, "GET", "/api/v1/broker/sessions?limit=1&logged_on=1", nil, nil, &hdr); err != nil {
		errs = append(errs, "The sessions cannot be counted: "+s.apiWords(err))
	} else {
		d.SessionCount, _ = strconv.Atoi(hdr.Get("Deskway-Total"))
	}
	var tl struct{ Tunnels []consoleTunnel }
	if err := s.console.call(r.Context(), si, role, "GET", "/api/v1/gateway/tunnels", nil, &tl, nil); err == nil {
		d.TunnelCount = len(tl.Tunnels)
	}
	s.consoleShow(w, r, si, d, strings.Join(errs, " "))
}

func (s *Server) consoleSessions(w http.ResponseWriter, r *http.Request) {
	si, role, ok := s.consoleAccess(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	d := consoleData{Role: role, Tab: "sessions", User: q.Get("user"), Host: q.Get("host"), Page: 1}
	if n, err := strconv.Atoi(q.Get("page")); err == nil && n > 1 {
		d.Page = n
	}
	v := url.Values{"limit": {strconv.Itoa(consolePageSize)}, "offset": {strconv.Itoa((d.Page - 1) * consolePageSize)}}
	if d.User != "" {
		v.Set("user", d.User)
	}
	if d.Host != "" {
		v.Set("host", d.Host)
	}
	var hdr http.Header
	errMsg := ""
	if err := s.console.call(r.Context(), si, role, "GET", "/api/v1/broker/sessions?"+v.Encode(), nil, &d.Sessions, &hdr); err != nil {
		errMsg = "The sessions cannot be listed: " + s.apiWords(err)
	}
	d.Total, _ = strconv.Atoi(hdr.Get("Deskway-Total"))
	d.Pages = max(1, (d.Total+consolePageSize-1)/consolePageSize)
	if d.Page > 1 {
		d.PrevPage = d.Page - 1
	}
	if d.Page < d.Pages {
		d.NextPage = d.Page + 1
	}
	s.consoleShow(w, r, si, d, errMsg)
}

// consoleList is a console page showing one admin API list: into gives
// what the answer decodes into, in the page's data.
func (s *Server) consoleList(tab, what, path string, into func(d *consoleData) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		si, role, ok := s.consoleAccess(w, r)
		if !ok {
			return
		}
		d := consoleData{Role: role, Tab: tab}
		errMsg := ""
		if err := s.console.call(r.Context(), si, role, "GET", path, nil, into(&d), nil); err != nil {
			errMsg = "The " + what + " cannot be listed: " + s.apiWords(err)
		}
		s.consoleShow(w, r, si, d, errMsg)
	}
}

// consoleAction is one console form: who may post it, and the admin API
// call it makes.
type consoleAction struct {
	need   string // roleHelpdesk or roleAdmin
	what   string // for people: "drain hosts"
	back   string // the page to return to
	method string
	path   func(r *http.Request) string
	body   func(r *http.Request) any
	done   string // the notice shown after it (see noticeText)
	// confirm, when set, asks before the action: the form's first post
	// shows the question, and only the answer's post (confirmed=yes)
	// acts. It works without scripts.
	confirm func(r *http.Request) consoleConfirm
}

func (s *Server) consoleAct(a consoleAction) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		si, role, ok := s.consoleAccess(w, r)
		if !ok {
			return
		}
		if !s.checkForm(w, r, si) {
			return
		}
		if a.need == roleAdmin && role != roleAdmin || a.need == roleHelpdesk && role == roleReadOnly {
			s.d.Logger.Warn("console action refused for the role", "user", si.User, "role", role, "action", a.what)
			s.consoleRefused(w, r, si, role, a.back, http.StatusForbidden, fmt.Sprintf("Your role (%s) may not %s.", role, a.what))
			return
		}
		if a.confirm != nil && r.PostFormValue("confirmed") != "yes" {
			c := a.confirm(r)
			c.Action, c.Back = r.URL.Path, a.back
			s.consolePage(w, si, http.StatusOK, consoleData{Role: role, Tab: "confirm", Confirm: &c}, "", "")
			return
		}
		var body any
		if a.body != nil {
			body = a.body(r)
		}
		if err := s.console.call(r.Context(), si, role, a.method, a.path(r), body, nil, nil); err != nil {
			s.consoleRefused(w, r, si, role, a.back, http.StatusBadGateway, "Not done: "+s.apiWords(err))
			return
		}
		s.d.Logger.Info("console action", "user", si.User, "role", role, "action", a.what, "path", a.path(r))
		http.Redirect(w, r, withNotice(a.back, a.done), http.StatusSeeOther)
	}
}

// names splits a form field of names separated by commas or new lines;
// the admin API checks each.
func names(field string) []string {
	out := []string{}
	for _, n := range strings.FieldsFunc(field, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		if n = strings.TrimSpace(n); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// consoleRoutes adds the console's pages and actions to mux.
func (s *Server) consoleRoutes(mux *http.ServeMux) {
	pv := func(name string) func(*http.Request) string {
		return func(r *http.Request) string { return url.PathEscape(r.PathValue(name)) }
	}
	s.console.tabs = map[string]http.HandlerFunc{
		"/admin/":         s.consoleDashboard,
		"/admin/sessions": s.consoleSessions,
		"/admin/hosts":    s.consoleList("hosts", "hosts", "/api/v1/broker/hosts", func(d *consoleData) any { return &d.Hosts }),
		"/admin/tunnels": s.consoleList("tunnels", "tunnels", "/api/v1/gateway/tunnels", func(d *consoleData) any {
			return &struct {
				Tunnels *[]consoleTunnel `json:"tunnels"`
			}{&d.Tunnels}
		}),
		"/admin/audit": s.consoleList("audit", "audit entries", "/api/v1/audit?limit=200", func(d *consoleData) any {
			return &struct {
				Entries *[]consoleAudit `json:"entries"`
			}{&d.Audit}
		}),
		"/admin/groups": s.consoleList("groups", "delivery groups", "/api/v1/broker/groups", func(d *consoleData) any { return &d.Groups }),
		"/admin/vdisks": s.consoleVDisks,
	}
	for path, page := range s.console.tabs {
		if path == "/admin/" {
			path += "{$}"
		}
		mux.HandleFunc("GET "+path, page)
	}
	mux.HandleFunc("POST /admin/groups/{name}/entitlements", s.consoleAct(consoleAction{need: roleAdmin, what: "change entitlements",
		back: "/admin/groups", method: "PUT",
		path: func(r *http.Request) string { return "/api/v1/broker/groups/" + pv("name")(r) + "/entitlements" },
		body: func(r *http.Request) any {
			return map[string][]string{"users": names(r.PostFormValue("users")), "groups": names(r.PostFormValue("groups"))}
		},
		done: "entitlements-saved"}))
	mux.HandleFunc("POST /admin/groups/{name}/entitlements/clear", s.consoleAct(consoleAction{need: roleAdmin, what: "change entitlements",
		back: "/admin/groups", method: "DELETE",
		path: func(r *http.Request) string { return "/api/v1/broker/groups/" + pv("name")(r) + "/entitlements" },
		done: "entitlements-cleared"}))
	s.vdiskRoutes(mux, pv)
	for _, kind := range []string{"logoff", "disconnect", "message"} {
		mux.HandleFunc("POST /admin/sessions/{id}/"+kind, s.consoleAct(consoleAction{need: roleHelpdesk, what: kind + " sessions",
			back: "/admin/sessions", method: "POST",
			path: func(r *http.Request) string { return "/api/v1/broker/sessions/" + pv("id")(r) + "/" + kind },
			body: func(r *http.Request) any {
				if kind == "message" {
					return map[string]string{"text": r.PostFormValue("text")}
				}
				return nil
			},
			confirm: sessionConfirm(kind),
			done:    "session-" + kind}))
	}
	for _, on := range []bool{true, false} {
		verb := map[bool]string{true: "drain", false: "undrain"}[on]
		mux.HandleFunc("POST /admin/hosts/{name}/"+verb, s.consoleAct(consoleAction{need: roleAdmin, what: verb + " hosts",
			back: "/admin/hosts", method: "POST",
			path: func(r *http.Request) string { return "/api/v1/broker/hosts/" + pv("name")(r) + "/" + verb },
			body: func(*http.Request) any {
				if on {
					return map[string]bool{"drain": true}
				}
				return nil
			},
			done: "host-" + verb + "ed"}))
	}
	mux.HandleFunc("POST /admin/hosts/{name}/remove", s.consoleAct(consoleAction{need: roleAdmin, what: "remove hosts",
		back: "/admin/hosts", method: "DELETE",
		path: func(r *http.Request) string { return "/api/v1/broker/hosts/" + pv("name")(r) },
		confirm: func(r *http.Request) consoleConfirm {
			return consoleConfirm{Question: "Remove host " + r.PathValue("name") + "?", Button: "Remove the host",
				Detail: "The broker forgets the host. A host with live sessions cannot be removed; its agent registers it again only with a new join token."}
		},
		done: "host-removed"}))
	mux.HandleFunc("POST /admin/tunnels/{id}/disconnect", s.consoleAct(consoleAction{need: roleAdmin, what: "disconnect tunnels",
		back: "/admin/tunnels", method: "DELETE",
		path: func(r *http.Request) string {
			p := "/api/v1/gateway/tunnels/" + pv("id")(r)
			if n := r.PostFormValue("node"); n != "" {
				p += "?node=" + url.QueryEscape(n) // another farm node's tunnel
			}
			return p
		},
		confirm: func(r *http.Request) consoleConfirm {
			c := consoleConfirm{Question: "Disconnect tunnel " + r.PathValue("id") + "?", Button: "Disconnect",
				Detail: "The client's connection through the gateway is cut; its session on the host keeps running."}
			if n := r.PostFormValue("node"); n != "" {
				c.Keep = map[string]string{"node": n}
			}
			return c
		},
		done: "tunnel-disconnected"}))
}

// actorName is how the audit trail names a console user: as it is when
// it is letters, digits and . _ - @; otherwise quoted with every
// character outside ASCII escaped, so that a blank-looking character
// cannot pass for nothing. A long name is cut before its last @, so that
// the @NAMESPACE that tells a provider user from a directory user of the
// same name stays: at most about 100 characters, within the 128 the
// audit trail keeps.
func actorName(name string) string {
	plain := !strings.ContainsFunc(name, func(c rune) bool {
		return !unicode.IsLetter(c) && !unicode.IsDigit(c) && !unicode.IsMark(c) && !strings.ContainsRune("._-@", c)
	})
	local, domain := name, ""
	if i := strings.LastIndexByte(name, '@'); i > 0 {
		local, domain = name[:i], name[i:]
	}
	cut := func(s string, n int) string {
		if !plain {
			s = strconv.QuoteToASCII(s)
			s = s[1 : len(s)-1]
		}
		if r := []rune(s); len(r) > n {
			s = string(r[:n]) + "…"
		}
		return s
	}
	if plain {
		return cut(local, 48) + cut(domain, 48)
	}
	return `"` + cut(local, 48) + cut(domain, 48) + `"`
}
