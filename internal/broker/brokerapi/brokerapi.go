// Package brokerapi is the broker's JSON wire format, shared by the broker,
// the agent and the client: types only, documented for people in
// docs/broker-openapi.yaml.
package brokerapi

import "time"

// LaunchRequest asks for a desktop in a delivery group.
type LaunchRequest struct {
	DeliveryGroup string `json:"delivery_group"`
	// User and Groups are set only by a trusted front end launching on
	// behalf of a user it authenticated; a user launching for themself
	// authenticates with HTTP Basic and leaves them empty.
	User   string   `json:"user,omitempty"`
	Groups []string `json:"groups,omitempty"`
	// Zone is where the request came from, when the front end knows.
	Zone string `json:"zone,omitempty"`
}

// DesktopsRequest asks which delivery groups a user may launch. A front
// end names the user (and the groups of a user the broker does not
// know); a user asking for themself authenticates with HTTP Basic and
// sends {}.
type DesktopsRequest struct {
	User   string   `json:"user,omitempty"`
	Groups []string `json:"groups,omitempty"`
}

// Desktop is a delivery group the user may launch, with the session a
// launch would return to.
type Desktop struct {
	DeliveryGroup string `json:"delivery_group"`
	// Kind is pooled or personal.
	Kind        string       `json:"kind"`
	Description string       `json:"description,omitempty"`
	Session     *UserSession `json:"session,omitempty"`
	// LastUsed is when the user's sessions of the group last changed (a
	// launch, logon, reconnection, disconnection or end); zero if they
	// never had one, or the broker answers from its cache while its
	// database is unreachable.
	LastUsed time.Time `json:"last_used,omitzero"`
}

// UserSession is a user's live session as the user may see it.
type UserSession struct {
	ID    string    `json:"id"`
	Host  string    `json:"host"`
	State string    `json:"state"`
	Since time.Time `json:"since"`
}

// SessionEnd is what the broker knows of how a user's session ended, for
// the page that showed it to say so in words.
type SessionEnd struct {
	// State is the session's state now: launching, active, disconnected
	// or ended.
	State string `json:"state"`
	// Command is the newest logoff or disconnect the session's host was
	// handed for it in the last minutes (by an administrator, or the
	// user's own logoff from the portal); "" when none.
	Command string `json:"command,omitempty"`
}

// LaunchResponse says where the session runs and how to reach it.
type LaunchResponse struct {
	SessionID string `json:"session_id"`
	Host      string `json:"host"`
	Address   string `json:"address"`
	Port      int    `json:"port"`
	// Reconnect is true when the user already had this session.
	Reconnect bool   `json:"reconnect"`
	Gateway   string `json:"gateway"`
	// Token is the gateway access (PAA) token for this user and host.
	Token string `json:"token"`
	// RDP is the .rdp file: host, gateway and token.
	RDP string `json:"rdp"`
	// SingleSignOn is true when the user has a desktop account
	// (auth.desktop_accounts): the gateway logs a browser session on
	// with it, and no password is asked.
	SingleSignOn bool `json:"single_sign_on,omitempty"`
}

// Error is every non-2xx body.
type Error struct {
	Error string `json:"error"`
}

// RegisterRequest is an agent joining a delivery group with a join token.
type RegisterRequest struct {
	// Name identifies the host; re-registering the same name updates it.
	Name    string `json:"name"`
	Address string `json:"address"`
	Port    int    `json:"port"`
	// Zone overrides the join token's zone, if the token names none.
	Zone string `json:"zone,omitempty"`
	// Weight is the host's relative capacity (default 1).
	Weight float64 `json:"weight,omitempty"`
	// SessionLimit lowers the group's per-host session limit.
	SessionLimit int `json:"session_limit,omitempty"`
}

// RegisterResponse hands the agent its credential.
type RegisterResponse struct {
	Host          string `json:"host"`
	DeliveryGroup string `json:"delivery_group"`
	// Credential authenticates this host's heartbeats and events.
	Credential        string  `json:"credential"`
	HeartbeatInterval float64 `json:"heartbeat_interval_s"`
}

