// Package evloop runs many non-blocking sockets on one goroutine with
// epoll, calling back on readiness instead of parking a goroutine per
// socket.
//
// Go's netpoller wakes one goroutine per ready socket, and on a relay
// whose tunnels each carry one small message at a time that wake-up (the
// run queue, an idle thread woken to take it, the switch back) costs more
// than the message: the event loop handles every socket that an epoll
// wait returned, in turn, on the thread that waited, the way C relays do.
// Sockets are registered edge-triggered for reading and writing, so a
// handler hears of new data and of a send buffer that drained, and keeps
// its own note of what it has not finished.
package evloop

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Events a Handler is called with (epoll's bits).
const (
	Readable = unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLHUP | unix.EPOLLERR
	Writable = unix.EPOLLOUT
)

// Handler is called on the loop's goroutine for the file descriptor it
// was added with. events is zero when it is called because it asked for
// Again.
type Handler interface {
	Ready(events uint32)
}

// ErrClosed is returned by Post once the loop has been closed.
var ErrClosed = errors.New("evloop: loop closed")

// Loop is one epoll instance and the goroutine that waits on it. Add,
// Remove and Again may only be called on that goroutine (from a Handler
// or a posted function); Post and Close from anywhere.
type Loop struct {
	epfd         int
	file         *os.File // epfd, as Go's poller knows it
	wakeR, wakeW int

	mu      sync.Mutex // guards tasks and closing
	tasks   []func()
	closing bool
	woken   atomic.Bool // a wake-up byte is in the pipe
	done    chan struct{}

	// Loop goroutine only.
	handlers []Handler // by file descriptor
	again    []Handler
	spare    []Handler
	atEnd    []Handler
	ring     *ring // nil where io_uring is not offered: SendAll writes
}

// New creates a loop; Run must then be called to serve it.
func New() (*Loop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("evloop: epoll_create1: %w", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("evloop: pipe2: %w", err)
	}
	l := &Loop{epfd: epfd, wakeR: p[0], wakeW: p[1], done: make(chan struct{})}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.wakeR)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, l.wakeR, &ev); err != nil {
		unix.Close(epfd)
		l.closePipe()
		return nil, fmt.Errorf("evloop: epoll_ctl wake pipe: %w", err)
	}
	// Non-blocking, so os.NewFile registers it with Go's poller (see Run).
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		l.closePipe()
		return nil, fmt.Errorf("evloop: epoll descriptor: %w", err)
	}
	l.file = os.NewFile(uintptr(epfd), "epoll")
	// Only a file Go's poller accepted takes deadlines: without it the
	// loop could not park.
	if err := l.file.SetReadDeadline(time.Time{}); err != nil {
		l.closeFDs()
		return nil, fmt.Errorf("evloop: Go's poller does not take the epoll descriptor: %w", err)
	}
	// Without io_uring the loop still works, one write call per send.
	l.ring, _ = newRing(256)
	return l, nil
}

func (l *Loop) closePipe() {
	unix.Close(l.wakeR)
	unix.Close(l.wakeW)
}

func (l *Loop) closeFDs() {
	_ = l.file.Close()
	l.closePipe()
	if l.ring != nil {
		l.ring.close()
		l.ring = nil
	}
}

// Add registers fd, edge-triggered for reading and writing, with h.
func (l *Loop) Add(fd int, h Handler) error {
	if fd < 0 {
		return fmt.Errorf("evloop: bad file descriptor %d", fd)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("evloop: epoll_ctl add %d: %w", fd, err)
	}
	for fd >= len(l.handlers) {
		l.handlers = append(l.handlers, make([]Handler, max(64, len(l.handlers)))...)
	}
	l.handlers[fd] = h
	return nil
}

