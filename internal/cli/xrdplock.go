package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// holdXRDP waits for the machine-wide lock on xrdp-sesman's port (the
// file lock the project's tests take, testkit.LockSesman) and returns its
// release: a bench that starts xrdp holds it only while its own xrdp
// runs, so the tests and benches that share the machine take turns.
func holdXRDP(log *slog.Logger) func(ctx context.Context) (func(), error) {
	return func(ctx context.Context) (func(), error) {
		path := filepath.Join(os.TempDir(), "deskway-test-xrdp-sesman.lock")
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
		if err != nil {
			return nil, fmt.Errorf("bench: the xrdp-sesman lock: %w", err)
		}
		for waited := false; ; waited = true {
			if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
				// Closing the file releases the lock.
				return func() { f.Close() }, nil
			}
			if !waited {
				log.Info("waiting for xrdp-sesman's port: another test or bench holds it", "lock", path)
			}
			select {
			case <-ctx.Done():
				f.Close()
				return nil, fmt.Errorf("bench: waiting for the xrdp-sesman lock: %w", ctx.Err())
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
}
