package stream

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/deskway/deskway/internal/proto/nbd"
)

// TestLoopsLeaveAProcessor: the server starts one event loop fewer than
// Go's processors (and one on a single processor), so the rest of the
// process never takes a processor a loop is waiting for.
func TestLoopsLeaveAProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 2, 8: 7} {
		runtime.GOMAXPROCS(procs)
		ls, err := startLoops()
		if err != nil {
			t.Fatal(err)
		}
		got := len(ls.all)
		ls.close()
		if got != want {
			t.Errorf("%d loops on %d processors, want %d", got, procs, want)
		}
	}
}

// TestLoopConnectionLeavesGoPoller: once a connection is served on an
// event loop, the loop's descriptor is the server's only one of its
// socket, so Go's poller is not told of its traffic; the connection
// still serves writes and reads.
func TestLoopConnectionLeavesGoPoller(t *testing.T) {
	_, addr, base := newTestServer(t)
	cl := dial(t, addr)
	cl.goExport("golden/vm1/b1")
	data := bytes.Repeat([]byte{0xa5}, 3*cacheBlock)
	cl.request(nbd.Request{Cmd: nbd.CmdWrite, Cookie: 1, Offset: 512, Length: uint32(len(data))}, data)
	if e := cl.simpleReply(1); e != 0 {
		t.Fatalf("write: error %d", e)
	}
	cl.request(nbd.Request{Cmd: nbd.CmdRead, Cookie: 2, Length: 4 * cacheBlock}, nil)
	if e := cl.simpleReply(2); e != 0 {
		t.Fatalf("read: error %d", e)
	}
	want := append(append(bytes.Clone(base[:512]), data...), base[512+len(data):4*cacheBlock]...)
	if got := cl.read(4 * cacheBlock); !bytes.Equal(got, want) {
		t.Fatal("read after write does not return the write over the base")
	}
	// The write was answered on the loop, so the handover is done.
	inode := serverSocket(t, cl.c)
	if n := descriptorsOf(t, inode); n != 1 {
		t.Fatalf("the server holds %d descriptors of a connection served on a loop, want 1 (the loop's)", n)
	}
}

// serverSocket is the inode of the server's end of the loopback
// connection c.
func serverSocket(t *testing.T, c net.Conn) string {
	t.Helper()
	local, remote := c.LocalAddr().(*net.TCPAddr), c.RemoteAddr().(*net.TCPAddr)
	f, err := os.Open("/proc/self/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The server's end has the server's port as its local address and
	// the client's as its remote one (127.0.0.1 is 0100007F).
	want := fmt.Sprintf("0100007F:%04X 0100007F:%04X", remote.Port, local.Port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 9 && fields[1]+" "+fields[2] == want {
			return fields[9]
		}
	}
	t.Fatalf("no socket %s in /proc/self/net/tcp", want)
	return ""
}

// descriptorsOf counts this process's descriptors of the socket inode.
func descriptorsOf(t *testing.T, inode string) int {
	t.Helper()
	fds, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && target == "socket:["+inode+"]" {
			n++
		}
	}
	return n
}
