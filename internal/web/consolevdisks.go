package web

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// consoleVDisks is the vDisks page: the images with their versions and
// the devices running each, the live boots, the network-booted devices
// and their collections.
func (s *Server) consoleVDisks(w http.ResponseWriter, r *http.Request) {
	si, role, ok := s.consoleAccess(w, r)
	if !ok {
		return
	}
	d := consoleData{Role: role, Tab: "vdisks"}
	var vl struct{ VDisks []consoleVDisk }
	var bl struct{ Boots []consoleBoot }
	errMsg := ""
	if err := s.console.call(r.Context(), si, role, "GET", "/api/v1/stream/vdisks", nil, &vl, nil); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.status == http.StatusNotFound {
			errMsg = "This deskway runs no stream role: there are no vDisks to show."
		} else {
			errMsg = "The vDisks cannot be listed: " + s.apiWords(err)
		}
	} else {
		_ = s.console.call(r.Context(), si, role, "GET", "/api/v1/stream/boots", nil, &bl, nil)
		for i, vd := range vl.VDisks {
			var vs struct{ Versions []consoleVersion }
			if err := s.console.call(r.Context(), si, role, "GET", "/api/v1/stream/vdisks/"+url.PathEscape(vd.Name)+"/versions", nil, &vs, nil); err == nil {
				for j, v := range vs.Versions {
					for _, b := range bl.Boots {
						if b.VDisk == vd.Name && b.Version == v.Version && !slices.Contains(vs.Versions[j].Running, b.Client) {
							vs.Versions[j].Running = append(vs.Versions[j].Running, b.Client)
						}
					}
				}
				vl.VDisks[i].Versions = vs.Versions
			}
		}
		var dl struct{ Devices []consoleDevice }
		err := s.console.call(r.Context(), si, role, "GET", "/api/v1/stream/devices", nil, &dl, nil)
		var ae *apiError
		d.NetbootOff = errors.As(err, &ae) && ae.status == http.StatusNotFound
		d.Devices = dl.Devices
		if !d.NetbootOff {
			var cl struct{ Collections []consoleCollection }
			_ = s.console.call(r.Context(), si, role, "GET", "/api/v1/stream/collections", nil, &cl, nil)
			d.Collections = cl.Collections
		}
	}
	d.VDisks, d.Boots = vl.VDisks, bl.Boots
	s.consoleShow(w, r, si, d, errMsg)
}

