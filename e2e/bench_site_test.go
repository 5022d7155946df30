package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/bench/sitebench"
	"github.com/deskway/deskway/internal/testkit"
)

// TestSiteBenchSmoke runs `deskway bench site` at the smallest scale (one
// run, one second a point) and checks the result's shape: every system
// measured with 1 and 8 connections, or skipped with a reason; the
// paper's points; the failover scenario measured (the active gateway of
// a pair killed with SIGKILL under 8 TCP connections) with its figures
// in the summary and no connection lost; the summary keys
// docs/benchmarks' site row names. Shape only, never speed: the failover
// time is logged, not judged. It also checks the bench's namespaces are
// gone after it.
func TestSiteBenchSmoke(t *testing.T) {
	// Its systems run in namespaces of its own, and it judges no speed.
	parallel(t)
	testkit.RequireRoot(t)
	testkit.Require(t, "ip", "nsenter")
	testkit.RequirePostgres(t) // the bench starts its own for the failover's lease
	before := benchNamespaces()
	out := t.TempDir()
	res := runBench(t, out, "site", "--runs", "1", "--duration", "1s", "--warmup", "300ms", "--cache", filepath.Join(os.TempDir(), "deskway-sitebench-cache"))
	if res.Bench != "site" || res.Command == "" || res.Machine.CPUs == 0 {
		t.Fatalf("header: %+v", res)
	}
	measured := map[string]map[float64]bool{}
	skipped := map[string]string{}
	paper, failovers := 0, 0
	for _, p := range res.Points {
		switch {
		case p.Scenario == "failover":
			if p.Skipped != "" || p.Metrics["failover_s"] <= 0 || p.Metrics["least_bytes_after"] <= 0 {
				t.Errorf("failover point not measured: %+v", p)
			}
			t.Logf("failover: %v", p.Metrics)
			failovers++
		case p.System == "paper":
			paper++
		case p.Skipped != "":
			skipped[p.System] = p.Skipped
		default:
			if p.Metrics["gbps"] <= 0 || p.Metrics["machine_cores"] <= 0 {
				t.Errorf("%s with %v connections: %v", p.System, p.Params["connections"], p.Metrics)
			}
			if measured[p.System] == nil {
				measured[p.System] = map[float64]bool{}
			}
			measured[p.System][p.Params["connections"].(float64)] = true
		}
	}
	for _, sys := range sitebench.Systems {
		if why, ok := skipped[sys]; ok {
			t.Logf("%s skipped: %s", sys, why)
			continue
		}
		if !measured[sys][1] || !measured[sys][8] {
			t.Errorf("%s has no point for 1 and 8 connections, and no skipped reason: %v", sys, measured[sys])
		}
	}
	// On this machine every system runs: only wireguard-go may be
	// skipped, where the module proxy cannot be reached.
	for sys := range skipped {
		if sys != "wireguard-go" {
			t.Errorf("%s skipped: %s", sys, skipped[sys])
		}
	}
	if paper != 2 || failovers != 1 {
		t.Errorf("%d paper points, %d failover points (want 2 and 1)", paper, failovers)
	}
	keys := []string{"gre_multi_ratio_vxlan", "gre_single_ratio_direct", "gre_multi_ratio_direct", "gre_gbps_per_core"}
	if _, ok := skipped["wireguard-go"]; !ok {
		keys = append(keys, "gre_single_ratio_wggo", "gre_multi_ratio_wggo", "wg_single_ratio_wggo", "wg_multi_ratio_wggo")
	}
	for _, k := range keys {
		for _, kk := range []string{k, k + "_worst"} {
			if _, ok := res.Summary[kk]; !ok {
				t.Errorf("summary lacks %s", kk)
			}
		}
	}
	for _, k := range []string{"failover_s", "failover_s_worst", "failover_conns_reset"} {
		if _, ok := res.Summary[k]; !ok {
			t.Errorf("summary lacks %s", k)
		}
	}
	if n := res.Summary["failover_conns_reset"]; n != 0 {
		t.Errorf("%v of the 8 connections did not survive the failover", n)
	}
	if why, ok := res.SummaryText["failover"]; ok {
		t.Errorf("summary's failover = %q", why)
	}
	for _, f := range []string{"result.md", "throughput.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty", f)
		}
	}
	for n := range benchNamespaces() {
		if !before[n] {
			t.Errorf("namespace %s left behind", n)
		}
	}
}

// benchNamespaces are the namespaces named as the site bench names its own.
func benchNamespaces() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		for _, p := range []string{"dwbl-", "dwbo-", "dwbg-", "dwbc-", "dwbd-", "dwbu-", "dwbh-", "dwbk-"} {
			if strings.HasPrefix(e.Name(), p) {
				out[e.Name()] = true
			}
		}
	}
	return out
}