// Remove unregisters fd; the caller closes it afterwards.
func (l *Loop) Remove(fd int) {
	if fd < 0 || fd >= len(l.handlers) || l.handlers[fd] == nil {
		return
	}
	l.handlers[fd] = nil
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

// Again calls h.Ready(0) after the handlers of the current round, for a
// handler that stopped early to let others run, or that has work to do
// without a new event.
func (l *Loop) Again(h Handler) { l.again = append(l.again, h) }

// AtEnd calls h.Ready(0) once the handlers of the current round, those
// asked for with Again included, and the functions posted have run: where
// a handler that collected sends for many sockets makes them together
// (SendAll).
func (l *Loop) AtEnd(h Handler) { l.atEnd = append(l.atEnd, h) }

// runAtEnd calls the handlers AtEnd asked for.
func (l *Loop) runAtEnd() {
	for i := 0; i < len(l.atEnd); i++ { // a handler may ask again
		h := l.atEnd[i]
		l.atEnd[i] = nil
		h.Ready(0)
	}
	l.atEnd = l.atEnd[:0]
}

// Post runs f on the loop's goroutine soon.
func (l *Loop) Post(f func()) error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return ErrClosed
	}
	l.tasks = append(l.tasks, f)
	l.mu.Unlock()
	l.wake()
	return nil
}

func (l *Loop) wake() {
	if l.woken.CompareAndSwap(false, true) {
		_, _ = unix.Write(l.wakeW, []byte{1})
	}
}

// Close stops the loop after the functions already posted have run and
// waits for Run to return. Handlers still registered are not called again;
// their owners close their descriptors.
func (l *Loop) Close() {
	l.mu.Lock()
	first := !l.closing
	l.closing = true
	l.mu.Unlock()
	if first {
		l.wake()
	}
	<-l.done
}

// Run waits for events and calls handlers until Close.
//
// The loop never blocks in epoll_wait itself: its epoll descriptor is
// registered with Go's own poller, and the goroutine parks there while
// nothing is ready. A goroutine blocked in a system call keeps an OS
// thread and makes the runtime hand its processor to another thread,
// which on a busy relay costs a wake-up and a context switch every few
// microseconds; parked, it is woken once per batch of events like any
// network goroutine.
func (l *Loop) Run() error {
	defer close(l.done)
	defer l.closeFDs()
	// However Run ends, later Posts fail (so callers act themselves) and
	// what was posted runs.
	defer func() {
		l.mu.Lock()
		l.closing = true
		rest := l.tasks
		l.tasks = nil
		l.mu.Unlock()
		for _, f := range rest {
			f()
		}
	}()
	raw, err := l.file.SyscallConn()
	if err != nil {
		return fmt.Errorf("evloop: %w", err)
	}
	events := make([]unix.EpollEvent, 256)
	var tasks []func()
	var runErr error
	err = raw.Read(func(uintptr) bool {
		for {
			n, err := l.pollNow(events)
			if err != nil {
				if errors.Is(err, unix.EINTR) {
					continue
				}
				runErr = fmt.Errorf("evloop: epoll_wait: %w", err)
				return true
			}
			wakeup := false
			for i := range n {
				fd := int(events[i].Fd)
				if fd == l.wakeR {
					wakeup = true
					continue
				}
				if fd < len(l.handlers) {
					if h := l.handlers[fd]; h != nil {
						h.Ready(events[i].Events)
					}
				}
			}
			if len(l.again) > 0 {
				again := l.again
				l.again = l.spare[:0]
				for _, h := range again {
					h.Ready(0)
				}
				clear(again)
				l.spare = again
			}
			if wakeup {
				var closed bool
				if tasks, closed = l.runTasks(tasks); closed {
					l.runAtEnd()
					return true
				}
			}
			l.runAtEnd()
			// The epoll descriptor reports new events by an edge, so wait
			// only once a wait returned less than it could hold and no
			// handler asked to run again.
			if n < len(events) && len(l.again) == 0 {
				return false
			}
		}
	})
	if runErr != nil {
		return runErr
	}
	return err
}

// runTasks drains the wake-up pipe and runs the posted functions,
// returning the emptied slice for reuse; closed reports that the loop is
// closing and everything posted has run.
func (l *Loop) runTasks(tasks []func()) (_ []func(), closed bool) {
	var b [64]byte
	for {
		if n, _ := unix.Read(l.wakeR, b[:]); n < len(b) {
			break
		}
	}
	l.woken.Store(false)
	l.mu.Lock()
	tasks, l.tasks = l.tasks, tasks[:0]
	closing := l.closing
	l.mu.Unlock()
	for i, f := range tasks {
		f()
		tasks[i] = nil
	}
	if !closing {
		return tasks[:0], false
	}
	l.mu.Lock()
	rest := l.tasks
	l.tasks = nil
	l.mu.Unlock()
	for _, f := range rest {
		f()
	}
	return nil, true
}

