package ttff

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// traceCalls are the system calls strace stops the client on: its start
// (execve), its connections and its sleeps. Not its polls and reads:
// stopping on each of them would hold back the very read that races
// the reply.
const traceCalls = "execve,connect,nanosleep,clock_nanosleep"

// call is one finished system call of the client's trace.
type call struct {
	pid    int
	start  time.Time
	dur    time.Duration
	name   string
	args   string
	result string
}

// trace is what one connection's strace recorded.
type trace struct {
	execve time.Time
	calls  []call
}

// lineRE splits `PID SECS.MICROS NAME(ARGS) = RESULT <DUR>`.
var lineRE = regexp.MustCompile(`^(\d+)\s+(\d+)\.(\d+) (\w+)\((.*)\) += (.*) <(\d+\.\d+)>$`)

// parseTrace reads `strace -f -ttt -T` output. A call another thread
// interrupted comes as an unfinished line and a resumed one; they are
// joined.
func parseTrace(r io.Reader) (trace, error) {
	var t trace
	pending := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		pid, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimLeft(rest, " ")
		if head, ok := strings.CutSuffix(rest, " <unfinished ...>"); ok {
			pending[pid] = pid + " " + head
			continue
		}
		if i := strings.Index(rest, "<... "); i >= 0 {
			j := strings.Index(rest, " resumed>")
			p, ok := pending[pid]
			if !ok || j < i {
				continue
			}
			delete(pending, pid)
			line = p + rest[j+len(" resumed>"):]
		}
		m := lineRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		c := call{name: m[4], args: m[5], result: m[6]}
		c.pid, _ = strconv.Atoi(m[1])
		sec, _ := strconv.ParseInt(m[2], 10, 64)
		usec, _ := strconv.ParseInt(m[3], 10, 64)
		c.start = time.Unix(sec, usec*1000)
		d, _ := strconv.ParseFloat(m[7], 64)
		c.dur = time.Duration(d * float64(time.Second))
		if c.name == "execve" && t.execve.IsZero() && c.result == "0" {
			t.execve = c.start
		}
		t.calls = append(t.calls, c)
	}
	return t, sc.Err()
}

// waits is what the client lost to sleeps of one length before the
// first frame: how many, on how many threads, and the time of the
// thread that lost most (threads sleep side by side, so their times do
// not add up).
type waits struct {
	count, threads int
	mainThread     time.Duration
}

// sleeps counts the client's sleeps of d (FreeRDP 2 sleeps 100 ms when
// its read right after a request finds no reply, and 10 ms in its
// gateway handshake) that began before the first frame.
func (t trace) sleeps(d time.Duration, before time.Time) waits {
	want := fmt.Sprintf("{tv_sec=%d, tv_nsec=%d}", d/time.Second, d%time.Second)
	per := map[int]time.Duration{}
	var w waits
	for _, c := range t.calls {
		if (c.name != "clock_nanosleep" && c.name != "nanosleep") || !c.start.Before(before) || !strings.Contains(c.args, want) {
			continue
		}
		w.count++
		per[c.pid] += c.dur
	}
	w.threads = len(per)
	for _, d := range per {
		w.mainThread = max(w.mainThread, d)
	}
	return w
}

// connects are the client's TCP connections to port before the first
// frame.
func (t trace) connects(port int, before time.Time) int {
	n := 0
	needle := "sin_port=htons(" + strconv.Itoa(port) + ")"
	for _, c := range t.calls {
		if c.name == "connect" && c.start.Before(before) && strings.Contains(c.args, needle) {
			n++
		}
	}
	return n
}
