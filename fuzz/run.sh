#!/usr/bin/env bash
# Runs hotlimit's libFuzzer targets, each for a bounded time, on the STABLE toolchain.
#
#   bash fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 30 s, every target)
#
# * Installs cargo-fuzz (`cargo install cargo-fuzz --locked`) only if `cargo fuzz` is missing.
# * Builds with `--sanitizer none`: cargo-fuzz's default AddressSanitizer needs nightly
#   (`-Zsanitizer`); without it every flag cargo-fuzz passes is stable (see fuzz/README.md).
# * Runs one target at a time, one libFuzzer process (no -jobs/-workers), over a scratch corpus
#   (FIRST dir: libFuzzer writes new inputs there) and the checked-in seeds (second dir, read
#   only). The scratch corpus lives in fuzz/target/scratch-corpus/<target> (git-ignored) and
#   carries over between local runs; FUZZ_SCRATCH=DIR puts it elsewhere.
# * Exits non-zero if any target finds a crash, a panic or a timeout (the input is saved under
#   fuzz/artifacts/<target>/, git-ignored), or if the seed corpus was modified.
# * FUZZ_DEV=1 builds without optimizations (`--dev`): about a third less build time from
#   scratch (the server's targets: 121 s instead of 186), for runs of a few seconds whose
#   point is that the targets build and still hold, not how many inputs they try.
# Full libFuzzer logs: fuzz/target/fuzz-logs/<target>.log.
set -euo pipefail
cd "${FUZZ_DIR:-$(dirname "$0")}"

secs=${1:-30}
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: bash fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== cargo fuzz not found: cargo install cargo-fuzz --locked"
  cargo install cargo-fuzz --locked
fi

if [[ $# -gt 0 ]]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

profile=()
if [[ ${FUZZ_DEV:-0} == 1 ]]; then profile=(--dev); fi
echo "== cargo fuzz build ${profile[*]} --sanitizer none ($(rustc --version))"
cargo fuzz build "${profile[@]}" --sanitizer none

scratch_root=${FUZZ_SCRATCH:-target/scratch-corpus}
mkdir -p target/fuzz-logs
seed_sum() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 -r sha1sum); }

failed=()
summary=()
for t in "${targets[@]}"; do
  seeds=corpus/$t
  scratch=$scratch_root/$t
  log=target/fuzz-logs/$t.log
  mkdir -p "$seeds" "$scratch"
  before=$(seed_sum "$seeds")
  echo
  echo "== $t: ${secs}s over $scratch (scratch) + $seeds (seeds)"
  status=0
  cargo fuzz run "${profile[@]}" --sanitizer none "$t" "$scratch" "$seeds" -- \
    -max_total_time="$secs" -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true)
  if [[ $status -ne 0 ]]; then
    # The panic message, the saved input and cargo fuzz's reproduction command.
    grep -m 1 -A 3 -E 'panicked at|ERROR: libFuzzer' "$log" || tail -n 20 "$log"
    grep -E 'Test unit written|^SUMMARY' "$log" || true
    grep -A 2 'Reproduce with' "$log" || true
    echo "!! $t: FAILED (exit $status); full log: fuzz/$log"
    failed+=("$t")
    summary+=("$t: FAILED (exit $status)")
  else
    echo "$done_line"
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" || true
    summary+=("$t: ok  ${done_line#*DONE }")
  fi
  if [[ "$(seed_sum "$seeds")" != "$before" ]]; then
    echo "!! $t: the seed corpus $seeds was modified"
    failed+=("$t (seeds modified)")
  fi
done

echo
echo "== fuzz summary (${secs}s per target)"
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
