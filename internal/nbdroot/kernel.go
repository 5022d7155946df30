package nbdroot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"

	"github.com/deskway/deskway/internal/nbdclient"
)

// The kernel NBD driver's generic netlink interface
// (include/uapi/linux/nbd-netlink.h). Unlike its ioctls, it lets a dead
// connection be replaced while the device's requests wait.
const (
	nbdFamily     = "nbd"
	nbdEventGroup = "nbd_mc_group"

	nbdCmdConnect     = 1
	nbdCmdReconfigure = 3
	nbdCmdLinkDead    = 4

	nbdAttrIndex           = 1
	nbdAttrSizeBytes       = 2
	nbdAttrBlockSizeBytes  = 3
	nbdAttrTimeout         = 4
	nbdAttrServerFlags     = 5
	nbdAttrSockets         = 7
	nbdAttrDeadConnTimeout = 8

	nbdSockItem = 1
	nbdSockFD   = 1
)

// kernelNBD is two generic netlink connections to the kernel's NBD
// driver: one for commands and their answers, one that hears its events,
// which would otherwise arrive among the answers.
type kernelNBD struct {
	c, events *genetlink.Conn
	family    genetlink.Family
}

func openKernel() (*kernelNBD, error) {
	c, err := genetlink.Dial(nil)
	if err != nil {
		return nil, fmt.Errorf("nbdroot: generic netlink: %w", err)
	}
	f, err := c.GetFamily(nbdFamily)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("nbdroot: the kernel's NBD driver has no netlink interface (is the nbd module loaded?): %w", err)
	}
	k := &kernelNBD{c: c, family: f}
	if k.events, err = genetlink.Dial(nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("nbdroot: generic netlink: %w", err)
	}
	for _, g := range f.Groups {
		if g.Name == nbdEventGroup {
			if err := k.events.JoinGroup(g.ID); err != nil {
				k.close()
				return nil, fmt.Errorf("nbdroot: NBD events: %w", err)
			}
			return k, nil
		}
	}
	k.close()
	return nil, fmt.Errorf("nbdroot: the kernel's NBD driver has no %s events", nbdEventGroup)
}

func (k *kernelNBD) close() {
	k.c.Close()
	k.events.Close()
}

// waitDead returns when the kernel says device index lost its connection
// (NBD_CMD_LINK_DEAD, sent once it has marked the socket dead, so that a
// reconfigure then finds it), or when ctx ends.
func (k *kernelNBD) waitDead(ctx context.Context, index uint32) error {
	for ctx.Err() == nil {
		_ = k.events.SetReadDeadline(time.Now().Add(time.Second))
		msgs, _, err := k.events.Receive()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("nbdroot: NBD events: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Command != nbdCmdLinkDead {
				continue
			}
			ad, err := netlink.NewAttributeDecoder(m.Data)
			if err != nil {
				continue
			}
			for ad.Next() {
				if ad.Type() == nbdAttrIndex && ad.Uint32() == index {
					return nil
				}
			}
		}
	}
	return ctx.Err()
}

// connectAttrs are the attributes of NBD_CMD_CONNECT: device index, the
// export's size and flags, the timeouts, and the one socket.
func connectAttrs(index uint32, ex nbdclient.Export, fd int) ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(nbdAttrIndex, index)
	ae.Uint64(nbdAttrSizeBytes, ex.Size)
	ae.Uint64(nbdAttrBlockSizeBytes, blockSize)
	ae.Uint64(nbdAttrServerFlags, uint64(ex.Flags))
	ae.Uint64(nbdAttrTimeout, uint64(requestTimeout/time.Second))
	ae.Uint64(nbdAttrDeadConnTimeout, uint64(deadConnTimeout/time.Second))
	socketAttr(ae, fd)
	return ae.Encode()
}

// reconfigureAttrs are the attributes of NBD_CMD_RECONFIGURE: a new socket
// for the device's dead one.
func reconfigureAttrs(index uint32, fd int) ([]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.Uint32(nbdAttrIndex, index)
	socketAttr(ae, fd)
	return ae.Encode()
}

func socketAttr(ae *netlink.AttributeEncoder, fd int) {
	ae.Nested(nbdAttrSockets, func(socks *netlink.AttributeEncoder) error {
		socks.Nested(nbdSockItem, func(item *netlink.AttributeEncoder) error {
			item.Uint32(nbdSockFD, uint32(fd))
			return nil
		})
		return nil
	})
}

// connect sets the device up on conn. The kernel keeps its own reference
// to the socket, so the caller may close conn.
func (k *kernelNBD) connect(index uint32, conn *net.TCPConn, ex nbdclient.Export) error {
	return k.give(conn, "connect", func(fd int) error {
		b, err := connectAttrs(index, ex, fd)
		if err != nil {
			return err
		}
		// The kernel answers a connect with a message naming the
		// device; asking for an acknowledgement as well would leave it
		// unread, to be taken for the next command's answer.
		return k.do(nbdCmdConnect, b, 0)
	})
}

// reconfigure replaces the device's dead connection with conn. Call it
// after waitDead: the kernel answers success, and drops conn, when the
// device has no dead connection to replace.
func (k *kernelNBD) reconfigure(index uint32, conn *net.TCPConn) error {
	return k.give(conn, "reconfigure", func(fd int) error {
		b, err := reconfigureAttrs(index, fd)
		if err != nil {
			return err
		}
		return k.do(nbdCmdReconfigure, b, netlink.Acknowledge)
	})
}

// give passes a blocking duplicate of conn's socket to send.
func (k *kernelNBD) give(conn *net.TCPConn, what string, send func(fd int) error) error {
	f, err := conn.File() // blocking, as the kernel wants it
	if err != nil {
		return fmt.Errorf("nbdroot: %s: %w", what, err)
	}
	defer f.Close()
	if err := send(int(f.Fd())); err != nil {
		return fmt.Errorf("nbdroot: NBD %s: %w", what, err)
	}
	return nil
}

func (k *kernelNBD) do(cmd uint8, attrs []byte, flags netlink.HeaderFlags) error {
	_, err := k.c.Execute(genetlink.Message{Header: genetlink.Header{Command: cmd, Version: k.family.Version}, Data: attrs},
		k.family.ID, netlink.Request|flags)
	return err
}
