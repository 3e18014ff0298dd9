#!/usr/bin/env bash
# The server's libFuzzer targets (config, json_request, matcher), as the library's:
#   bash server/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
# The library's fuzz/run.sh does the work here (cargo-fuzz, --sanitizer none, the seeds kept).
exec env FUZZ_DIR="$(cd "$(dirname "$0")" && pwd)" bash "$(dirname "$0")/../../fuzz/run.sh" "$@"
