#!/usr/bin/env bash
# Every package's tests, as make test runs them (after the deps, lint and
# fuzz steps): two go test runs side by side, their JSON events merged
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
#   whose CPU then competed with the emulated guests that end the run.
#
# TEST_PARALLEL is the Makefile's (it says why that many).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TEST_PARALLEL=${TEST_PARALLEL:-3}
mkdir -p e2e/artifacts
pipes=$(mktemp -d)
trap 'rm -rf "$pipes"' EXIT
mkfifo "$pipes/unit" "$pipes/e2e"
# Build the summary first: the runs' pipes wait for it to read them.
"$GO" build -o "$pipes/testsummary" ./tools/testsummary
mapfile -t units < <("$GO" list ./... | grep -v '/e2e$')
"$GO" test -race -count=1 -p 2 -parallel "$TEST_PARALLEL" -timeout 60m -json "${units[@]}" > "$pipes/unit" 2>&1 &
unit=$!
"$GO" test -count=1 -parallel "$TEST_PARALLEL" -timeout 60m -json ./e2e/ > "$pipes/e2e" 2>&1 &
e2e=$!
status=0
"$pipes/testsummary" -times e2e/artifacts/test-times.tsv -timeline e2e/artifacts/test-timeline.tsv "$pipes/unit" "$pipes/e2e" || status=$?
wait "$unit" || status=1
wait "$e2e" || status=1
exit "$status"
