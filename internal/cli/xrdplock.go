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

// holdXRDP waits for the machine-wide locks of the xrdp setups the
// project's tests run (the file locks of testkit.LockSesman and
// testkit.LockSesmanSecond: the machine's own on port 3350, and a second
// beside it, whose sessions a bench's agent, reading every xrdp session
// on the machine, would count as its host's) and returns their release:
// a bench that starts xrdp holds them only while its own xrdp runs, so
// the tests and benches that share the machine take turns.
func holdXRDP(log *slog.Logger) func(ctx context.Context) (func(), error) {
	return func(ctx context.Context) (func(), error) {
		var held []*os.File
		release := func() {
			// Closing a file releases its lock.
			for _, f := range held {
				f.Close()
			}
		}
		for _, name := range []string{"deskway-test-xrdp-sesman.lock", "deskway-test-xrdp-sesman-3351.lock"} {
			f, err := waitLock(ctx, log, filepath.Join(os.TempDir(), name))
			if err != nil {
				release()
				return nil, err
			}
			held = append(held, f)
		}
		return release, nil
	}
}

// waitLock waits for the file lock at path and returns the file that
// holds it.
func waitLock(ctx context.Context, log *slog.Logger, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("bench: the xrdp-sesman lock: %w", err)
	}
	for waited := false; ; waited = true {
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			return f, nil
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
