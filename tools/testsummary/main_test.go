package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	const pass = `{"Action":"pass","Package":"p","Test":"TestA"}` + "\n"
	const skip = `{"Action":"skip","Package":"p","Test":"TestB"}` + "\n"
	const fail = `{"Action":"output","Package":"p","Test":"TestC","Output":"boom\n"}` + "\n" +
		`{"Action":"fail","Package":"p","Test":"TestC"}` + "\n"
	for _, c := range []struct {
		name, in string
		ci       bool
		code     int
		line     string
	}{
		{"all pass", pass, true, 0, "1 passed, 0 failed, 0 skipped"},
		{"a skip outside CI", pass + skip, false, 0, "1 passed, 0 failed, 1 skipped"},
		{"a skip in CI", pass + skip, true, 1, "1 passed, 0 failed, 1 skipped"},
		{"a failure", pass + fail, false, 1, "1 passed, 1 failed, 0 skipped"},
		{"a build error", "# p\nx.go:1: undefined: y\n" + pass, false, 1, "1 passed, 0 failed, 0 skipped"},
	} {
		var w strings.Builder
		if code, _ := summarize(strings.NewReader(c.in), &w, c.ci); code != c.code || !strings.Contains(w.String(), c.line) {
			t.Errorf("%s: exit %d, want %d; output:\n%s", c.name, code, c.code, w.String())
		}
	}
}

// TestSlowestListed: the longest top-level tests are listed, longest
// first, and subtests are not (their time is inside their parent's).
func TestSlowestListed(t *testing.T) {
	in := `{"Action":"pass","Package":"p","Test":"TestQuick","Elapsed":0.5}` + "\n" +
		`{"Action":"pass","Package":"p","Test":"TestSlow/sub","Elapsed":90}` + "\n" +
		`{"Action":"pass","Package":"p","Test":"TestSlow","Elapsed":91}` + "\n" +
		`{"Action":"fail","Package":"p","Test":"TestMiddle","Elapsed":12}` + "\n"
	var w strings.Builder
	_, timed := summarize(strings.NewReader(in), &w, false)
	got := w.String()
	slow, middle, quick := strings.Index(got, "91.0s p TestSlow\n"), strings.Index(got, "12.0s p TestMiddle\n"), strings.Index(got, "0.5s p TestQuick\n")
	if slow < 0 || middle < slow || quick < middle || strings.Contains(got, "TestSlow/sub\n") {
		t.Errorf("slowest tests not listed longest first, without subtests:\n%s", got)
	}
	path := filepath.Join(t.TempDir(), "times", "test-times.tsv")
	if err := writeTimes(path, timed); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if want := "91.0\tp\tTestSlow\n12.0\tp\tTestMiddle\n0.5\tp\tTestQuick\n"; string(b) != want {
		t.Errorf("times file %q, want %q", b, want)
	}
}

// TestTenSlowestAndWallTime: of twelve tests only the ten longest are
// listed, and the run's wall time is the span of go test's timestamps.
func TestTenSlowestAndWallTime(t *testing.T) {
	var in strings.Builder
	for i := 1; i <= 12; i++ {
		fmt.Fprintf(&in, `{"Time":"2026-11-27T18:%02d:00Z","Action":"pass","Package":"p","Test":"Test%02d","Elapsed":%d}`+"\n", i, i, i)
	}
	var w strings.Builder
	summarize(strings.NewReader(in.String()), &w, false)
	got := w.String()
	if !strings.Contains(got, "p Test03\n") || strings.Contains(got, "p Test02\n") || strings.Contains(got, "p Test01\n") {
		t.Errorf("want the ten slowest (Test12 down to Test03) listed:\n%s", got)
	}
	if !strings.Contains(got, "\nwall time 11m0s\n") {
		t.Errorf("want a wall time of 11m0s (18:01 to 18:12):\n%s", got)
	}
}

