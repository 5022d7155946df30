#!/usr/bin/env bash
# Short coverage-guided runs of every fuzz target (each FuzzXxx in the
# module's tests, found here so none is left out), each running FUZZTIME
# inputs seeded from testdata and the corpus cache go test -fuzz itself
# keeps. A crash, or a target that does not run, fails the step and
# prints the target's output (the crasher is written under the package's
# testdata/fuzz, as go test -fuzz does) and a last line starting FAIL,
# which tools/testsummary counts as a failure when make test runs this
# beside the tests.
#
# Each package's fuzzing test binary is built once and run per target
# (go test -fuzz links it again for every target). Packages go through
# FUZZ_JOBS at a time, each building its binary and then running its
# targets one by one with one fuzzing worker, largest first: a target's
# start (the coordinator reading the corpus, starting its worker and
# running every stored input again) leaves a core idle that the other
# job's inputs or link then use. FUZZ_JOBS is the machine's core count.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-10000x}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}
export GO FUZZTIME

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
export FUZZ_BIN=$bin FUZZ_CACHE="$($GO env GOCACHE)/fuzz"
start=$(date +%s)

# fuzzpkg DIR IMPORTPATH: builds DIR's fuzzing binary and runs each of
# its targets; prints a line per target, or the output of the one that
# failed and exits 1.
fuzzpkg() {
  local dir=$1 imp=$2 fz log f t0 el
  fz=$FUZZ_BIN/${imp//\//_}.test
  log=$fz.log
  [ -e "$FUZZ_BIN/failed" ] && return 1 # another job's target failed: stop
  if ! $GO test -c -fuzz '^Fuzz' -o "$fz" "./$dir" >"$log" 2>&1; then
    touch "$FUZZ_BIN/failed"
    printf 'fuzz %s: the fuzzing binary did not build\n%s\n' "$dir" "$(cat "$log")"
    return 1
  fi
  for f in $(cd "$dir" && "$fz" -test.list '^Fuzz' | grep '^Fuzz'); do
    [ -e "$FUZZ_BIN/failed" ] && return 1
    t0=$(date +%s%N)
    if ! (cd "$dir" && "$fz" -test.run '^$' -test.fuzz "^$f\$" -test.fuzztime "$FUZZTIME" -test.parallel 1 \
      -test.timeout 10m -test.paniconexit0 -test.fuzzcachedir "$FUZZ_CACHE/$imp") >"$log" 2>&1; then
      touch "$FUZZ_BIN/failed"
      printf 'fuzz %s %s failed:\n%s\n' "$dir" "$f" "$(cat "$log")"
      return 1
    fi
    el=$(($(date +%s%N) - t0))
    printf 'fuzz %s %s: %d.%d s\n' "$dir" "$f" $((el / 1000000000)) $((el / 100000000 % 10))
    echo "$imp.$f" >>"$FUZZ_BIN/ran"
  done
}
export -f fuzzpkg

# Packages with fuzz targets, longest first so that the last to finish
# is a short one: those that fuzz a server (the gateway, stream and site
# roles, whose inputs cost milliseconds: most of the step), then the
# codecs under internal/proto, those with the most targets first.
pkgs=$(git grep -c '^func Fuzz' -- '*_test.go' |
  awk -F: '{sub("/[^/]*$", "", $1); n[$1] += $2} END {for (d in n) print (d ~ /^internal\/proto\//), n[d], d}' |
  sort -k1,1n -k2,2nr -k3 | awk '{print $3}')
targets=$(git grep -h '^func Fuzz' -- '*_test.go' | wc -l)
mod=$($GO list -m)
for d in $pkgs; do echo "$d $mod/$d"; done |
  xargs -P "$FUZZ_JOBS" -L 1 bash -c 'fuzzpkg "$@"' _ ||
  { echo "FAIL fuzz: a target failed (see above)"; exit 1; }
ran=$(sort -u "$bin/ran" 2>/dev/null | wc -l)
if [ "$ran" != "$targets" ]; then
  echo "FAIL fuzz: $ran of the $targets fuzz targets ran: a FuzzXxx the binaries do not list?"
  exit 1
fi
echo "fuzz: each of $targets targets ran $FUZZTIME inputs without a crash, in $(($(date +%s) - start)) s"
