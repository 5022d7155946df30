// Package nbdfloor is the least an NBD server over TCP can do, run beside
// the real servers in the boot storm to show what the machine itself
// allows. It keeps nothing: every export is the same base file, reads are
// sent from its page cache with sendfile, and written data is dropped in
// the kernel (recv with MSG_TRUNC) without being stored, so the bench's
// clients see an NBD server whose only costs are the TCP stack's. A
// storm that is slow against it is slow for any server on this machine.
//
// It is a measuring instrument, not a server to boot from: writes are
// acknowledged and forgotten.
package nbdfloor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/deskway/deskway/internal/evloop"
	"github.com/deskway/deskway/internal/proto/nbd"
	"golang.org/x/sys/unix"
)

// Server answers NBD clients from one base file.
type Server struct {
	Base *os.File
	Log  *slog.Logger
}

// flags are what every export offers: the requests the boot trace makes.
const flags = nbd.FlagHasFlags | nbd.FlagSendFlush | nbd.FlagSendFUA | nbd.FlagSendTrim |
	nbd.FlagSendWriteZeroes | nbd.FlagCanMultiConn

// Serve accepts clients on ln until ctx ends, negotiating each on its own
// goroutine and then running it on one of an event loop per core.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	st, err := s.Base.Stat()
	if err != nil {
		return fmt.Errorf("nbdfloor: %w", err)
	}
	size := st.Size()
	var loops []*evloop.Loop
	var wg sync.WaitGroup
	defer func() {
		for _, l := range loops {
			l.Close()
		}
		wg.Wait()
	}()
	for range runtime.GOMAXPROCS(0) {
		l, err := evloop.New()
		if err != nil {
			return err
		}
		loops = append(loops, l)
		wg.Add(1)
		go func() { defer wg.Done(); _ = l.Run() }()
	}
	go func() { <-ctx.Done(); ln.Close() }()
	for i := 0; ; i++ {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("nbdfloor: accept: %w", err)
		}
		l := loops[i%len(loops)]
		go func() {
			fd, err := negotiate(c, size)
			c.Close()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					s.Log.Debug("nbdfloor: handshake", "err", err)
				}
				return
			}
			k := &conn{l: l, fd: fd, base: int(s.Base.Fd()), size: size}
			if err := l.Post(k.begin); err != nil {
				unix.Close(fd)
			}
		}()
	}
}

// negotiate runs the fixed newstyle handshake on c, offering any export
// name as the base file, and returns a duplicate of its socket for a loop
// once the client has chosen.
func negotiate(c net.Conn, size int64) (int, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(nbd.AppendGreeting(nil, nbd.FlagFixedNewstyle|nbd.FlagNoZeroes)); err != nil {
		return -1, err
	}
	var cf [nbd.ClientFlagsLen]byte
	if _, err := io.ReadFull(c, cf[:]); err != nil {
		return -1, err
	}
	clientFlags, err := nbd.ParseClientFlags(cf[:])
	if err != nil {
		return -1, err
	}
	var hb [nbd.OptionHeaderLen]byte
	for {
		if _, err := io.ReadFull(c, hb[:]); err != nil {
			return -1, err
		}
		h, err := nbd.ParseOptionHeader(hb[:])
		if err != nil {
			return -1, err
		}
		if h.Length > nbd.MaxString*2 {
			return -1, fmt.Errorf("option %v of %d bytes", h.Option, h.Length)
		}
		data := make([]byte, h.Length)
		if _, err := io.ReadFull(c, data); err != nil {
			return -1, err
		}
		var out []byte
		switch h.Option {
		case nbd.OptExportName:
			out = nbd.AppendExportNameReply(nil, uint64(size), flags, clientFlags&nbd.FlagCNoZeroes != 0)
		case nbd.OptGo, nbd.OptInfo:
			out = nbd.AppendOptionReply(nil, h.Option, nbd.RepInfo, nbd.AppendInfoExport(nil, uint64(size), flags))
			out = nbd.AppendOptionReply(out, h.Option, nbd.RepAck, nil)
		case nbd.OptAbort:
			_, _ = c.Write(nbd.AppendOptionReply(nil, h.Option, nbd.RepAck, nil))
			return -1, io.EOF
		default:
			out = nbd.AppendOptionReply(nil, h.Option, nbd.RepErrUnsup, nil)
		}
		if _, err := c.Write(out); err != nil {
			return -1, err
		}
		if h.Option == nbd.OptExportName || h.Option == nbd.OptGo {
			return evloop.Dup(c)
		}
	}
}

