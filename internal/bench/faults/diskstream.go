package faults

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
	"github.com/deskway/deskway/internal/proto/nbd"
)

// diskStreamBlock is the size of each write the client makes.
const diskStreamBlock = 64 << 10

// diskStream is the stream cache store full: one client writes blocks
// that each name themselves through a stream server whose write caches
// are on a tmpfs, which a file from outside fills, then frees. A write
// that cannot be stored, for faultFor, must be answered ENOSPC, never acknowledged;
// reads go on; writes succeed again once space returns; and every
// acknowledged write reads back.
func diskStream(ctx context.Context, env Env, dir string, faultFor time.Duration) (Outcome, error) {
	store := filepath.Join(dir, "store")
	if err := os.MkdirAll(store, 0o700); err != nil {
		return Outcome{}, fmt.Errorf("disk scenario: %w", err)
	}
	if out, err := exec.CommandContext(ctx, "mount", "-t", "tmpfs", "-o", "size="+diskMountSize+",mode=0700", "tmpfs", store).CombinedOutput(); err != nil {
		return Outcome{}, fmt.Errorf("disk scenario: mount a tmpfs on %s (needs root): %w: %s", store, err, out)
	}
	defer func() {
		if err := exec.Command("umount", store).Run(); err != nil {
			_ = exec.Command("umount", "-l", store).Run()
		}
	}()
	// The golden image is larger than the store, and sparse.
	base := filepath.Join(dir, "golden.img")
	if err := os.WriteFile(base, nil, 0o600); err != nil {
		return Outcome{}, fmt.Errorf("disk scenario: %w", err)
	}
	if err := os.Truncate(base, 64<<20); err != nil {
		return Outcome{}, fmt.Errorf("disk scenario: %w", err)
	}
	sdir := filepath.Join(dir, "server")
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		return Outcome{}, fmt.Errorf("disk scenario: %w", err)
	}
	srv, err := newStreamServer(env.Bin, sdir, store, base, true)
	if err != nil {
		return Outcome{}, err
	}
	defer srv.stop()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	c, err := nbdclient.Dial(dctx, srv.addr, "golden/client1/boot1", nbdclient.Options{})
	cancel()
	if err != nil {
		return Outcome{}, fmt.Errorf("disk scenario: open the stream export: %w", err)
	}
	defer c.Close()
	blocks := int(c.Export.Size / diskStreamBlock)
	acked := map[int]int{} // block: the write's sequence number
	var refused, otherErrs, readErrs, seq int
	var firstOther error
	buf := make([]byte, diskStreamBlock)
	write := func(b int) error {
		seq++
		fillBlock(buf, b, seq)
		err := c.WriteAt(buf, int64(b)*diskStreamBlock, false)
		var se *nbdclient.ServerError
		switch {
		case err == nil:
			acked[b] = seq
		case errors.As(err, &se) && se.Errno == nbd.ENOSPC:
			refused++
		default:
			otherErrs++
			if firstOther == nil {
				firstOther = err
			}
		}
		return err
	}
	// A few MiB written on a roomy store, then the store fills.
	next := 0
	for ; next < 32; next++ {
		if err := write(next); err != nil {
			return Outcome{}, fmt.Errorf("disk scenario: write before the fault: %w", err)
		}
	}
	filler := filepath.Join(store, "filler")
	if _, err := fill(filler); err != nil {
		return Outcome{}, err
	}
	fillAt := time.Now()
	// Writes go on past the room left; reads of what was acknowledged go
	// on beside them.
	rbuf := make([]byte, diskStreamBlock)
	for time.Since(fillAt) < faultFor && next < blocks {
		// A refused block is written again, as a client's disk would.
		if write(next) == nil {
			next++
		}
		if _, err := c.ReadAt(rbuf, 0); err != nil {
			readErrs++
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return Outcome{}, err
		}
	}
	duringRefused := refused
	if err := os.Remove(filler); err != nil {
		return Outcome{}, fmt.Errorf("disk scenario: %w", err)
	}
	back := time.Now()
	recoverS := -1.0
	for deadline := back.Add(30 * time.Second); time.Now().Before(deadline) && next < blocks; next++ {
		if write(next) == nil {
			recoverS = seconds(time.Since(back))
			break
		}
		_ = sleepCtx(ctx, 20*time.Millisecond)
	}
	if err := c.Flush(); err != nil {
		otherErrs++
		firstOther = fmt.Errorf("flush after the fault: %w", err)
	}
	lost := 0
	var firstLost string
	want := make([]byte, diskStreamBlock)
	for b, s := range acked {
		fillBlock(want, b, s)
		if _, err := c.ReadAt(rbuf, int64(b)*diskStreamBlock); err != nil || !bytes.Equal(rbuf, want) {
			lost++
			if firstLost == "" {
				firstLost = fmt.Sprintf("block %d (write %d): %v", b, s, err)
			}
		}
	}
	o := Outcome{Scenario: "disk", Case: "the stream server's cache store fills while a client writes, then space returns",
		Load:  fmt.Sprintf("one client writing %d KiB blocks in turn, and reading, through a stream server whose write caches are on the full store", diskStreamBlock>>10),
		Users: 1, RecoverS: recoverS,
		Metrics: map[string]float64{
			"writes_acked": float64(len(acked)), "writes_refused_enospc": float64(refused), "writes_refused_during": float64(duringRefused),
			"writes_lost": float64(lost), "other_errors": float64(otherErrs), "read_errors": float64(readErrs), "fault_s": seconds(back.Sub(fillAt)),
		},
	}
	if refused > 0 {
		o.Affected = 1
	}
	o.Held = lost == 0 && otherErrs == 0 && readErrs == 0 && duringRefused > 0 && recoverS >= 0 && recoverS < 5
	o.Notes = fmt.Sprintf("%d writes acknowledged and %d of them read back; %d refused with ENOSPC while the store was full; %d reads failed; writes stored again %.2f s after space returned",
		len(acked), len(acked)-lost, duringRefused, readErrs, recoverS)
	if firstOther != nil {
		o.Notes += "; first other error: " + firstOther.Error()
	}
	if firstLost != "" {
		o.Notes += "; first lost: " + firstLost
	}
	if !o.Held {
		env.Log.Warn("stream server log (its end)", "log", tail(srv.log(), 4000))
	}
	return o, nil
}

// fillBlock fills p with a pattern naming block b and write seq.
func fillBlock(p []byte, b, seq int) {
	for i := 0; i+16 <= len(p); i += 16 {
		binary.LittleEndian.PutUint32(p[i:], uint32(b))
		binary.LittleEndian.PutUint32(p[i+4:], uint32(seq))
		binary.LittleEndian.PutUint64(p[i+8:], uint64(i))
	}
}
