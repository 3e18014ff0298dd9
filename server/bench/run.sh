#!/usr/bin/env bash
# The rate limit service benchmark of BENCHMARKS.md: ShouldRateLimit calls per second and
# latency at 1 and 64 concurrent streams, hotlimit-server beside Limitador, in memory and on
# Redis, alternating servers, two passes. Needs release builds (cargo build --release --bin
# hotlimit-server --example rls_bench), redis-server, and a Limitador binary built from its
# source: LIMITADOR=/path/to/limitador-server. On 2 cores the server runs on CPU 0, the load
# generator and Redis on CPU 1.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LIMITADOR:?set LIMITADOR to a limitador-server binary}"
SECS=${SECS:-10}
PASSES=${PASSES:-2}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
cat > "$tmp/limits.yaml" <<'YAML'
- namespace: bench
  max_value: 1000000000
  seconds: 60
  conditions: []
  variables: ["descriptors[0].user"]
YAML

wait_port() { for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return; sleep 0.05; done; echo "no listener on $1" >&2; exit 1; }

start() { # server backend
    case "$1/$2" in
        hotlimit/memory) taskset -c 0 target/release/hotlimit-server --config bench/bench.yaml --grpc 127.0.0.1:18081 --http 127.0.0.1:18080 --headers off 2>/dev/null & ;;
        hotlimit/redis) taskset -c 0 target/release/hotlimit-server --config bench/bench.yaml --grpc 127.0.0.1:18081 --http 127.0.0.1:18080 --headers off --backend redis --redis-url redis://127.0.0.1:16379/ 2>/dev/null & ;;
        hotlimit/hybrid) taskset -c 0 target/release/hotlimit-server --config bench/bench.yaml --grpc 127.0.0.1:18081 --http 127.0.0.1:18080 --headers off --backend hybrid --redis-url redis://127.0.0.1:16379/ 2>/dev/null & ;;
        limitador/memory) taskset -c 0 "$LIMITADOR" -b 127.0.0.1 -p 18081 -B 127.0.0.1 -P 18080 "$tmp/limits.yaml" memory 2>/dev/null & ;;
        limitador/redis) taskset -c 0 "$LIMITADOR" -b 127.0.0.1 -p 18081 -B 127.0.0.1 -P 18080 "$tmp/limits.yaml" redis redis://127.0.0.1:16379 2>/dev/null & ;;
        limitador/hybrid) taskset -c 0 "$LIMITADOR" -b 127.0.0.1 -p 18081 -B 127.0.0.1 -P 18080 "$tmp/limits.yaml" redis_cached redis://127.0.0.1:16379 2>/dev/null & ;;
    esac
    pid=$!
    wait_port 18081
}

taskset -c 1 redis-server --port 16379 --bind 127.0.0.1 --save "" --appendonly no > /dev/null &
wait_port 16379
for pass in $(seq "$PASSES"); do
    for backend in ${BACKENDS:-memory redis hybrid}; do
        for streams in 1 64; do
            order="hotlimit limitador"; [ $((pass % 2)) = 0 ] && order="limitador hotlimit"
            for server in $order; do
                redis-cli -p 16379 flushall > /dev/null
                start "$server" "$backend"
                printf 'pass=%s backend=%s server=%s ' "$pass" "$backend" "$server"
                taskset -c 1 target/release/examples/rls_bench --target 127.0.0.1:18081 --streams "$streams" --connections $(( streams > 1 ? 4 : 1 )) --secs "$SECS"
                kill "$pid"; wait "$pid" 2>/dev/null || true
            done
        done
    done
done
