package obs

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBuildInfoMetric: the registry every role serves on /metrics has
// deskway_build_info = 1 labelled with the build it is given.
func TestBuildInfoMetric(t *testing.T) {
	reg := NewRegistry(Build{Version: "1.2.3+git0abc", Revision: "0abc", GoVersion: "go1.26.8"})
	want := `# HELP deskway_build_info Always 1; the labels say the version, source revision and Go release of the running binary.
# TYPE deskway_build_info gauge
deskway_build_info{goversion="go1.26.8",revision="0abc",version="1.2.3+git0abc"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "deskway_build_info"); err != nil {
		t.Fatal(err)
	}
}

// TestReadBuildKeepsTheStamp: a stamped version and revision are what a
// build reports; an unstamped one never reports an empty version.
func TestReadBuildKeepsTheStamp(t *testing.T) {
	if b := ReadBuild("1.2.3", "0abc"); b.Version != "1.2.3" || b.Revision != "0abc" || !strings.HasPrefix(b.GoVersion, "go") {
		t.Fatalf("stamped: %+v", b)
	}
	if b := ReadBuild("dev", ""); b.Version == "" || b.Revision == "" {
		t.Fatalf("unstamped: %+v", b)
	}
}
