package stream

import (
	"io"
	"net"
	"syscall"
)

// sendFileReply writes hdr and then n bytes of the file descriptor in at
// off to conn, the data moving from the page cache to the socket in the
// kernel (sendfile). MSG_MORE keeps the header in the same segment as the
// data's start. The caller holds the connection's write lock.
func sendFileReply(conn *net.TCPConn, hdr []byte, in int, off int64, n int) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		for len(hdr) > 0 {
			w, e := syscall.SendmsgN(int(fd), hdr, nil, nil, syscall.MSG_MORE)
			switch e {
			case nil:
				hdr = hdr[w:]
				continue
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			serr = e
			return true
		}
		for n > 0 {
			w, e := syscall.Sendfile(int(fd), in, &off, n)
			if w > 0 {
				n -= w
			}
			switch {
			case e == syscall.EINTR || (e == nil && w > 0):
				continue
			case e == syscall.EAGAIN:
				return false
			case e != nil:
				serr = e
			default:
				serr = io.ErrUnexpectedEOF // the file ended early
			}
			return true
		}
		return true
	})
	if err != nil {
		return err
	}
	return serr
}
