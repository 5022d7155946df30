package childproc

import (
	"strings"
	"testing"
	"time"
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestKillEndsTheGroupAtOnce: Kill is a crash: the program and what it
// started are gone without being asked, even when they ignore SIGTERM.
func TestKillEndsTheGroupAtOnce(t *testing.T) {
	p, err := Start(nil, "sh", "-c", `trap "" TERM; echo up; sleep 60 & wait`)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "output", func() bool { return strings.Contains(p.Output(), "up") })
	start := time.Now()
	p.Kill()
	select {
	case <-p.Exited():
	default:
		t.Fatal("Kill returned before the program was collected")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Kill took %v", took)
	}
	// A second Kill or Stop of a collected program returns at once.
	p.Kill()
	p.Stop()
}

// TestStopWithinGivesItsGrace: a program that does not end on SIGTERM
// is killed once the grace is over, not before, and a program already
// stopped is not waited for again.
func TestStopWithinGivesItsGrace(t *testing.T) {
	p, err := Start(nil, "sh", "-c", `trap "" TERM; echo up; while :; do sleep 0.05; done`)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "output", func() bool { return strings.Contains(p.Output(), "up") })
	const grace = 300 * time.Millisecond
	start := time.Now()
	p.StopWithin(grace)
	if took := time.Since(start); took < grace {
		t.Fatalf("stopped after %v, within its %v grace, though it ignores SIGTERM", took, grace)
	}
	start = time.Now()
	p.StopWithin(time.Minute)
	if took := time.Since(start); took > time.Second {
		t.Fatalf("a second stop took %v", took)
	}
}

// TestStopEndsAProgramThatHeedsSIGTERM at once, with what it printed
// kept for the error message.
func TestStopEndsAProgramThatHeedsSIGTERM(t *testing.T) {
	p, err := Start([]string{"CHILDPROC_TEST=from-env"}, "sh", "-c", `echo "$CHILDPROC_TEST"; echo second; exec sleep 60`)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "output", func() bool { return strings.Contains(p.Output(), "second") })
	start := time.Now()
	p.StopWithin(time.Minute)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Stop took %v for a program that ends on SIGTERM", took)
	}
	if got := p.Tail(1); got != "second" {
		t.Fatalf("Tail(1) = %q", got)
	}
	if !strings.HasPrefix(p.Output(), "from-env\n") {
		t.Fatalf("output %q lacks the environment given", p.Output())
	}
}
