package config

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// Stream is the vDisk streaming role (NBD).
type Stream struct {
	Listen string `yaml:"listen"`
	// TLS is off, on (offered through NBD_OPT_STARTTLS) or require
	// (plain-text clients are refused).
	TLS string `yaml:"tls"`
	// Clients is how clients are admitted: certificate (the default: a
	// client certificate from deskway's CA, whose name is the only client
	// whose boots and private image it may open; TLS is then required)
	// or open (any client that reaches the port may open any export, for
	// a network where every machine is trusted).
	Clients string `yaml:"clients"`
	// Store holds write-cache overflow and private images.
	Store string `yaml:"store"`
	// CacheRAMMB is how much of each client boot's write cache stays in
	// RAM before it overflows to a sparse file in Store.
	CacheRAMMB int `yaml:"cache_ram_mb"`
	// ReconnectWindow is how long a boot's write cache outlives its last
	// connection when the client left without NBD_CMD_DISC.
	ReconnectWindow Duration `yaml:"reconnect_window"`
	// SharedCache keeps write caches as files in Store instead of RAM, so
	// that another server sharing the store can take a boot over.
	SharedCache bool `yaml:"shared_cache"`
	// MaxBoots and MaxBootsPerClient cap live boots (each holds a write
	// cache) over all clients and for one client name.
	MaxBoots          int `yaml:"max_boots"`
	MaxBootsPerClient int `yaml:"max_boots_per_client"`
	// MaxCacheMB and MaxCacheMBPerClient cap the write-cache bytes (RAM
	// and spilled, or shared-cache files) of all boots and of the boots
	// of one client name; a write past either fails as on a full disk.
	MaxCacheMB          int `yaml:"max_cache_mb"`
	MaxCacheMBPerClient int `yaml:"max_cache_mb_per_client"`
	// MaxInflight bounds the requests served at once on one connection.
	MaxInflight int `yaml:"max_inflight"`
	// MaxBufferMB bounds the bytes of requests in progress (READ replies
	// and WRITE payloads in buffers) over all connections; a connection
	// also holds at most 64 MiB. Past either, a connection's requests
	// wait until replies have gone out.
	MaxBufferMB int `yaml:"max_buffer_mb"`
	// WriteTimeout ends a connection whose client takes no byte of a
	// reply for this long.
	WriteTimeout Duration `yaml:"write_timeout"`
	// MaxUnauthenticated caps connections still negotiating (TLS, the
	// client certificate, the export): anyone who reaches the port can
	// open one, so they have a cap in all and one per source address.
	MaxUnauthenticated        int `yaml:"max_unauthenticated"`
	MaxUnauthenticatedPerAddr int `yaml:"max_unauthenticated_per_address"`
	// Trace, when set, is a file to which every request of every client
	// boot is appended as CSV (client,boot,ms,op,offset,length): the raw
	// material of the boot-storm bench's trace.
	Trace  string  `yaml:"trace"`
	VDisks []VDisk `yaml:"vdisks"`
	// Netboot, when set, serves machines with no disk: DHCP, TFTP and
	// HTTP on the boot network, and devices recognised by MAC address.
	Netboot *Netboot `yaml:"netboot"`
}

// VDisk is one streamed disk image.
type VDisk struct {
	Name        string `yaml:"name"`
	Base        string `yaml:"base"`
	Mode        string `yaml:"mode"` // standard (shared base, per-boot write cache) or private
	Description string `yaml:"description"`
	// Clients may have a private image of a private-mode vDisk made on
	// their first connection; others need one made through the admin API
	// (or, with stream.clients: certificate, a certificate naming them).
	Clients []string `yaml:"clients"`
	// Kernel and Initrd are what a network-booted device of this vDisk
	// loads (paths on this server); Cmdline is added to the kernel's
	// command line, before deskway's own parameters.
	Kernel  string `yaml:"kernel"`
	Initrd  string `yaml:"initrd"`
	Cmdline string `yaml:"cmdline"`
}

