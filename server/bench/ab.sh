#!/usr/bin/env bash
# A/B: two hotlimit-server builds on one backend (BACKEND, default hybrid), alternating as
# bench/run.sh does: OLD=/path/to/an/earlier/hotlimit-server (built from another commit with
# its own CARGO_TARGET_DIR) against this tree's release build. Needs the release builds of
# bench/run.sh and redis-server.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OLD:?set OLD to an earlier hotlimit-server binary}"
NEW=target/release/hotlimit-server
PASSES=${PASSES:-4}
wait_port() { for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.05; done; echo "no listener on $1" >&2; exit 1; }
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
taskset -c 1 redis-server --port 16379 --bind 127.0.0.1 --save "" --appendonly no > /dev/null &
wait_port 16379
for pass in $(seq "$PASSES"); do
  for streams in 1 64; do
    order="old new"; [ $((pass % 2)) = 0 ] && order="new old"
    for which in $order; do
      bin=$NEW; [ "$which" = old ] && bin=$OLD
      redis-cli -p 16379 flushall > /dev/null
      taskset -c 0 "$bin" --config bench/bench.yaml --grpc 127.0.0.1:18081 --http 127.0.0.1:18080 --headers off --backend "${BACKEND:-hybrid}" --redis-url redis://127.0.0.1:16379/ 2>/dev/null &
      pid=$!
      wait_port 18081
      printf 'pass=%s build=%s ' "$pass" "$which"
      taskset -c 1 target/release/examples/rls_bench --target 127.0.0.1:18081 --streams "$streams" --connections $(( streams > 1 ? 4 : 1 )) --secs "${SECS:-10}"
      kill "$pid"; wait "$pid" 2>/dev/null || true
    done
  done
done