// Heartbeat is an agent's periodic report.
type Heartbeat struct {
	Host string `json:"host"`
	// CPU and Memory are busy fractions, 0 to 1.
	CPU    float64 `json:"cpu"`
	Memory float64 `json:"memory"`
	// DiskIdle is the busiest disk's idle fraction, 0 to 1.
	DiskIdle float64 `json:"disk_idle"`
	// DiskLatencyMS is the busiest disk's average time per request.
	DiskLatencyMS float64 `json:"disk_latency_ms"`
	// MemoryPressure is the share of time tasks stalled on memory (PSI
	// "some"), 0 to 1: the page cache losing to working sets.
	MemoryPressure float64 `json:"memory_pressure"`
	// CPUPressure is the share of time at least one runnable task waited
	// for a CPU (PSI cpu "some" avg10), 0 to 1: waiting is what users
	// feel, where CPU busy only says how much is used. It is the whole
	// machine's (/proc/pressure/cpu is the root cgroup's), whatever
	// cgroup the agent runs in.
	CPUPressure float64 `json:"cpu_pressure"`
	// MajorFaultsPerSec, SwapInPerSec and SwapOutPerSec are the host's
	// major page faults and pages swapped in and out per second since the
	// previous heartbeat: a host whose memory is full pages in what its
	// sessions touch, which they feel as stalls.
	MajorFaultsPerSec float64 `json:"major_faults_per_s"`
	SwapInPerSec      float64 `json:"swap_in_per_s"`
	SwapOutPerSec     float64 `json:"swap_out_per_s"`
	// Drain asks for no new sessions (the host's own drain switch).
	Drain bool `json:"drain"`
	// RDPDown is the port of the host's RDP service when it did not
	// answer the agent's check (a TLS handshake), 0 when it did.
	RDPDown  int       `json:"rdp_down_port,omitempty"`
	Sessions []Session `json:"sessions"`
}

// Session is one user's session on a host as the host sees it.
type Session struct {
	User string `json:"user"`
	// State is active or disconnected.
	State string `json:"state"`
	// MemoryBytes is the proportional set size (Pss) of the session's
	// processes: shared pages divided among those mapping them, so the
	// sessions of a host add up to the memory they hold.
	MemoryBytes uint64 `json:"memory_bytes"`
	// CPU is the share of one core the session's processes used since
	// the previous heartbeat (above 1 on several cores); 0 on an agent's
	// first heartbeat.
	CPU float64 `json:"cpu"`
}

// Events reports session changes as they happen.
type Events struct {
	Host   string  `json:"host"`
	Events []Event `json:"events"`
}

// Event is one logon (state active), disconnect (disconnected),
// reconnect (active) or logoff (ended).
type Event struct {
	User  string `json:"user"`
	State string `json:"state"`
}

// DrainRequest turns a host's admin drain mode on or off.
type DrainRequest struct {
	Drain bool `json:"drain"`
}

// Session control commands an administrator sends to a session through
// the host's agent.
const (
	// Logoff ends the session: its programs are asked to quit, then stopped.
	Logoff = "logoff"
	// Disconnect drops the user's connection; the session runs on.
	Disconnect = "disconnect"
	// Message shows Text in the session.
	Message = "message"
)

// HeartbeatResponse carries the commands waiting for the host; a
// heartbeat with none is answered 204 No Content.
type HeartbeatResponse struct {
	Commands []Command `json:"commands"`
}

// Command is one session control command for the agent to carry out and
// answer with a CommandResult.
type Command struct {
	ID        string `json:"id"`
	SessionID string `json:"session_id"`
	User      string `json:"user"`
	// Kind is logoff, disconnect or message.
	Kind string `json:"kind"`
	// Text is the message to show (message only).
	Text string `json:"text,omitempty"`
}

// CommandResult is the agent's answer to a command.
type CommandResult struct {
	Host string `json:"host"`
	// Error is empty when the command was carried out, else why not.
	Error string `json:"error,omitempty"`
}

// CommandRequest is an administrator's logoff, disconnect or message
// for a session (Text for message only).
type CommandRequest struct {
	Text string `json:"text,omitempty"`
}

// CommandStatus is a command as the broker knows it.
type CommandStatus struct {
	Command
	Host string `json:"host"`
	// State is pending (waiting for the host's next heartbeat), sent (its
	// agent has it), done, failed, or expired (no agent answered in time).
	State string `json:"state"`
	// Error is the agent's reason for failed, or why expired.
	Error string `json:"error,omitempty"`
}

