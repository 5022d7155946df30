package netboot

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// A stream server sharing its store with others (stream.shared_cache)
// writes how many clients it serves to a report in the store's servers
// directory every loadInterval; a report older than loadStale is a dead
// server's (killed, or its host gone) and the boot scripts list that
// server last.
const (
	loadInterval = 2 * time.Second
	loadStale    = 3 * loadInterval
	// handedOutFor is how long a boot this service sent to a server
	// counts towards that server's load: a machine's kernel connects
	// seconds after its script, and a dozen machines powered on at once
	// would otherwise all go to the server that was least loaded before
	// any of them connected.
	handedOutFor = 30 * time.Second
)

// loadReport is one stream server's report in the shared store.
type loadReport struct {
	// Addresses are host:port pairs the server's stream listener is
	// reached at: its listen address, or with an unspecified host every
	// address of its interfaces and its host name.
	Addresses []string  `json:"addresses"`
	Clients   int       `json:"clients"`
	At        time.Time `json:"at"`
}

// loadDir is where the stream servers sharing store report their load.
func loadDir(store string) string { return filepath.Join(store, "servers") }

// ReportLoad writes the load of the stream server listening at addr (the
// boots that have a client connected now, as clients counts them) to
// store's servers directory every two seconds, for the boot services of
// every server sharing the store to order their server lists by; the
// report is removed when ctx ends, and only then does it return (the
// process stops when any of its servers returns).
func ReportLoad(ctx context.Context, log *slog.Logger, store string, addr net.Addr, clients func() int) error {
	addrs, err := listenAddresses(addr)
	if err != nil {
		return err
	}
	dir := loadDir(store)
	sum := sha256.Sum256([]byte(strings.Join(addrs, ",")))
	path := filepath.Join(dir, hex.EncodeToString(sum[:8])+".json")
	defer os.Remove(path)
	t := time.NewTicker(loadInterval)
	defer t.Stop()
	failing := false
	for {
		b, _ := json.Marshal(loadReport{Addresses: addrs, Clients: clients(), At: time.Now().UTC()})
		err := os.MkdirAll(dir, 0o700)
		if err == nil {
			err = writeFileAtomic(path, b)
		}
		if err != nil && !failing {
			log.Warn("stream server load not reported: boots are sent to the other servers first", "path", path, "error", err)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// listenAddresses are the host:port pairs a listener at addr is reached
// at, as a server list would name them.
func listenAddresses(addr net.Addr) ([]string, error) {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return nil, fmt.Errorf("netboot: load reports: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		return []string{net.JoinHostPort(host, port)}, nil
	}
	var out []string
	if as, err := net.InterfaceAddrs(); err == nil {
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				out = append(out, net.JoinHostPort(n.IP.String(), port))
			}
		}
	}
	if h, err := os.Hostname(); err == nil {
		out = append(out, net.JoinHostPort(h, port))
	}
	return out, nil
}

// balancer orders a site's stream servers for each boot, least loaded
// first, from the reports in the shared store and the boots it handed
// out itself lately.
type balancer struct {
	dir string // "" orders nothing: one server, or no shared store
	mu  sync.Mutex
	// handedOut is, by server, when this service sent boots to it.
	handedOut map[string][]time.Time
}

// order returns servers with the live ones first, least loaded first
// (ties in their configured order), and those with no fresh report
// after them in their configured order, so a device fails over to them
// last; it counts a boot handed to the first at now.
func (b *balancer) order(servers []string, now time.Time) []string {
	if b.dir == "" || len(servers) < 2 {
		return servers
	}
	reports := readReports(b.dir)
	type ranked struct {
		addr    string
		live    bool
		clients int
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	rs := make([]ranked, len(servers))
	for i, s := range servers {
		rs[i].addr = s
		for _, r := range reports {
			if slices.Contains(r.Addresses, s) && now.Sub(r.At) < loadStale && r.At.Sub(now) < loadStale {
				rs[i].live, rs[i].clients = true, r.Clients
			}
		}
		recent := slices.DeleteFunc(b.handedOut[s], func(t time.Time) bool { return now.Sub(t) >= handedOutFor })
		b.handedOut[s] = recent
		rs[i].clients += len(recent)
	}
	slices.SortStableFunc(rs, func(x, y ranked) int {
		if x.live != y.live {
			if x.live {
				return -1
			}
			return 1
		}
		if !x.live {
			return 0
		}
		return cmp.Compare(x.clients, y.clients)
	})
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.addr
	}
	if rs[0].live {
		b.handedOut[out[0]] = append(b.handedOut[out[0]], now)
	}
	return out
}

// readReports reads the load reports in dir; an unreadable one is
// skipped, its server treated as dead.
func readReports(dir string) []loadReport {
	es, _ := os.ReadDir(dir)
	var out []loadReport
	for _, e := range es {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		var r loadReport
		if err == nil && json.Unmarshal(b, &r) == nil {
			out = append(out, r)
		}
	}
	return out
}
