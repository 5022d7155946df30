package web

import (
	"net/http"
	"net/url"
)

// noticeText is the notice a page shows after an action, by the key its
// redirect carries. The words are the portal's own, never a request's:
// a link made elsewhere, or by another user, can show only these.
func noticeText(key string) string {
	switch key {
	case "signed-out":
		return "Signed out."
	case "logoff":
		return "Logging off: the session's programs are being closed."
	case "entitlements-saved":
		return "Entitlements saved; every broker applies them."
	case "entitlements-cleared":
		return "The configuration's entitlements apply again."
	case "version-promoted":
		return "Version promoted."
	case "version-demoted":
		return "Version demoted."
	case "version-deleted":
		return "Version deleted."
	case "collection-assigned":
		return "Collection assigned: its devices boot the vDisk from their next power-on."
	case "collection-enabled":
		return "Collection enabled: its devices boot from their next power-on."
	case "collection-disabled":
		return "Collection disabled from its devices' next power-on."
	case "versions-merged":
		return "Versions merged into a new base."
	case "menu-set":
		return "Boot menu set: it shows from the next power-on."
	case "device-enabled":
		return "Device enabled from its next boot."
	case "device-disabled":
		return "Device disabled from its next boot."
	case "session-logoff":
		return "Logoff sent to the session's host."
	case "session-disconnect":
		return "Disconnect sent to the session's host."
	case "session-message":
		return "Message sent to the session's host."
	case "host-drained":
		return "Host drained."
	case "host-undrained":
		return "Host undrained."
	case "host-removed":
		return "Host removed."
	case "tunnel-disconnected":
		return "Tunnel disconnected."
	}
	return ""
}

// withNotice is path with the notice key for the page to show.
func withNotice(path, key string) string {
	return path + "?" + url.Values{"notice": {key}}.Encode()
}

// notice is the request's notice, if its key is one of the portal's.
func notice(r *http.Request) string { return noticeText(r.URL.Query().Get("notice")) }