// Dup returns a duplicate of c's socket for a loop, which stays open
// after c is closed (Go's poller lets go of the original on Close); the
// duplicate shares the socket's non-blocking mode.
func Dup(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1, errors.New("evloop: connection has no file descriptor")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("evloop: dup: %w", derr)
	}
	return fd, nil
}

// Read reads once from a non-blocking descriptor: n > 0 bytes, 0 at end
// of file, or -1 when nothing is there now.
//
// Read, Write and the loop's own epoll_wait never block, so they are made
// as raw system calls, without the scheduler's system-call bookkeeping:
// with it, a call that happens to take over 20 µs (a loopback write runs
// the receiver's network stack too) lets the runtime's monitor hand the
// processor to another thread, and keeps that monitor waking every 20 µs.
func Read(fd int, p []byte) (int, error) {
	for {
		n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), bufPtr(p), uintptr(len(p)))
		switch e {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return -1, nil
		}
		return 0, e
	}
}

// Write writes what a non-blocking descriptor takes now: all of p, a
// shorter count, or zero when its buffer is full.
func Write(fd int, p []byte) (int, error) { return write(fd, p, false) }

// maxIOV bounds the pieces one Writev call passes (IOV_MAX is 1024).
const maxIOV = 64

// Writev writes the pieces of iov, in order, to the non-blocking fd
// without first joining them: the count written, which stops short when
// the socket's buffer is full.
func Writev(fd int, iov [][]byte) (int, error) {
	var vec [maxIOV]unix.Iovec
	done := 0
	for len(iov) > 0 {
		k, want := 0, 0
		for _, p := range iov[:min(len(iov), maxIOV)] {
			if len(p) == 0 {
				continue
			}
			vec[k].Base = &p[0]
			vec[k].SetLen(len(p))
			want += len(p)
			k++
		}
		if k == 0 {
			return done, nil
		}
		n, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&vec[0])), uintptr(k))
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return done, nil
		default:
			return done, e
		}
		done += int(n)
		if int(n) < want {
			return done, nil
		}
		iov = iov[min(len(iov), maxIOV):]
	}
	return done, nil
}

// write is Write, or with more a send with MSG_MORE (sockets only).
func write(fd int, p []byte, more bool) (int, error) {
	done := 0
	for done < len(p) {
		var n uintptr
		var e unix.Errno
		if more {
			n, _, e = unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), bufPtr(p[done:]), uintptr(len(p)-done), unix.MSG_MORE, 0, 0)
		} else {
			n, _, e = unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), bufPtr(p[done:]), uintptr(len(p)-done))
		}
		switch e {
		case 0:
			done += int(n)
			continue
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return done, nil
		}
		return done, e
	}
	return done, nil
}

func bufPtr(p []byte) uintptr {
	if len(p) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(&p[0]))
}

// pollNow returns the events ready now, without waiting.
func (l *Loop) pollNow(events []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// WriteMore is Write with MSG_MORE: the kernel holds a short p back to go
// out in one segment with what is sent next (a reply header before its
// sendfile data).
func WriteMore(fd int, p []byte) (int, error) { return write(fd, p, true) }

// Sendfile sends up to n bytes of file in from offset off to the
// non-blocking socket fd without copying them through user memory: the
// count sent, which is 0 when the socket's buffer is full.
func Sendfile(fd, in int, off int64, n int) (int, error) {
	for {
		o := off
		m, _, e := unix.RawSyscall6(unix.SYS_SENDFILE, uintptr(fd), uintptr(in), uintptr(unsafe.Pointer(&o)), uintptr(n), 0, 0)
		switch e {
		case 0:
			return int(m), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, nil
		}
		return 0, e
	}
}

// Discard drops up to n bytes from a non-blocking TCP socket without
// copying them (recv with MSG_TRUNC): the count dropped, 0 at end of
// stream, or -1 when nothing is there now.
func Discard(fd, n int) (int, error) {
	// TCP does not write to the buffer under MSG_TRUNC, but the call
	// still wants a valid one.
	var one [1]byte
	for {
		m, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&one[0])), uintptr(n), unix.MSG_TRUNC, 0, 0)
		switch e {
		case 0:
			return int(m), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return -1, nil
		}
		return 0, e
	}
}
