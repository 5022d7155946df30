// Package nbdroot connects a network-booted machine's root disk: it reads
// the export and the stream servers from the kernel command line that
// deskway's boot script gave, negotiates the export with the first
// server that answers, and hands the connection to the kernel's NBD
// driver (/dev/nbdN), which serves the block device from then on. When
// the connection drops it negotiates again, with the next server if the
// first is gone, and hands the new connection over, as nbd-client
// -persist does; a boot's write cache outlives a dropped connection on
// the server for its reconnect window. Through the ioctl interface the
// kernel fails the requests in flight when a connection drops; keeping
// them across a reconnect needs its netlink interface.
package nbdroot

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/nbdclient"
)

// The kernel NBD driver's ioctls (include/uapi/linux/nbd.h).
const (
	nbdSetSock       = 0xab00
	nbdSetBlksize    = 0xab01
	nbdDoIt          = 0xab03
	nbdClearSock     = 0xab04
	nbdClearQue      = 0xab05
	nbdSetSizeBlocks = 0xab07
	nbdSetFlags      = 0xab0a
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

// Connect negotiates p's export with the first of p's servers that
// answers, trying them in turn until ctx ends, or until they have
// refused the export for refusedFor.
func Connect(ctx context.Context, p Params, logf func(string, ...any)) (*net.TCPConn, nbdclient.Export, error) {
	var firstRefusal time.Time
	var said string
	for round := 0; ; round++ {
		for _, s := range p.Servers {
			d := net.Dialer{Timeout: 5 * time.Second}
			c, err := d.DialContext(ctx, "tcp", s)
			if err == nil {
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				var ex nbdclient.Export
				if _, ex, err = nbdclient.Handshake(c, p.Export, nbdclient.Options{}); err == nil {
					_ = c.SetDeadline(time.Time{})
					logf("deskway: root disk %s from %s (%d MiB)", p.Export, s, ex.Size>>20)
					return c.(*net.TCPConn), ex, nil
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
						return nil, ex, fmt.Errorf("nbdroot: %s refused %s: %w", s, p.Export, err)
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
			return nil, nbdclient.Export{}, ctx.Err()
		case <-time.After(time.Second << min(round, 2)):
		}
	}
}

// Serve hands conn to the kernel on the NBD device dev and blocks while
// the kernel serves the device through it; it returns when the
// connection drops.
func Serve(dev *os.File, conn *net.TCPConn, ex nbdclient.Export) error {
	f, err := conn.File() // a blocking duplicate the kernel can own
	conn.Close()
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(dev.Fd())
	for _, c := range []struct {
		req uint
		val uintptr
	}{
		{nbdSetBlksize, blockSize},
		{nbdSetSizeBlocks, uintptr(ex.Size / blockSize)},
		{nbdSetFlags, uintptr(ex.Flags)},
		{nbdSetSock, f.Fd()},
	} {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(c.req), c.val); e != 0 {
			return fmt.Errorf("nbdroot: ioctl %#x on %s: %w", c.req, dev.Name(), e)
		}
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nbdDoIt, 0)
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nbdClearQue, 0)
	_, _, _ = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nbdClearSock, 0)
	if e != 0 {
		return fmt.Errorf("nbdroot: the connection of %s ended: %w", dev.Name(), e)
	}
	return nil
}

// Run connects the root disk of cmdline to dev and keeps it connected:
// it returns only when ctx ends or a server refuses the export.
func Run(ctx context.Context, cmdline, devPath string, l *log.Logger) error {
	p, err := ParseCmdline(cmdline)
	if err != nil {
		return err
	}
	dev, err := os.OpenFile(devPath, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("nbdroot: %w (is the nbd module loaded?)", err)
	}
	defer dev.Close()
	for {
		conn, ex, err := Connect(ctx, p, l.Printf)
		if err != nil {
			return err
		}
		err = Serve(dev, conn, ex)
		l.Printf("deskway: root disk connection lost (%v); connecting again", err)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
