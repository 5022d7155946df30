package obs

import (
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Build says which deskway a process is: the version stamped at build
// time, the source revision and the Go release that compiled it.
type Build struct {
	Version, Revision, GoVersion string
}

// ReadBuild completes what the build stamped with -ldflags -X (version
// "dev" and revision "" when it stamped nothing) with what the Go
// toolchain recorded in the binary: the VCS revision, and for an
// unstamped build a version made of the module's version or the
// revision, so that a build says which source it is whenever it can.
func ReadBuild(version, revision string) Build {
	b := Build{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if b.Revision == "" {
			modified := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					b.Revision = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if modified && b.Revision != "" {
				b.Revision += "-dirty"
			}
		}
		if b.Version == "" || b.Version == "dev" {
			if v := bi.Main.Version; v != "" && v != "(devel)" {
				b.Version = v
			} else if len(b.Revision) >= 12 {
				b.Version = "dev-" + b.Revision[:12]
			}
		}
	}
	if b.Version == "" {
		b.Version = "dev"
	}
	if b.Revision == "" {
		b.Revision = "unknown"
	}
	return b
}

// NewRegistry returns a registry with the Go and process collectors and
// deskway_build_info, a gauge of 1 whose labels say which build answers.
func NewRegistry(b Build) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "deskway_build_info",
		Help: "Always 1; the labels say the version, source revision and Go release of the running binary.",
	}, []string{"version", "revision", "goversion"})
	info.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	reg.MustRegister(info)
	return reg
}
