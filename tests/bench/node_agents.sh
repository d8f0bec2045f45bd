#!/usr/bin/env bash
# The node-agent benchmark of issue 36 ("5,000 nodes cost what 50 do"): for each N, a fresh
# release `clb-state-server` (started as deploy/ starts it, less Kubernetes: no leader election,
# --authentication/--authorization none, plaintext on loopback), the NRP emulator at the load's
# cost model (100 ms + 0.05 ms per address, 4 concurrent mutating calls) and 2 sync workers;
# then `clbctl load --node-agents N` against it, which prints one table row.
#
#   tests/bench/node_agents.sh                      # N = 0 500 2000 5000
#   CLB_BENCH_AGENTS="0 2000" tests/bench/node_agents.sh
#   CLB_BENCH_SERVER_BIN=/work/bench-bin/clb-state-server-aa1d700 tests/bench/node_agents.sh
#   # old beside new, alternating for each N:
#   CLB_BENCH_SERVER_BINS="/work/bench-bin/clb-state-server-aa1d700 $CARGO_TARGET_DIR/release/clb-state-server" \
#       tests/bench/node_agents.sh
#
# Environment: CARGO_TARGET_DIR (default: target/), CLB_BENCH_AGENTS (the N's),
# CLB_BENCH_SERVER_BIN (another server binary, e.g. an older commit's; the workers, the emulator
# and clbctl stay this tree's), CLB_BENCH_SERVER_BINS (several, space-separated: each N is run with
# each in turn, a row each), CLB_BENCH_LOAD_ARGS (the phases and the churn; default below),
# CLB_BENCH_NO_BUILD=1 (use the binaries as they are), CLB_BENCH_OUT (a directory for the logs and
# JSON reports; default a temporary one, kept).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release
SERVER_BIN=${CLB_BENCH_SERVER_BIN:-$BIN/clb-state-server}
SERVER_BINS=${CLB_BENCH_SERVER_BINS:-$SERVER_BIN}
AGENTS=${CLB_BENCH_AGENTS:-0 500 2000 5000}
LOAD_ARGS=${CLB_BENCH_LOAD_ARGS:---idle-phase 20s --writes-phase 20s --churn-per-sec 2000 --duration 20s}
OUT=${CLB_BENCH_OUT:-$(mktemp -d /tmp/clb-node-agents.XXXXXX)}
mkdir -p "$OUT"

if [ "${CLB_BENCH_NO_BUILD:-0}" != 1 ]; then
    (cd "$ROOT" && cargo build --release --locked --bin clb-state-server --bin clb-sync-worker \
        --bin nrp-emulator --bin clbctl)
fi

# 5,000 agents × 2 connections: the server and clbctl each hold ~10,000 sockets.
ulimit -n "$(ulimit -Hn)" || true

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
trap cleanup EXIT

# wait_for FILE PATTERN: the first line of FILE that matches (10 s at most).
wait_for() {
    for _ in $(seq 1 200); do
        if grep -q "$2" "$1" 2>/dev/null; then grep -m1 "$2" "$1"; return 0; fi
        sleep 0.05
    done
    echo "timed out waiting for '$2' in $1" >&2
    cat "$1" >&2
    return 1
}

# addr KEY LINE: the address after KEY= in a log line (ANSI colours stripped).
addr() {
    sed -e 's/\x1b\[[0-9;]*m//g' <<<"$2" | grep -o "$1=[0-9.:]*" | head -1 | cut -d= -f2
}

echo "servers: $SERVER_BINS ($(git -C "$ROOT" rev-parse --short HEAD) tree for the rest); out: $OUT"
echo "start: $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| server | node agents | server RSS after connect / peak | CPU connect+resync | CPU, nobody writing | CPU, agents' writes | CPU, writes + churn | churn p50 / p99 | all connected + resynced | agents resynced > once (failed resync calls) | load at start |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for n in $AGENTS; do
for SERVER_BIN in $SERVER_BINS; do
    tag=$(basename "$SERVER_BIN")
    export RUST_LOG=${RUST_LOG:-info}
    "$BIN/nrp-emulator" --listen 127.0.0.1:0 --latency 100ms --latency-per-address 50us \
        --max-concurrent-mutations 4 --auto-create-gateways >"$OUT/emulator-$tag-$n.log" 2>&1 &
    PIDS+=($!)
    nrp=$(addr addr "$(wait_for "$OUT/emulator-$tag-$n.log" "NRP emulator listening")")
    "$SERVER_BIN" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --server-id bench \
        >"$OUT/server-$tag-$n.log" 2>&1 &
    server_pid=$!
    PIDS+=($server_pid)
    line=$(wait_for "$OUT/server-$tag-$n.log" "listening")
    grpc=$(addr grpc "$line")
    metrics=$(addr metrics "$line")
    for _ in $(seq 1 100); do
        curl -sf "http://$metrics/readyz" >/dev/null && break
        sleep 0.05
    done
    for w in 1 2; do
        "$BIN/clb-sync-worker" --server "http://$grpc" --nrp-endpoint "http://$nrp" \
            --subscription sub --resource-group rg --credential none --capacity 4 \
            --worker-id "bench-worker-$w" >"$OUT/worker-$tag-$n-$w.log" 2>&1 &
        PIDS+=($!)
    done
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    # shellcheck disable=SC2086
    if "$BIN/clbctl" -o json load --state-server "http://$grpc" --server-pid "$server_pid" \
        --node-agents "$n" $LOAD_ARGS >"$OUT/report-$tag-$n.json" 2>"$OUT/clbctl-$tag-$n.log"; then
        :
    else
        echo "clbctl load --node-agents $n failed: see $OUT/clbctl-$n.log" >&2
    fi
    row=$(jq -r '.row // empty' "$OUT/report-$tag-$n.json" 2>/dev/null || true)
    echo "| $tag ${row:-| $n | failed |} $load |"
    cleanup
done
done
echo "end: $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
