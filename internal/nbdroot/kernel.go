package nbdroot

import (
	"fmt"
	"net"
	"time"

	"github.com/mdlayher/genetlink"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/nbdclient"
)

// The kernel NBD driver's generic netlink interface
// (include/uapi/linux/nbd-netlink.h). Unlike its ioctls, it lets a dead
// connection be replaced while the device's requests wait.
const (
	nbdFamily = "nbd"

	nbdCmdConnect     = 1
	nbdCmdReconfigure = 3

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

// kernelNBD is a generic netlink connection to the kernel's NBD driver.
type kernelNBD struct {
	c      *genetlink.Conn
	family genetlink.Family
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
	return &kernelNBD{c: c, family: f}, nil
}

func (k *kernelNBD) close() { k.c.Close() }

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
// to the socket, so the caller may close conn; the returned descriptor
// is a duplicate to watch it by.
func (k *kernelNBD) connect(index uint32, conn *net.TCPConn, ex nbdclient.Export) (int, error) {
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

// reconfigure replaces the device's dead connection with conn; the error
// wraps ENOSPC while the kernel has not marked the old one dead. On
// success the returned descriptor is a duplicate of the socket to watch
// it by.
func (k *kernelNBD) reconfigure(index uint32, conn *net.TCPConn) (int, error) {
	return k.give(conn, "reconfigure", func(fd int) error {
		b, err := reconfigureAttrs(index, fd)
		if err != nil {
			return err
		}
		return k.do(nbdCmdReconfigure, b, netlink.Acknowledge)
	})
}

// give passes a blocking duplicate of conn's socket to send, and returns
// it for watching when send succeeds.
func (k *kernelNBD) give(conn *net.TCPConn, what string, send func(fd int) error) (int, error) {
	f, err := conn.File() // blocking, as the kernel wants it
	if err != nil {
		return -1, fmt.Errorf("nbdroot: %s: %w", what, err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := send(fd); err != nil {
		return -1, fmt.Errorf("nbdroot: NBD %s: %w", what, err)
	}
	watch, err := unix.Dup(fd)
	if err != nil {
		return -1, fmt.Errorf("nbdroot: %s: %w", what, err)
	}
	return watch, nil
}

func (k *kernelNBD) do(cmd uint8, attrs []byte, flags netlink.HeaderFlags) error {
	_, err := k.c.Execute(genetlink.Message{Header: genetlink.Header{Command: cmd, Version: k.family.Version}, Data: attrs},
		k.family.ID, netlink.Request|flags)
	return err
}