// conn is one client in transmission, a state machine run by its loop.
// Requests are answered in order, one at a time: a read's reply goes out
// (header, then the data by sendfile) before the next request is looked
// at, and a write's payload is dropped before its reply is queued.
type conn struct {
	l          *evloop.Loop
	fd, base   int
	size       int64
	in         [4096]byte // received request bytes not yet parsed
	have, next int        // in[next:have] is unparsed
	out        []byte     // reply headers not yet sent
	sendOff    int64      // a read's data still to send
	sendLeft   int
	drop       int // a write's payload still to drop
	dropCookie uint64
	closed     bool
}

func (k *conn) begin() {
	if err := k.l.Add(k.fd, k); err != nil {
		unix.Close(k.fd)
		return
	}
	k.Ready(evloop.Readable | evloop.Writable)
}

// outLimit is how many reply headers gather before they are written.
const outLimit = 32 << 10

// Ready does all it can until the socket would block either way; the
// edge that unblocks it calls it again.
func (k *conn) Ready(uint32) {
	for !k.closed {
		if k.sendLeft > 0 {
			if !k.sendData() {
				return
			}
			continue
		}
		if k.drop > 0 {
			if !k.dropPayload() {
				k.flush()
				return
			}
			continue
		}
		if k.have-k.next >= nbd.RequestLen {
			k.handle()
			continue
		}
		if !k.fill() {
			k.flush()
			return
		}
	}
}

// sendData writes pending headers and then some of the read's data;
// false when the socket is full.
func (k *conn) sendData() bool {
	if len(k.out) > 0 {
		n, err := evloop.WriteMore(k.fd, k.out)
		if err != nil {
			k.close()
			return false
		}
		k.out = k.out[:copy(k.out, k.out[n:])]
		if len(k.out) > 0 {
			return false
		}
	}
	n, err := evloop.Sendfile(k.fd, k.base, k.sendOff, k.sendLeft)
	if err != nil {
		k.close()
		return false
	}
	k.sendOff += int64(n)
	k.sendLeft -= n
	// A short send without EAGAIN raises no edge: only a full socket
	// (nothing sent) waits for one.
	return n > 0
}

// dropPayload drops a write's payload, from the buffer first; false when
// the socket has no more now.
func (k *conn) dropPayload() bool {
	if buffered := min(k.drop, k.have-k.next); buffered > 0 {
		k.next += buffered
		k.drop -= buffered
	} else {
		n, err := evloop.Discard(k.fd, k.drop)
		switch {
		case err != nil || n == 0:
			k.close()
			return false
		case n < 0:
			return false
		}
		k.drop -= n
	}
	if k.drop == 0 {
		k.reply(0, k.dropCookie)
	}
	return true
}

// fill reads more request bytes; false when there are none now.
func (k *conn) fill() bool {
	if k.next > 0 {
		k.have = copy(k.in[:], k.in[k.next:k.have])
		k.next = 0
	}
	n, err := evloop.Read(k.fd, k.in[k.have:])
	switch {
	case err != nil || n == 0:
		k.close()
		return false
	case n < 0:
		return false
	}
	k.have += n
	return true
}

// handle answers the request at the front of the buffer.
func (k *conn) handle() {
	var r nbd.Request
	if err := r.Decode(k.in[k.next : k.next+nbd.RequestLen]); err != nil {
		k.close()
		return
	}
	k.next += nbd.RequestLen
	inRange := r.Offset <= uint64(k.size) && uint64(r.Length) <= uint64(k.size)-r.Offset
	switch r.Cmd {
	case nbd.CmdDisc:
		k.flush()
		k.close()
	case nbd.CmdRead:
		if !inRange {
			k.reply(nbd.EINVAL, r.Cookie)
			return
		}
		k.reply(0, r.Cookie)
		k.sendOff, k.sendLeft = int64(r.Offset), int(r.Length)
	case nbd.CmdWrite:
		k.drop, k.dropCookie = int(r.Length), r.Cookie
		if k.drop == 0 {
			k.reply(0, r.Cookie)
		}
	default:
		if !inRange {
			k.reply(nbd.EINVAL, r.Cookie)
			return
		}
		k.reply(0, r.Cookie)
	}
}

// reply queues a simple reply header, writing the queue once it is long.
func (k *conn) reply(e nbd.Errno, cookie uint64) {
	k.out = nbd.AppendSimpleReply(k.out, e, cookie)
	if len(k.out) >= outLimit {
		k.flush()
	}
}

// flush writes what the socket takes of the queued headers; the rest
// waits for the next Ready.
func (k *conn) flush() {
	if len(k.out) == 0 || k.closed {
		return
	}
	n, err := evloop.Write(k.fd, k.out)
	if err != nil {
		k.close()
		return
	}
	k.out = k.out[:copy(k.out, k.out[n:])]
}

func (k *conn) close() {
	if k.closed {
		return
	}
	k.closed = true
	k.l.Remove(k.fd)
	unix.Close(k.fd)
}
