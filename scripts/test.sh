#!/usr/bin/env bash
# Every package's tests, as make test runs them (after the deps, lint and
# fuzz steps): three go test runs side by side, their JSON events merged
# line by line into tools/testsummary, which prints the results and the
# summary line and writes e2e/artifacts/test-times.tsv and
# test-timeline.tsv.
#
# - Every package but e2e runs with -race, two packages (building or
#   testing) at a time: with one at a time (-p 1) they ended 9 minutes
#   later than beside e2e in one go test run, and past the e2e package.
# - The e2e package runs without -race. Its tests drive the deskway
#   binary, which they build without it (e2e/main_test.go), and real
#   peers; -race instrumented only the harness (chromedp, log scanning),
#   whose CPU then competed with the emulated guests.
# - The e2e tests that boot emulated guests (GUESTS: those that call
#   guestTest; TestGuestTestsRunApart checks the list) run in a go test
#   process of their own, from the start. In the e2e run they could
#   start only when its serial tests had ended (at 376 s in a clean-clone
#   run), and they were the run's last (ending at 1,255 s, the other e2e
#   tests at 1,157 s); the serial tests mostly wait on timers, and the
#   guests take the cores they leave idle.
#
# TEST_PARALLEL is the Makefile's (it says why that many).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TEST_PARALLEL=${TEST_PARALLEL:-3}
mkdir -p e2e/artifacts
pipes=$(mktemp -d)
trap 'rm -rf "$pipes"' EXIT
mkfifo "$pipes/unit" "$pipes/e2e" "$pipes/guests"
GUESTS='^(TestNetbootBareVM|TestNetbootBenchSmoke|TestNetbootMenu|TestNetbootPersonality|TestNetbootProxyDHCP|TestNetbootRootOverNBD|TestNetbootRootSurvivesServerLoss|TestNetbootSecureBoot|TestNetbootUEFI|TestNetbootUEFIProxyDHCP|TestStreamBootTwoVMs)$'
# Build the summary first: the runs' pipes wait for it to read them.
"$GO" build -o "$pipes/testsummary" ./tools/testsummary
mapfile -t units < <("$GO" list ./... | grep -v '/e2e$')
"$GO" test -race -count=1 -p 2 -parallel "$TEST_PARALLEL" -timeout 60m -json "${units[@]}" > "$pipes/unit" 2>&1 &
unit=$!
"$GO" test -count=1 -parallel "$TEST_PARALLEL" -timeout 60m -json -run "$GUESTS" ./e2e/ > "$pipes/guests" 2>&1 &
guests=$!
"$GO" test -count=1 -parallel "$TEST_PARALLEL" -timeout 60m -json -skip "$GUESTS" ./e2e/ > "$pipes/e2e" 2>&1 &
e2e=$!
status=0
"$pipes/testsummary" -times e2e/artifacts/test-times.tsv -timeline e2e/artifacts/test-timeline.tsv "$pipes/unit" "$pipes/e2e" "$pipes/guests" || status=$?
wait "$unit" || status=1
wait "$guests" || status=1
wait "$e2e" || status=1
exit "$status"
