package gwbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/deskway/deskway/internal/bench/echo"
	"github.com/deskway/deskway/internal/bench/procstat"
	"github.com/deskway/deskway/internal/bench/report"
)

// throughput is the ctsTraffic-like test: bulk data from the host to the
// client over 1 and 8 streams through each system, o.Runs times, the
// systems' order turning every run.
func (r *runner) throughput(ctx context.Context) error {
	systems := []system{r.e.direct(), r.e.deskway()}
	if r.hap != nil {
		systems = append(systems, *r.hap)
	} else {
		r.res.Points = append(r.res.Points, report.Point{Scenario: "throughput", System: "haproxy", Metrics: map[string]float64{}, Skipped: r.hapErr.Error()})
	}
	var runs []map[string]float64
	for run := 1; run <= r.o.Runs; run++ {
		gbps := map[string]float64{}
		for _, streams := range []int{1, 8} {
			for i := range systems {
				sys := systems[(i+run-1)%len(systems)]
				g, cpu, err := r.bulk(ctx, sys, streams)
				if err != nil {
					return fmt.Errorf("%s %d streams, run %d: %w", sys.name, streams, run, err)
				}
				gbps[fmt.Sprintf("%s/%d", sys.name, streams)] = g
				m := map[string]float64{"gbps": report.Round(g, 3)}
				if cpu >= 0 {
					m["cpu_pct"] = report.Round(cpu, 1)
				}
				r.res.Points = append(r.res.Points, report.Point{Scenario: "throughput", System: sys.name,
					Params: map[string]any{"streams": streams, "seconds": r.o.ThroughputD.Seconds(), "run": run}, Metrics: m})
				r.o.Log.Info("throughput", "system", sys.name, "streams", streams, "run", run, "gbps", report.Round(g, 3))
			}
		}
		runs = append(runs, gbps)
	}
	summarizeThroughput(r.res.Summary, runs)
	return nil
}

func (r *runner) bulk(ctx context.Context, sys system, streams int) (float64, float64, error) {
	pr, dial, addr, err := sys.start(0)
	if err != nil {
		return 0, 0, err
	}
	defer pr.stop()
	if err := r.recordSuite(ctx, sys.name, addr); err != nil {
		return 0, 0, err
	}
	var conns []io.ReadWriteCloser
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < streams; i++ {
		c, err := dial(ctx)
		if err != nil {
			return 0, 0, err
		}
		conns = append(conns, c)
		if _, err := c.Write(echo.Hello{Mode: echo.ModeBulk}.Append(nil)); err != nil {
			return 0, 0, err
		}
	}
	var total atomic.Int64
	var counting atomic.Bool
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 256<<10)
			for {
				n, err := c.Read(buf)
				if counting.Load() {
					total.Add(int64(n))
				}
				if err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(time.Second) // reach steady state
	var a, b procstat.Sample
	if pr != nil {
		a, _ = procstat.Read(pr.pid())
	}
	start := time.Now()
	counting.Store(true)
	time.Sleep(r.o.ThroughputD)
	counting.Store(false)
	el := time.Since(start)
	cpu := -1.0
	if pr != nil {
		b, _ = procstat.Read(pr.pid())
		cpu = procstat.CPUPercent(a, b)
	}
	for _, c := range conns {
		c.Close()
	}
	wg.Wait()
	conns = nil
	if total.Load() == 0 {
		return 0, cpu, errors.New("no data flowed")
	}
	return float64(total.Load()) * 8 / el.Seconds() / 1e9, cpu, nil
}
