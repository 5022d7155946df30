package gwbench

import (
	"sync"
	"testing"
	"time"
)

// TestProcStopsFromSeveralWaiters stops one child from several goroutines
// at once while another waits for it to exit, as the farm scenario does.
// A second exec.Cmd.Wait used to hang there for ever.
func TestProcStopsFromSeveralWaiters(t *testing.T) {
	for range 20 {
		p, err := startProc("sleep", 0, nil, "sleep", "30")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop() }()
		}
		wg.Add(1)
		go func() { defer wg.Done(); <-p.exited }()
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("stopping a child from several goroutines hung")
		}
		p.kill() // and after the end, kill returns at once
	}
}
