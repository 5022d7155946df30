// Package nbdroot connects a network-booted machine's root disk: it reads
// the export and the stream servers from the kernel command line that
// deskway's boot script gave, negotiates the export with the first
// server that answers, and hands the connection to the kernel's NBD
// driver (/dev/nbdN) through its netlink interface; the kernel serves the
// block device from then on. When the connection dies (the server is
// gone, or a request went unanswered for requestTimeout) the kernel
// holds the disk's requests, in flight or new, and this package
// negotiates the export again, starting with the server after the lost
// one, and gives the kernel the new connection (NBD_CMD_RECONFIGURE);
// the held requests then go to it, so the machine sees a pause, not an
// I/O error. A boot's write cache outlives a dropped connection on the
// server for its reconnect window, and moves to another server that
// shares the store (stream.shared_cache).
package nbdroot

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/nbdclient"
)

// blockSize is the device's logical block size: 512, as nbd-client's,
// so that any file system mounts (ext4 of 1 KiB blocks refuses a 4 KiB
// device); the kernel still sends requests of many blocks.
const blockSize = 512

// Params are what the kernel command line says of the root disk.
type Params struct {
	Device  string   // deskway.device
	Export  string   // deskway.export: VDISK[@STAGE]/DEVICE/BOOT
	Servers []string // deskway.servers, host:port, first first
}

// ParseCmdline reads the deskway.* parameters of a kernel command line.
func ParseCmdline(cmdline string) (Params, error) {
	var p Params
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "deskway.device":
			p.Device = v
		case "deskway.export":
			p.Export = v
		case "deskway.servers":
			for _, s := range strings.Split(v, ",") {
				if s != "" {
					p.Servers = append(p.Servers, s)
				}
			}
		}
	}
	if p.Export == "" || len(p.Servers) == 0 {
		return p, errors.New("nbdroot: the kernel command line has no deskway.export and deskway.servers: boot through deskway's iPXE script")
	}
	for _, s := range p.Servers {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return p, fmt.Errorf("nbdroot: deskway.servers: %q is not host:port", s)
		}
	}
	return p, nil
}

// refusedFor is how long a server's refusal of the export is tried
// again: a private image still open by the machine's own connection from
// before a reset is free once the server notices that connection is dead.
const refusedFor = 2 * time.Minute

// Connect negotiates p's export with the first of p's servers, from
// p.Servers[first] on, that answers, trying them in turn until ctx ends,
// or until they have refused the export for refusedFor; it returns the
// index of the server it used.
func Connect(ctx context.Context, p Params, first int, logf func(string, ...any)) (*net.TCPConn, nbdclient.Export, int, error) {
	var firstRefusal time.Time
	var said string
	for round := 0; ; round++ {
		for i := range p.Servers {
			at := (first + i) % len(p.Servers)
			s := p.Servers[at]
			d := net.Dialer{Timeout: 5 * time.Second}
			c, err := d.DialContext(ctx, "tcp", s)
			if err == nil {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				var ex nbdclient.Export
				if _, ex, err = nbdclient.Handshake(c, p.Export, nbdclient.Options{}); err == nil {
					_ = c.SetDeadline(time.Time{})
					logf("deskway: root disk %s from %s (%d MiB)", p.Export, s, ex.Size>>20)
					return c.(*net.TCPConn), ex, at, nil
				}
				c.Close()
				var oe *nbdclient.OptionError
				if errors.As(err, &oe) {
					// A refusal says why (a lost boot, an image open
					// elsewhere); another server would say the same.
					if firstRefusal.IsZero() {
						firstRefusal = time.Now()
					}
					if time.Since(firstRefusal) > refusedFor {
						return nil, ex, at, fmt.Errorf("nbdroot: %s refused %s: %w", s, p.Export, err)
					}
					if err.Error() != said {
						said = err.Error()
						logf("deskway: %s refused %s: %v; trying again", s, p.Export, err)
					}
					break
				}
			}
			logf("deskway: stream server %s: %v", s, err)
		}
		select {
		case <-ctx.Done():
			return nil, nbdclient.Export{}, 0, ctx.Err()
		case <-time.After(time.Second << min(round, 2)):
		}
	}
}

// Timeouts the kernel applies to the root disk.
const (
	// requestTimeout is how long a request may go unanswered before the
	// kernel gives up on the connection and holds its requests for a new
	// one; a slow server is then reconnected, not failed.
	requestTimeout = 15 * time.Second
	// deadConnTimeout is how long the kernel holds requests for a new
	// connection before failing them: longer than servers are tried
	// while they refuse the export (refusedFor).
	deadConnTimeout = 5 * time.Minute
)

// Run connects the root disk of cmdline to the NBD device devPath
// (/dev/nbdN) and keeps it connected: it returns only when ctx ends, a
// server refuses the export, or the kernel will not take a connection.
func Run(ctx context.Context, cmdline, devPath string, l *log.Logger) error {
	p, err := ParseCmdline(cmdline)
	if err != nil {
		return err
	}
	index, err := deviceIndex(devPath)
	if err != nil {
		return err
	}
	k, err := openKernel() // hears the device's events from before it is set up
	if err != nil {
		return err
	}
	defer k.close()
	conn, ex, at, err := Connect(ctx, p, 0, l.Printf)
	if err != nil {
		return err
	}
	err = k.connect(index, conn, ex)
	conn.Close()
	if err != nil {
		return err
	}
	for {
		if err := k.waitDead(ctx, index); err != nil {
			return err
		}
		l.Printf("deskway: root disk connection to %s lost; connecting again (the disk's requests wait)", p.Servers[at])
		// The next server first: the one that was lost may be up but
		// not answering, and would be lost again.
		if at, err = reconnect(ctx, k, index, p, (at+1)%len(p.Servers), ex, l); err != nil {
			return err
		}
	}
}

// reconnect negotiates the export again, trying the servers from first
// on, and hands the connection to the kernel in place of the dead one;
// it returns the server it used.
func reconnect(ctx context.Context, k *kernelNBD, index uint32, p Params, first int, want nbdclient.Export, l *log.Logger) (int, error) {
	for {
		conn, ex, at, err := Connect(ctx, p, first, l.Printf)
		if err != nil {
			return 0, err
		}
		if ex.Size != want.Size || ex.Flags != want.Flags {
			conn.Close()
			return 0, fmt.Errorf("nbdroot: %s on %s is not the disk the machine booted from (%d bytes, flags %#x; booted with %d, %#x)",
				p.Export, p.Servers[at], ex.Size, ex.Flags, want.Size, want.Flags)
		}
		err = k.reconfigure(index, conn)
		conn.Close()
		if err == nil {
			return at, nil
		}
		l.Printf("deskway: the kernel did not take the new connection: %v", err)
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// deviceIndex is N of /dev/nbdN.
func deviceIndex(dev string) (uint32, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(dev), "nbd"), 10, 32)
	if err != nil || !strings.HasPrefix(filepath.Base(dev), "nbd") {
		return 0, fmt.Errorf("nbdroot: %s is not an NBD device (/dev/nbdN)", dev)
	}
	return uint32(n), nil
}