func (c *Config) streamDefaults(st *Stream) {
	setDefault(&st.Listen, ":10809")
	setDefault(&st.TLS, "on")
	setDefault(&st.Clients, "certificate")
	setDefault(&st.Store, c.StateDir+"/vdisks")
	setDefault(&st.CacheRAMMB, 64)
	setDefault(&st.ReconnectWindow, Duration(2*time.Minute))
	setDefault(&st.MaxInflight, 16)
	setDefault(&st.MaxBufferMB, 1024)
	setDefault(&st.MaxBoots, 2000)
	setDefault(&st.MaxBootsPerClient, 4)
	setDefault(&st.MaxCacheMB, 256<<10)
	setDefault(&st.MaxCacheMBPerClient, 16<<10)
	setDefault(&st.WriteTimeout, Duration(60*time.Second))
	setDefault(&st.MaxUnauthenticated, 2048)
	setDefault(&st.MaxUnauthenticatedPerAddr, 64)
	for i := range st.VDisks {
		setDefault(&st.VDisks[i].Mode, "standard")
	}
	if st.Netboot != nil {
		netbootDefaults(st.Netboot)
	}
}

func validateStream(st *Stream, bad func(string, string, ...any)) {
	checkListen(bad, "stream.listen", st.Listen)
	switch st.TLS {
	case "off", "on", "require":
	default:
		bad("stream.tls", "%q is not one of off, on, require", st.TLS)
	}
	switch st.Clients {
	case "open":
	case "certificate":
		if st.TLS == "off" {
			bad("stream.clients", "certificate needs TLS: set stream.tls to on or require, or stream.clients to open on a trusted network")
		}
	default:
		bad("stream.clients", "%q is not certificate or open", st.Clients)
	}
	if st.CacheRAMMB < 0 {
		bad("stream.cache_ram_mb", "must not be negative")
	}
	if st.MaxUnauthenticated < 1 || st.MaxUnauthenticatedPerAddr < 1 || st.MaxUnauthenticatedPerAddr > st.MaxUnauthenticated {
		bad("stream.max_unauthenticated_per_address", "caps must be at least 1, the per-address one at most max_unauthenticated (%d)", st.MaxUnauthenticated)
	}
	if st.MaxBoots < 1 || st.MaxBootsPerClient < 1 {
		bad("stream.max_boots", "max_boots and max_boots_per_client must be at least 1")
	}
	if st.MaxCacheMB < 1 || st.MaxCacheMBPerClient < 1 {
		bad("stream.max_cache_mb", "max_cache_mb and max_cache_mb_per_client must be at least 1 (MiB)")
	}
	if st.MaxBufferMB < 64 {
		bad("stream.max_buffer_mb", "must be at least 64 (two requests of the 32 MiB maximum)")
	}
	if st.WriteTimeout.D() < time.Second {
		bad("stream.write_timeout", "must be at least 1s")
	}
	if st.MaxInflight < 1 || st.MaxInflight > 1024 {
		bad("stream.max_inflight", "must be between 1 and 1024")
	}
	if len(st.VDisks) == 0 {
		bad("stream.vdisks", "list at least one vDisk (name, base)")
	}
	seen := map[string]bool{}
	for i, v := range st.VDisks {
		key := fmt.Sprintf("stream.vdisks[%d]", i)
		uniqueName(bad, key+".name", v.Name, seen)
		if v.Base == "" {
			bad(key+".base", "give the path of the base image")
		} else if fi, err := os.Stat(v.Base); err != nil {
			bad(key+".base", "%v", err)
		} else if !fi.Mode().IsRegular() {
			bad(key+".base", "%s is not a regular file", v.Base)
		}
		switch v.Mode {
		case "standard":
		case "private":
		default:
			bad(key+".mode", "%q is not standard or private", v.Mode)
		}
	}
	if st.Netboot != nil {
		validateNetboot(st.Netboot, st, bad)
	}
}

// uniqueName checks the name of a list entry: not empty, no slash or
// space (names appear in URLs and export names), and not used before.
func uniqueName(bad func(string, string, ...any), key, name string, seen map[string]bool) {
	if name == "" || strings.ContainsAny(name, "/ ") {
		bad(key, "%q is empty or has a / or a space", name)
	}
	if seen[name] {
		bad(key, "%q appears twice", name)
	}
	seen[name] = true
}
