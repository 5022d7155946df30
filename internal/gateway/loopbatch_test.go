package gateway_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deskway/deskway/internal/config"
	"github.com/deskway/deskway/internal/tsgclient"
)

// Messages of the batched-send test: a sequence number, a length and
// that many bytes that depend on both, so a byte lost, repeated or moved
// shows at the message it falls in. The last message has length 0.
const seqHeader = 6

func seqMessage(seq uint32, n int) []byte {
	m := make([]byte, seqHeader+n)
	binary.BigEndian.PutUint32(m, seq)
	binary.BigEndian.PutUint16(m[4:], uint16(n))
	for i := range n {
		m[seqHeader+i] = byte(int(seq)*7 + i)
	}
	return m
}

// seqSize varies the messages between 200 and 6,000 bytes: each is one
// small write for the loop's round, well under its batch's bound, and
// together they fill a socket of several hundred KiB in a fraction of a
// second.
func seqSize(seq uint32) int { return 200 + int(seq*2654435761%5801) }

// writeSeq writes messages for d, in bursts of burst with pause between,
// then the last one, keeping count in done; it returns how many it
// wrote before the last.
func writeSeq(w io.Writer, d time.Duration, burst uint32, pause time.Duration, done *atomic.Uint32) (uint32, error) {
	var seq uint32
	for end := time.Now().Add(d); time.Now().Before(end); seq++ {
		done.Store(seq)
		if _, err := w.Write(seqMessage(seq, seqSize(seq))); err != nil {
			return seq, fmt.Errorf("message %d: %w", seq, err)
		}
		if seq%burst == burst-1 {
			time.Sleep(pause)
		}
	}
	_, err := w.Write(seqMessage(seq, 0))
	return seq, err
}

// readSeq reads messages up to the last, checking each against what
// writeSeq wrote. It naps for nap after reading for 2 × nap, so the
// sender's socket fills again and again, each time after the relay has
// caught up and makes small writes. It keeps count in done and returns
// how many came before the last.
func readSeq(r io.Reader, nap time.Duration, done *atomic.Uint32) (uint32, error) {
	var want uint32
	head := make([]byte, seqHeader)
	wake := time.Now()
	for ; ; want++ {
		done.Store(want)
		if time.Since(wake) > 2*nap {
			time.Sleep(nap)
			wake = time.Now()
		}
		if _, err := io.ReadFull(r, head); err != nil {
			return want, fmt.Errorf("header of message %d: %w", want, err)
		}
		seq, n := binary.BigEndian.Uint32(head), int(binary.BigEndian.Uint16(head[4:]))
		if seq != want {
			return want, fmt.Errorf("message %d came where %d was due", seq, want)
		}
		if n == 0 {
			return want, nil
		}
		if n != seqSize(seq) {
			return want, fmt.Errorf("message %d is %d bytes, want %d", seq, n, seqSize(seq))
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return want, fmt.Errorf("message %d: %w", seq, err)
		}
		if m := seqMessage(seq, n); string(body) != string(m[seqHeader:]) {
			return want, fmt.Errorf("message %d has other bytes than were sent", seq)
		}
	}
}

// smallBuffer makes a socket's receive buffer 4 KiB and its segments
// 536 bytes before it connects (or, on a listener, before it accepts):
// the kernel sizes the sending peer's buffer by the segment size, so a
// peer that does not read fills the gateway's socket within a fraction
// of a second, where at loopback's 64 KiB segments it took megabytes.
func smallBuffer(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, 536)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// TestLoopBatchedSendsKeepEveryByte: a tunnel on an event loop makes its
// small writes in one batch at the end of the loop's round; when a peer
// reads nothing for a while, its socket takes only part of a batched
// send or none of it. The rest must go first once the socket drains,
// before what was written meanwhile, and go at all: every message
// arrives once and in order, in both directions. The host writes one
// message at a time with a pause, so each round's TLS records stay under
// the batch's bound (a socket that backs up makes them larger, and those
// go directly); the client writes bursts of eight, so a round holds more
// for the host than one batched send and the rest queues behind it.
func TestLoopBatchedSendsKeepEveryByte(t *testing.T) {
	const (
		writing = 3 * time.Second        // how long the sender writes
		asleep  = 300 * time.Millisecond // how long the receiver reads nothing
		pause   = 200 * time.Microsecond // between the sender's writes
		nap     = 200 * time.Millisecond // the receiver's, again and again
		limit   = time.Minute            // the whole exchange, on a loaded machine
	)
	for _, dir := range []string{"host to client", "client to host"} {
		t.Run(dir, func(t *testing.T) {
			loops := 1
			h := start(t, func(c *config.Config) {
				c.Gateway.RelayLoops = &loops
				c.Gateway.WriteTimeout = config.Duration(limit)
			})
			lc := net.ListenConfig{Control: smallBuffer}
			if dir == "host to client" {
				lc.Control = nil
			}
			ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			type result struct {
				n   uint32
				err error
			}
			hostDone := make(chan result, 1)
			var wrote, read atomic.Uint32 // messages so far
			go func() {
				c, err := ln.Accept()
				if err != nil {
					hostDone <- result{err: err}
					return
				}
				defer c.Close()
				var r result
				if dir == "host to client" {
					r.n, r.err = writeSeq(c, writing, 1, pause, &wrote)
					hostDone <- r
					_, _ = io.Copy(io.Discard, c) // hold the channel open until the client goes
					return
				}
				time.Sleep(asleep)
				r.n, r.err = readSeq(c, nap, &read)
				hostDone <- r
			}()
			cfg := h.cfg("", "", tsgclient.Websocket)
			port := uint16(ln.Addr().(*net.TCPAddr).Port)
			cfg.Token = h.token(t, "bob", "127.0.0.1", port, time.Minute)
			if dir == "host to client" {
				d := net.Dialer{Timeout: 10 * time.Second, Control: smallBuffer}
				cfg.Dial = d.DialContext
			}
			c, err := dial(t, cfg, "127.0.0.1", port)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			clientDone := make(chan result, 1)
			go func() {
				var r result
				if dir == "host to client" {
					time.Sleep(asleep)
					r.n, r.err = readSeq(c, nap, &read)
				} else {
					r.n, r.err = writeSeq(c, writing, 8, pause, &wrote)
				}
				clientDone <- r
			}()
			var sent, got result
			timeout := time.After(limit)
			for range 2 {
				select {
				case r := <-hostDone:
					if dir == "host to client" {
						sent = r
					} else {
						got = r
					}
				case r := <-clientDone:
					if dir == "host to client" {
						got = r
					} else {
						sent = r
					}
				case <-timeout:
					c.Close()
					t.Fatalf("after %s, %d messages written and %d read: the relay stalled", limit, wrote.Load(), read.Load())
				}
			}
			if got.err != nil || sent.err != nil {
				t.Fatalf("reading, after %d messages: %v; writing, after %d: %v", got.n, got.err, sent.n, sent.err)
			}
			if got.n != sent.n {
				t.Fatalf("%d messages received, %d sent", got.n, sent.n)
			}
			t.Logf("%d messages, all in order", got.n)
		})
	}
}
