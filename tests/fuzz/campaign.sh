#!/bin/sh
# The long fuzz campaign: builds the libFuzzer targets with clang, ASan and UBSan in their
# own build directory, runs each target (one at a time, at the lowest CPU priority) for a
# number of executions with its dictionary, then merges the grown corpus into the
# checked-in one, keeping only inputs that add coverage (libFuzzer -merge=1), and records
# what it reached.  Not part of CI: CI
# replays tests/fuzz/corpus and tests/fuzz/regressions only.
#
#   tests/fuzz/campaign.sh [--runs N] [--build DIR] [--no-merge] [target...]
#   tests/fuzz/campaign.sh --report [--build DIR]   # the README table from summary.tsv
#
# Defaults: 10 million executions per target, build directory build-fuzz, every target.
# A crash stops that target; its input is left in DIR/campaign/<target>/ (crash-*, leak-*,
# timeout-*, oom-*) and the script exits 1 after the other targets ran.  The summary
# (executions, edges, features, corpus files) goes to DIR/campaign/summary.tsv.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
runs=10000000
build="$src/build-fuzz"
merge=1
report=0
while [ $# -gt 0 ]; do
  case "$1" in
    --report) report=1; shift ;;
    --runs) runs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-merge) merge=0; shift ;;
    --) shift; break ;;
    -*) echo "usage: $0 [--runs N] [--build DIR] [--no-merge] [target...] | --report" >&2; exit 2 ;;
    *) break ;;
  esac
done

# target -> dictionaries (concatenated: libFuzzer takes one -dict).
dicts_for() {
  case "$1" in
    fuzz_cgroup) echo proc ;;
    fuzz_files) echo "" ;;
    fuzz_http_headers | fuzz_http_body) echo http ;;
    fuzz_http_forwarded) echo forwarded ;;
    fuzz_jsonrpc) echo json ;;
    fuzz_pep440) echo pep440 ;;
    fuzz_pep508) echo "pep508 pep440" ;;
    fuzz_pep723) echo "pep723 toml pep508" ;;
    fuzz_toml) echo toml ;;
    fuzz_profile) echo "toml profile" ;;
    fuzz_script) echo "pep723 toml pep508 pep440" ;;
    *) echo "" ;;
  esac
}
all="fuzz_cgroup fuzz_egress_http fuzz_egress_rules fuzz_files fuzz_http_body fuzz_http_headers
     fuzz_http_forwarded fuzz_jsonrpc fuzz_kframe fuzz_pep440 fuzz_pep508 fuzz_pep723 fuzz_profile fuzz_script fuzz_toml"
[ $# -gt 0 ] && all="$*"

if [ "$report" = 1 ]; then
  # The table of tests/fuzz/README.md: executions from the last campaign of each target
  # (summary.tsv), edges and features of the checked-in corpus as it is now (one pass over
  # it, no mutation).
  echo "| target | executions | edges | features | corpus files | corpus KiB |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  awk -F'\t' 'NR > 1 && $8 == "ok" { last[$1] = $2 } END { for (t in last) print t, last[t] }' \
    "$build/campaign/summary.tsv" | sort | while read -r t execs; do
    line=$("$build/tests/$t" -runs=0 "$here/corpus/$t" 2>&1 | grep -E 'INITED|DONE' | tail -1)
    edges=$(echo "$line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    feats=$(echo "$line" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    files=$(find "$here/corpus/$t" -type f | wc -l)
    kib=$((($(du -sb "$here/corpus/$t" | cut -f1) + 1023) / 1024))
    echo "| \`$t\` | $execs | $edges | $feats | $files | $kib |"
  done
  exit 0
fi

cc=${CC:-clang}
cmake -S "$src" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMPS_FUZZ=ON -DMPS_SANITIZE=ON >/dev/null
# shellcheck disable=SC2086
nice -n 19 cmake --build "$build" -j2 --target $all

out="$build/campaign"
mkdir -p "$out"
summary="$out/summary.tsv"
[ -f "$summary" ] || printf 'target\texecutions\tseconds\tedges\tfeatures\tcorpus_files\tcorpus_bytes\tresult\n' >"$summary"
failed=0
for t in $all; do
  bin="$build/tests/$t"
  [ -x "$bin" ] || { echo "$t: not built" >&2; failed=1; continue; }
  dir="$out/$t"
  rm -rf "$dir"
  mkdir -p "$dir/grown"
  dict=""
  for d in $(dicts_for "$t"); do cat "$here/dict/$d.dict" >>"$dir/dict"; done
  [ -f "$dir/dict" ] && dict="-dict=$dir/dict"
  mkdir -p "$here/corpus/$t"
  echo "== $t: $runs executions" >&2
  start=$(date +%s)
  result=ok
  # The grown corpus is the first directory (libFuzzer writes new inputs there); the
  # checked-in corpus and the regressions seed it.
  # shellcheck disable=SC2086
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:quarantine_size_mb=64 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    nice -n 19 "$bin" -runs="$runs" $dict -print_final_stats=1 -artifact_prefix="$dir/" \
    -timeout=10 -rss_limit_mb=4096 -malloc_limit_mb=2048 "$dir/grown" "$here/corpus/$t" \
    $( [ -d "$here/regressions/$t" ] && echo "$here/regressions/$t" ) >"$dir/log" 2>&1; then
    result=finding
    failed=1
    echo "$t: FINDING, see $dir/log and $dir/crash-*" >&2
  fi
  seconds=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  if [ "$merge" = 1 ] && [ "$result" = ok ]; then
    # Into the checked-in corpus go only the grown inputs that add a feature (-merge=1
    # keeps the first directory's files: the hand-written seeds keep their names).
    nice -n 19 "$bin" -merge=1 "$here/corpus/$t" "$dir/grown" >"$dir/merge.log" 2>&1
  fi
  # Coverage of the corpus as it now stands: one pass over it, no mutation.
  nice -n 19 "$bin" -runs=0 "$here/corpus/$t" >"$dir/cov.log" 2>&1 || true
  line=$(grep -E 'INITED|DONE' "$dir/cov.log" | tail -1)
  edges=$(echo "$line" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
  feats=$(echo "$line" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
  files=$(find "$here/corpus/$t" -type f | wc -l)
  bytes=$(du -sb "$here/corpus/$t" | cut -f1)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "${execs:-?}" "$seconds" "${edges:-?}" "${feats:-?}" \
    "$files" "$bytes" "$result" | tee -a "$summary"
done
exit $failed
