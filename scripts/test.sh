#!/usr/bin/env bash
# Every package's tests and a short run of every fuzz target, as make
# test runs them (after the deps and lint steps): four test runs side by
# side, their JSON events merged line by line into tools/testsummary,
# which prints the results and the summary line and writes
# e2e/artifacts/test-times.tsv and test-timeline.tsv.
#
# - Every package but e2e runs with -race, two packages (building or
#   testing) at a time: with one at a time (-p 1) they ended 9 minutes
#   later than beside e2e in one go test run, and past the e2e package.
#   The fuzz targets run when they have ended (scripts/fuzz.sh, its lines
#   in the summary, a failure a line starting FAIL): as a step before the
#   tests, their build held up every test (161 s with an empty build
#   cache), while the other runs end minutes after the unit tests.
# - The e2e package runs without -race. Its tests drive the deskway
#   binary, which they build without it (e2e/main_test.go), and real
#   peers; -race instrumented only the harness (chromedp, log scanning),
#   whose CPU then competed with the emulated guests. Its test binary is
#   built once (go test -c) and run in three processes, each through
#   test2json as go test -json does: built by each of three go test
#   runs at once, its packages were compiled three times over.
# - The e2e tests that boot emulated guests (GUESTS: those that call
#   guestTest; TestGuestTestsRunApart checks the list) run in a process
#   of their own, from the start. In the e2e run they could start only
#   when its serial tests had ended (at 376 s in a clean-clone run), and
#   they were the run's last (ending at 1,255 s, the other e2e tests at
#   1,157 s); the serial tests mostly wait on timers, and the guests take
#   the cores they leave idle.
# - So do TestXRDP and TestXRDPBeside (XRDP), the two chains of xrdp
#   cases: in the e2e run, as parallel tests, they too waited for all of
#   its serial tests, and were then its last (ending at 1,104 to 1,127 s,
#   each 570 to 670 s of cases one after another), while the xrdp setups
#   they hold sat idle for most of the serial part. The serial tests that
#   drive xrdp (the session host's bench smoke, the gateway node's
#   fault) stay in the e2e run and take both setups' locks, waiting for
#   the case at hand on either: run beside the e2e run's serial tests
#   instead, the gateway fault test lost a client (xfreerdp came back
#   through the farm and read its session's updates, but drew none), as
#   it does in one run in two with two busy loops beside it.
#
# TEST_PARALLEL is the Makefile's (it says why that many).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TEST_PARALLEL=${TEST_PARALLEL:-3}
mkdir -p e2e/artifacts
pipes=$(mktemp -d)
trap 'rm -rf "$pipes"' EXIT
mkfifo "$pipes/unit" "$pipes/e2e" "$pipes/guests" "$pipes/xrdp"
GUESTS='^(TestNetbootBareVM|TestNetbootBenchSmoke|TestNetbootMenu|TestNetbootPersonality|TestNetbootProxyDHCP|TestNetbootRootOverNBD|TestNetbootRootSurvivesServerLoss|TestNetbootSecureBoot|TestNetbootUEFI|TestNetbootUEFIProxyDHCP|TestStreamBootTwoVMs)$'
XRDP='^(TestXRDP|TestXRDPBeside)$'
# Build the summary first: the runs' pipes wait for it to read them.
"$GO" build -o "$pipes/testsummary" ./tools/testsummary
mapfile -t units < <("$GO" list ./... | grep -v '/e2e$')
e2epkg=$("$GO" list ./e2e)

# e2erun FLAGS...: the e2e test binary with FLAGS, its output as go test
# -json's. The first run to get here builds the binary; the others wait
# for it. A build error goes out as go test prints one ("# package"
# first), which the summary counts as a failure.
e2erun() {
  flock "$pipes/e2e.lock" bash -c 'test -x "$1" || { "$2" test -c -o "$1.new" ./e2e/ && mv "$1.new" "$1"; }' _ "$pipes/e2e.test" "$GO" || exit 1
  cd e2e
  exec "$GO" tool test2json -t -p "$e2epkg" "$pipes/e2e.test" -test.v=test2json -test.paniconexit0 \
    -test.timeout 60m -test.parallel "$TEST_PARALLEL" "$@"
}

{
  rc=0
  "$GO" test -race -count=1 -p 2 -parallel "$TEST_PARALLEL" -timeout 60m -json "${units[@]}" || rc=1
  GO=$GO scripts/fuzz.sh || rc=1
  exit $rc
} > "$pipes/unit" 2>&1 &
unit=$!
(e2erun -test.run "$GUESTS") > "$pipes/guests" 2>&1 &
guests=$!
(e2erun -test.run "$XRDP") > "$pipes/xrdp" 2>&1 &
xrdp=$!
(e2erun -test.skip "$GUESTS|$XRDP") > "$pipes/e2e" 2>&1 &
e2e=$!
status=0
"$pipes/testsummary" -times e2e/artifacts/test-times.tsv -timeline e2e/artifacts/test-timeline.tsv \
  "$pipes/unit" "$pipes/e2e" "$pipes/guests" "$pipes/xrdp" || status=$?
for p in "$unit" "$guests" "$xrdp" "$e2e"; do
  wait "$p" || status=1
done
exit "$status"
