package cli

import (
	"runtime/debug"
	"runtime/metrics"
	"testing"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/gateway"
)

func gogc() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestGatewayOnlySetsGCPercent: the gateway role run alone collects at
// gateway.GCPercent (most of a tunnel's resident memory was the default
// collector's headroom), and GOGC in the environment still decides.
func TestGatewayOnlySetsGCPercent(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	if err := gatewayOnly(&config.Config{Gateway: &config.Gateway{}}); err != nil {
		t.Fatal(err)
	}
	if got := gogc(); got != gateway.GCPercent {
		t.Fatalf("GOGC %d after the gateway role's setup, want %d", got, gateway.GCPercent)
	}
	debug.SetGCPercent(100)
	t.Setenv("GOGC", "100")
	if err := gatewayOnly(&config.Config{Gateway: &config.Gateway{}}); err != nil {
		t.Fatal(err)
	}
	if got := gogc(); got != 100 {
		t.Fatalf("GOGC %d with GOGC=100 in the environment, want 100", got)
	}
}
