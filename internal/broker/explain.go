package broker

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/store"
	"github.com/deskway/deskway/internal/config"
)

// Unhealthy says why a host reporting hb should take no new sessions under
// the thresholds h, or returns "" when it is healthy. The disk and memory
// thresholds are the Terminal Server sizing guidance: disks at least half
// idle, under 25 ms a request, and memory not so short that the page cache
// thrashes. CPU is judged by pressure, how often runnable tasks wait for
// a CPU, not by how busy it is: waiting is what users feel, and a host
// 95% busy can still serve everyone promptly. A host whose RDP service
// does not answer comes first: no threshold matters while nobody can
// connect.
func Unhealthy(h config.Health, hb brokerapi.Heartbeat) string {
	var why []string
	if hb.RDPDown != 0 {
		why = append(why, fmt.Sprintf("RDP service not answering on port %d", hb.RDPDown))
	}
	if idle := hb.DiskIdle * 100; idle < h.DiskIdleMinPct {
		why = append(why, fmt.Sprintf("disk idle %.0f%% < %.0f%%", idle, h.DiskIdleMinPct))
	}
	if hb.DiskLatencyMS > h.DiskLatencyMaxMS {
		why = append(why, fmt.Sprintf("disk latency %.0f ms > %.0f ms", hb.DiskLatencyMS, h.DiskLatencyMaxMS))
	}
	if p := hb.MemoryPressure * 100; p > h.MemoryPressureMaxPct {
		why = append(why, fmt.Sprintf("memory pressure %.0f%% > %.0f%%", p, h.MemoryPressureMaxPct))
	}
	if p := hb.CPUPressure * 100; p > h.CPUPressureMaxPct {
		why = append(why, fmt.Sprintf("cpu pressure %.0f%% > %.0f%%", p, h.CPUPressureMaxPct))
	}
	return strings.Join(why, ", ")
}

// HostStatus is one word for whether a host takes new sessions and, if
// not, why: ok, unreachable, draining, unhealthy, full, assigned (a
// personal host of another user), or logons (at its logon limit).
func HostStatus(h store.Host, stale time.Time, personal bool, user string) string {
	switch {
	case h.LastSeen.Before(stale):
		return "unreachable"
	case h.AdminDrain || h.AgentDrain:
		return "draining"
	case h.Unhealthy != "":
		return "unhealthy"
	case h.Sessions >= h.SessionLimit:
		return "full"
	case personal && h.AssignedUser != "" && h.AssignedUser != user:
		return "assigned"
	case h.Pending >= h.LogonLimit:
		return "logons"
	}
	return "ok"
}

// Explain says, in words an administrator can act on, why no host of a
// delivery group took a launch, and whether retrying soon may help (hosts
// busy with logons free up as users arrive).
func Explain(group string, hosts []store.Host, stale time.Time, personal bool, user string) (string, bool) {
	if len(hosts) == 0 {
		return fmt.Sprintf("delivery group %q has no hosts: run deskway agent on its session hosts with a join token (deskway token join --group %s)", group, group), false
	}
	count := map[string]int{}
	var sick []string
	for _, h := range hosts {
		st := HostStatus(h, stale, personal, user)
		count[st]++
		if st == "unhealthy" && len(sick) < 3 {
			sick = append(sick, h.Name+": "+h.Unhealthy)
		}
	}
	if count["ok"] > 0 {
		return fmt.Sprintf("every free host of delivery group %q was taken by concurrent launches; retry", group), true
	}
	var parts []string
	add := func(key, words string) {
		if n := count[key]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, words))
		}
	}
	add("draining", "draining")
	add("full", "full")
	add("assigned", "assigned to other users")
	add("logons", "at their logon limit")
	add("unreachable", "unreachable (no heartbeat)")
	if n := count["unhealthy"]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d unhealthy (%s)", n, strings.Join(sick, "; ")))
	}
	return fmt.Sprintf("no host of delivery group %q can take a launch: %s", group, strings.Join(parts, ", ")), count["logons"] > 0
}

// RDPFile is the .rdp file for a placement: the host, routed through the
// gateway with a PAA token, as mstsc and xfreerdp read it.
// user is the session host's user name, or "" to leave it to the client.
//
// Auto-reconnect is on: mstsc has it on unless a file says otherwise,
// but xfreerdp has it off, and without it a client whose gateway node
// dies ends its connection where it could have come back to its session
// through another node.
func RDPFile(address string, port int, gateway, token, user string) string {
	lines := []string{
		"full address:s:" + net.JoinHostPort(address, strconv.Itoa(port)),
		"gatewayhostname:s:" + gateway,
		"gatewayusagemethod:i:1",
		"gatewayprofileusagemethod:i:1",
		"gatewaycredentialssource:i:5",
		"gatewayaccesstoken:s:" + token,
		"autoreconnection enabled:i:1",
	}
	if user != "" {
		lines = append(lines, "username:s:"+user)
	}
	lines = append(lines, "prompt for credentials:i:0")
	return strings.Join(lines, "\r\n") + "\r\n"
}