// vdiskRoutes adds the vDisks page and its actions to mux.
func (s *Server) vdiskRoutes(mux *http.ServeMux, pv func(string) func(*http.Request) string) {
	version := func(r *http.Request) string {
		return "/api/v1/stream/vdisks/" + pv("name")(r) + "/versions/" + pv("n")(r)
	}
	mux.HandleFunc("POST /admin/vdisks/{name}/versions/{n}/promote", s.consoleAct(consoleAction{need: roleAdmin, what: "promote vDisk versions",
		back: "/admin/vdisks", method: "POST",
		path: func(r *http.Request) string { return version(r) + "/promote" },
		done: "version-promoted"}))
	mux.HandleFunc("POST /admin/vdisks/{name}/versions/{n}/demote", s.consoleAct(consoleAction{need: roleAdmin, what: "demote vDisk versions",
		back: "/admin/vdisks", method: "POST",
		path: func(r *http.Request) string { return version(r) + "/demote" },
		confirm: func(r *http.Request) consoleConfirm {
			return consoleConfirm{Question: fmt.Sprintf("Demote version %s of %s?", r.PathValue("n"), r.PathValue("name")), Button: "Demote the version",
				Detail: "A production version goes back to test: production devices boot the newest production version before it from their next power-on (a revert). A test version goes back to maintenance, to be changed again. Machines running it now keep it until they shut down."}
		},
		done: "version-demoted"}))
	mux.HandleFunc("POST /admin/vdisks/{name}/versions/{n}/delete", s.consoleAct(consoleAction{need: roleAdmin, what: "delete vDisk versions",
		back: "/admin/vdisks", method: "DELETE",
		path: version,
		confirm: func(r *http.Request) consoleConfirm {
			return consoleConfirm{Question: fmt.Sprintf("Delete version %s of %s?", r.PathValue("n"), r.PathValue("name")), Button: "Delete the version",
				Detail: "Its changes are removed from the store for good. A version a device runs or is assigned to, or one another version is built on, is not deleted."}
		},
		done: "version-deleted"}))
	mux.HandleFunc("POST /admin/vdisks/{name}/merge", s.consoleAct(consoleAction{need: roleAdmin, what: "merge vDisk versions",
		back: "/admin/vdisks", method: "POST",
		path: func(r *http.Request) string { return "/api/v1/stream/vdisks/" + pv("name")(r) + "/merge" },
		done: "versions-merged"}))
	for _, verb := range []string{"enable", "disable"} {
		mux.HandleFunc("POST /admin/devices/{name}/"+verb, s.consoleAct(consoleAction{need: roleAdmin, what: verb + " devices",
			back: "/admin/vdisks", method: "POST",
			path: func(r *http.Request) string { return "/api/v1/stream/devices/" + pv("name")(r) + "/" + verb },
			done: "device-" + verb + "d"}))
		a := consoleAction{need: roleAdmin, what: verb + " collections",
			back: "/admin/vdisks", method: "POST",
			path: func(r *http.Request) string { return "/api/v1/stream/collections/" + pv("name")(r) + "/" + verb },
			done: "collection-" + verb + "d"}
		if verb == "disable" {
			a.confirm = func(r *http.Request) consoleConfirm {
				return consoleConfirm{Question: "Disable every device of collection " + r.PathValue("name") + "?", Button: "Disable the collection",
					Detail: "None of its devices boots from its next power-on: their consoles say they are disabled, and ask again every minute. Machines running now go on."}
			}
		}
		mux.HandleFunc("POST /admin/collections/{name}/"+verb, s.consoleAct(a))
	}
	mux.HandleFunc("POST /admin/collections/{name}/assign", s.consoleAct(consoleAction{need: roleAdmin, what: "assign collections",
		back: "/admin/vdisks", method: "POST",
		path: func(r *http.Request) string { return "/api/v1/stream/collections/" + pv("name")(r) + "/assign" },
		body: func(r *http.Request) any {
			return map[string]string{"vdisk": r.PostFormValue("vdisk"), "stage": r.PostFormValue("stage")}
		},
		confirm: func(r *http.Request) consoleConfirm {
			stage := r.PostFormValue("stage")
			if stage == "" {
				stage = "production"
			}
			return consoleConfirm{Question: fmt.Sprintf("Boot %s (%s) on every device of collection %s?", r.PostFormValue("vdisk"), stage, r.PathValue("name")), Button: "Assign the collection",
				Detail: "Every device of the collection boots it from its next power-on; machines running now keep what they booted.",
				Keep:   map[string]string{"vdisk": r.PostFormValue("vdisk"), "stage": r.PostFormValue("stage")}}
		},
		done: "collection-assigned"}))
	for _, kind := range []string{"devices", "collections"} {
		mux.HandleFunc("POST /admin/"+kind+"/{name}/menu", s.consoleAct(consoleAction{need: roleAdmin, what: "set boot menus",
			back: "/admin/vdisks", method: "PUT",
			path: func(r *http.Request) string { return "/api/v1/stream/" + kind + "/" + pv("name")(r) + "/menu" },
			body: menuBody,
			done: "menu-set"}))
	}
}

// menuBody is the boot menu a console form sets: its entries separated
// by spaces or commas, none removing the menu; no timeout is 10 s, as
// the command line's.
func menuBody(r *http.Request) any {
	entries := strings.FieldsFunc(r.PostFormValue("entries"), func(c rune) bool { return c == ' ' || c == ',' })
	if len(entries) == 0 {
		return map[string]any{"menu": nil}
	}
	// A timeout that is not a number goes as -1, which the server
	// refuses in words.
	timeout, err := 10, error(nil)
	if t := strings.TrimSpace(r.PostFormValue("timeout")); t != "" {
		timeout, err = strconv.Atoi(t)
	}
	if err != nil {
		timeout = -1
	}
	return map[string]any{"menu": map[string]any{"entries": entries, "default": strings.TrimSpace(r.PostFormValue("default")), "timeout": timeout}}
}