// EntitlementRequest sets who may launch a delivery group, replacing the
// users and groups its configuration gives it (PUT
// /api/v1/broker/groups/{name}/entitlements). Names are matched without
// regard to case, as the configuration's are; at least one is needed.
type EntitlementRequest struct {
	Users  []string `json:"users"`
	Groups []string `json:"groups"`
}

// DeliveryGroup is a delivery group as the admin API lists it, with its
// entitlements in force and where they come from.
type DeliveryGroup struct {
	Name         string   `json:"name"`
	Description  string   `json:"description,omitempty"`
	Kind         string   `json:"kind"`
	Spread       string   `json:"spread"`
	Users        []string `json:"users"`
	Groups       []string `json:"groups"`
	SessionLimit int      `json:"session_limit"`
	LogonLimit   int      `json:"logon_limit"`
	// EntitlementsFrom is "configuration", or "admin" when an
	// administrator set them; SetBy and SetAt then say who and when, and
	// ConfiguredUsers and ConfiguredGroups what clearing them brings back.
	EntitlementsFrom string     `json:"entitlements_from"`
	SetBy            string     `json:"set_by,omitempty"`
	SetAt            *time.Time `json:"set_at,omitempty"`
	ConfiguredUsers  []string   `json:"configured_users"`
	ConfiguredGroups []string   `json:"configured_groups"`
}

// PeerQuery is one broker asking another of the same database, during an
// outage of it or while settling after one, which sessions it holds of a
// user (the user its peer token names).
type PeerQuery struct {
	User string `json:"user"`
	// Hosts are hosts of the user's sessions the asker holds but does
	// not know, or has not heard from lately: the answer includes them
	// as the peer knows them.
	Hosts []string `json:"hosts,omitempty"`
	// JournalPending says the asker is away from the database: what it
	// places meanwhile is in its journal alone, so the peer, on the
	// database, asks it in turn before placing a user until it has
	// written back (PeerSessions.JournalPending).
	JournalPending bool `json:"journal_pending,omitempty"`
}

// PeerSessions is a broker's answer to a PeerQuery: the user's live
// sessions and pending placements in its local host cache, and the hosts
// they are on as it knows them.
type PeerSessions struct {
	Sessions []PeerSession `json:"sessions"`
	Hosts    []PeerHost    `json:"hosts"`
	// JournalPending is true while the peer is away from the database
	// or has not yet written back what it did meanwhile: a session it
	// placed then may be in no row of the database yet, so a broker
	// back on the database asks it before placing a user anew.
	JournalPending bool `json:"journal_pending"`
}

// PeerSession is one live session or pending placement a peer holds.
type PeerSession struct {
	// ID is empty for a session the peer knows only from its host's
	// report during the outage.
	ID            string    `json:"id,omitempty"`
	DeliveryGroup string    `json:"delivery_group"`
	Host          string    `json:"host"`
	State         string    `json:"state"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// PeerHost is a host as a peer's local host cache holds it: a host that
// registered through the peer shortly before the database went away is
// in no other broker's copy, and its reports may all go to the peer.
type PeerHost struct {
	Name          string    `json:"name"`
	DeliveryGroup string    `json:"delivery_group"`
	Zone          string    `json:"zone,omitempty"`
	Address       string    `json:"address"`
	Port          int       `json:"port"`
	Weight        float64   `json:"weight"`
	SessionLimit  int       `json:"session_limit"`
	LogonLimit    int       `json:"logon_limit"`
	Sessions      int       `json:"sessions"`
	Pending       int       `json:"pending"`
	CPU           float64   `json:"cpu"`
	Mem           float64   `json:"mem"`
	DiskIdle      float64   `json:"disk_idle"`
	DiskLatency   float64   `json:"disk_latency_ms"`
	MemPressure   float64   `json:"mem_pressure"`
	CPUPressure   float64   `json:"cpu_pressure"`
	Unhealthy     string    `json:"unhealthy,omitempty"`
	AdminDrain    bool      `json:"admin_drain,omitempty"`
	AgentDrain    bool      `json:"agent_drain,omitempty"`
	AssignedUser  string    `json:"assigned_user,omitempty"`
	Registration  string    `json:"registration"`
	RegisteredAt  time.Time `json:"registered_at"`
	LastSeen      time.Time `json:"last_seen"`
}
