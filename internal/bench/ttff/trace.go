package ttff

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// traceCalls are the system calls strace records for each connection:
// the client's start (execve), its connections, and every way it waits.
const traceCalls = "execve,connect,poll,ppoll,select,pselect6,nanosleep,clock_nanosleep,epoll_wait,epoll_pwait"

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

// A timed-out 100 ms wait: a timeout argument of 100 ms (poll's and
// epoll's milliseconds, select's microseconds, the nanoseconds of the
// others) and a result of 0.
var hundredMS = regexp.MustCompile(`(, 100\)$)|(tv_sec=0, tv_usec=100000\})|(tv_sec=0, tv_nsec=100000000\})`)

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

// waits is what the client lost to 100 ms waits that timed out before
// the first frame: how many, on how many threads, and the time of the
// thread that lost most (the threads wait side by side, so their times
// do not add up).
type waits struct {
	count, threads int
	mainThread     time.Duration
}

func (t trace) hundredMSWaits(before time.Time) waits {
	per := map[int]time.Duration{}
	var w waits
	for _, c := range t.calls {
		if c.name == "execve" || c.name == "connect" || !c.start.Before(before) || !strings.HasPrefix(c.result, "0") {
			continue
		}
		if !hundredMS.MatchString(c.args) || c.dur < 90*time.Millisecond {
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