// TestGroupCasesTimed: a test that runs its cases one after another
// (TestXRDP) is timed as its cases, so the slowest list names the slow
// case; a test with parallel subtests, with most of its time outside its
// subtests, with one subtest or under a second is timed whole.
func TestGroupCasesTimed(t *testing.T) {
	ev := func(action, test string, elapsed float64) string {
		return fmt.Sprintf(`{"Action":%q,"Package":"p","Test":%q,"Elapsed":%g}`+"\n", action, test, elapsed)
	}
	in := ev("pause", "TestXRDP", 0) + ev("cont", "TestXRDP", 0) +
		ev("pass", "TestXRDP/Farm", 300) + ev("pass", "TestXRDP/Browser", 200) + ev("pass", "TestXRDP/Console", 40) +
		ev("pass", "TestXRDP", 541) +
		ev("pause", "TestPar/a", 0) + ev("pause", "TestPar/b", 0) + ev("pass", "TestPar/a", 50) + ev("pass", "TestPar/b", 55) +
		ev("pass", "TestPar", 60) +
		ev("pass", "TestSetup/a", 20) + ev("pass", "TestSetup/b", 10) + ev("pass", "TestSetup", 100) +
		ev("pass", "TestOne/only", 90) + ev("pass", "TestOne", 91) +
		ev("pass", "TestQuick/a", 0.25) + ev("pass", "TestQuick/b", 0.25) + ev("pass", "TestQuick", 0.5)
	var w strings.Builder
	_, timed := summarize(strings.NewReader(in), &w, false)
	want := []string{
		"300.0s p TestXRDP/Farm", "200.0s p TestXRDP/Browser", "100.0s p TestSetup", "91.0s p TestOne",
		"60.0s p TestPar", "40.0s p TestXRDP/Console", "0.5s p TestQuick",
	}
	_, list, _ := strings.Cut(w.String(), "slowest tests:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var got []string
	for _, l := range strings.Split(list, "\n") {
		got = append(got, strings.TrimSpace(l))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("slowest tests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	path := filepath.Join(t.TempDir(), "test-times.tsv")
	if err := writeTimes(path, timed); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if wantTSV := "300.0\tp\tTestXRDP/Farm\n200.0\tp\tTestXRDP/Browser\n100.0\tp\tTestSetup\n91.0\tp\tTestOne\n" +
		"60.0\tp\tTestPar\n40.0\tp\tTestXRDP/Console\n0.5\tp\tTestQuick\n"; string(b) != wantTSV {
		t.Errorf("times file %q, want %q", b, wantTSV)
	}
}

// TestBuildErrorShown: go test -json reports a package that does not
// build (or fails vet) as build-output events; the summary prints them,
// and fails.
func TestBuildErrorShown(t *testing.T) {
	in := `{"ImportPath":"p [p.test]","Action":"build-output","Output":"# p [p.test]\n"}` + "\n" +
		`{"ImportPath":"p [p.test]","Action":"build-output","Output":"./x.go:1:2: undefined: y\n"}` + "\n" +
		`{"ImportPath":"p [p.test]","Action":"build-fail"}` + "\n" +
		`{"Action":"start","Package":"p"}` + "\n" +
		`{"Action":"output","Package":"p","Output":"FAIL\tp [build failed]\n"}` + "\n" +
		`{"Action":"fail","Package":"p","Elapsed":0,"FailedBuild":"p [p.test]"}` + "\n"
	var w strings.Builder
	if code, _ := summarize(strings.NewReader(in), &w, false); code != 1 || !strings.Contains(w.String(), "./x.go:1:2: undefined: y\n") {
		t.Errorf("exit %d, want 1 with the compiler's error; output:\n%s", code, w.String())
	}
}

// TestFailingStepBesideTheTestsFails: a step that runs beside the tests
// and writes plain lines into a run's stream (scripts/fuzz.sh after the
// unit tests) fails the summary with its last line "FAIL ...", which is
// printed, while its other lines are only printed.
func TestFailingStepBesideTheTestsFails(t *testing.T) {
	pass := `{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}` + "\n"
	for _, c := range []struct {
		lines string
		want  int
	}{
		{"fuzz internal/x FuzzY: 0.2 s\nfuzz: each of 1 targets ran 10000x inputs without a crash, in 1 s\n", 0},
		{"fuzz internal/x FuzzY failed:\npanic: boom\nFAIL fuzz: a target failed (see above)\n", 1},
	} {
		var w strings.Builder
		code, _ := summarize(strings.NewReader(pass+c.lines), &w, false)
		if code != c.want || !strings.Contains(w.String(), "fuzz internal/x FuzzY") {
			t.Errorf("lines %q: exit %d, want %d; output:\n%s", c.lines, code, c.want, w.String())
		}
	}
}

// TestLockWaitsAddedUp: the waits parallel tests log for guest slots and
// locks are added up by lock, with the longest waiters; a serial test's
// wait (it holds no slot another test could have) is not counted.
func TestLockWaitsAddedUp(t *testing.T) {
	out := func(test, line string) string {
		return fmt.Sprintf(`{"Action":"output","Package":"p","Test":%q,"Output":%q}`+"\n", test, line)
	}
	in := `{"Action":"pause","Package":"p","Test":"TestProxyDHCP"}` + "\n" +
		`{"Action":"pause","Package":"p","Test":"TestMenu"}` + "\n" +
		`{"Action":"pause","Package":"p","Test":"TestXRDP"}` + "\n" +
		out("TestProxyDHCP", "    guests_test.go:43: waited 2m40s for a guest slot\n") +
		out("TestMenu", "    lock.go:68: waited 1m0.5s for lock e2e-guest-0\n") +
		out("TestMenu", "    lock.go:68: waited 20s for lock e2e-guest-1\n") +
		out("TestXRDP/Farm", "    lock.go:68: waited 30.2s for lock xrdp-sesman\n") +
		out("TestSerial", "    lock.go:68: waited 5m0s for lock xrdp-sesman\n") +
		`{"Action":"pass","Package":"p","Test":"TestProxyDHCP","Elapsed":185}` + "\n"
	var w strings.Builder
	summarize(strings.NewReader(in), &w, false)
	want := "parallel tests waited 4m31s for shared locks, each holding a -parallel slot (guest slots 4m1s, xrdp-sesman 30s; longest TestProxyDHCP 2m40s, TestMenu 1m21s, TestXRDP 30s)\n"
	if !strings.Contains(w.String(), want) {
		t.Errorf("want %q in:\n%s", want, w.String())
	}
}

// TestTimelineByStart: each test's start is its end less its elapsed
// time, counted from the earliest start; lines are in order of start,
// and a test go test did not stamp is left out.
func TestTimelineByStart(t *testing.T) {
	in := `{"Time":"2026-11-27T18:00:30Z","Action":"pass","Package":"p","Test":"TestSerial","Elapsed":30}` + "\n" +
		`{"Time":"2026-11-27T18:02:00Z","Action":"pass","Package":"p","Test":"TestLong","Elapsed":80}` + "\n" +
		`{"Time":"2026-11-27T18:01:00Z","Action":"fail","Package":"p","Test":"TestShort","Elapsed":20.5}` + "\n" +
		`{"Action":"pass","Package":"q","Test":"TestUnstamped","Elapsed":1}` + "\n"
	_, timed := summarize(strings.NewReader(in), io.Discard, false)
	path := filepath.Join(t.TempDir(), "artifacts", "test-timeline.tsv")
	if err := writeTimeline(path, timed); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if want := "0.0\t30.0\tp\tTestSerial\n39.5\t60.0\tp\tTestShort\n40.0\t120.0\tp\tTestLong\n"; string(b) != want {
		t.Errorf("timeline %q, want %q", b, want)
	}
}

// TestWorkSlotWaitNotTimed: an e2e test's wait for a work slot comes
// before it starts, as go test's wait for a -parallel slot does: it is
// taken off the test's time, and so off its start in the timeline.
func TestWorkSlotWaitNotTimed(t *testing.T) {
	in := `{"Time":"2026-11-27T18:00:00Z","Action":"output","Package":"p","Test":"TestPar","Output":"    slots_test.go:80: waited 1m40s for a work slot\n"}` + "\n" +
		`{"Time":"2026-11-27T18:02:00Z","Action":"pass","Package":"p","Test":"TestPar","Elapsed":120}` + "\n" +
		`{"Time":"2026-11-27T18:02:00Z","Action":"pass","Package":"p","Test":"TestAlone","Elapsed":120}` + "\n"
	var w strings.Builder
	_, timed := summarize(strings.NewReader(in), &w, false)
	if !strings.Contains(w.String(), "  20.0s p TestPar\n") || !strings.Contains(w.String(), " 120.0s p TestAlone\n") {
		t.Errorf("want TestPar timed from its slot (20 s), TestAlone whole:\n%s", w.String())
	}
	path := filepath.Join(t.TempDir(), "test-timeline.tsv")
	if err := writeTimeline(path, timed); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "0.0\t120.0\tp\tTestAlone\n100.0\t120.0\tp\tTestPar\n" {
		t.Errorf("timeline %q", b)
	}
}

// TestMergeKeepsLinesWhole: two streams read at once come out as their
// lines, each whole and in its stream's order, a line longer than the
// reader's buffer included; a file that cannot be read is reported.
func TestMergeKeepsLinesWhole(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", 200<<10)
	var a, b strings.Builder
	for i := range 500 {
		fmt.Fprintf(&a, "a%d %s\n", i, long[:i*400])
		fmt.Fprintf(&b, "b%d\n", i)
	}
	a.WriteString("a-last-without-newline")
	pa, pb := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(pa, []byte(a.String()), 0o600)
	os.WriteFile(pb, []byte(b.String()), 0o600)
	r, errOf := mergeLines([]string{pa, pb})
	out, err := io.ReadAll(r)
	if err != nil || errOf() != nil {
		t.Fatal(err, errOf())
	}
	next := map[byte]int{'a': 0, 'b': 0}
	for _, line := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
		if line == "a-last-without-newline" {
			next['a'] = -1
			continue
		}
		var i int
		var rest string
		fmt.Sscanf(line[1:], "%d", &i)
		if i != next[line[0]] {
			t.Fatalf("line %.20q comes where %c%d was due", line, line[0], next[line[0]])
		}
		if line[0] == 'a' {
			rest = line[len(fmt.Sprintf("a%d ", i)):]
			if rest != long[:i*400] {
				t.Fatalf("line a%d was cut: %d bytes, want %d", i, len(rest), i*400)
			}
		}
		next[line[0]]++
	}
	if next['a'] != -1 || next['b'] != 500 {
		t.Fatalf("lines seen: %v", next)
	}
	r, errOf = mergeLines([]string{filepath.Join(dir, "none")})
	io.ReadAll(r)
	if errOf() == nil {
		t.Fatal("a missing file was not reported")
	}
}
