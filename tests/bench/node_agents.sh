#!/usr/bin/env bash
# The node-agent benchmark of issue 36 ("5,000 nodes cost what 50 do"): for each N, a fresh
# release `clb-state-server` (started as deploy/ starts it, less Kubernetes: no leader election,
# --authentication/--authorization none, plaintext on loopback unless CLB_BENCH_TLS=1), the NRP
# emulator at the load's cost model (100 ms + 0.05 ms per address, 4 concurrent mutating calls)
# and 2 sync workers; then `clbctl load --node-agents N` against it, which prints one table row.
#
#   tests/bench/node_agents.sh                      # N = 0 500 2000 5000
#   CLB_BENCH_AGENTS="0 2000" tests/bench/node_agents.sh
#   CLB_BENCH_TLS=1 CLB_BENCH_AGENTS="0 5000" tests/bench/node_agents.sh   # TLS, as deploy/ ships
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
# JSON reports; default a temporary one, kept), CLB_BENCH_TLS=1 (the gRPC port over TLS, as
# deploy/'s `--tls-self-managed` serves it: the script makes a CA and a serving certificate for
# 127.0.0.1 with openssl, ECDSA P-256 as state-server/src/pki.rs does, in CLB_BENCH_OUT; the server
# gets `--tls-cert`/`--tls-key`, the workers and clbctl `https://` and `--tls-ca`; default 0:
# plaintext, comparable with the figures before it).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET/release
SERVER_BIN=${CLB_BENCH_SERVER_BIN:-$BIN/clb-state-server}
SERVER_BINS=${CLB_BENCH_SERVER_BINS:-$SERVER_BIN}
AGENTS=${CLB_BENCH_AGENTS:-0 500 2000 5000}
LOAD_ARGS=${CLB_BENCH_LOAD_ARGS:---idle-phase 20s --writes-phase 20s --churn-per-sec 2000 --duration 20s}
OUT=${CLB_BENCH_OUT:-$(mktemp -d /tmp/clb-node-agents.XXXXXX)}
TLS=${CLB_BENCH_TLS:-0}
mkdir -p "$OUT"

# With CLB_BENCH_TLS=1: a CA and a serving certificate for 127.0.0.1 (ECDSA P-256, as the
# self-managed PKI issues them), the flags that use them, and the scheme.
SERVER_TLS_ARGS=()
CLIENT_TLS_ARGS=()
SCHEME=http
TRANSPORT=plaintext
if [ "$TLS" = 1 ]; then
    pki=$OUT/pki
    mkdir -p "$pki"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=clb bench CA" -days 2 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$pki/ca.crt"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/tls.key" 2>/dev/null
    openssl req -new -key "$pki/tls.key" -subj "/CN=127.0.0.1" -out "$pki/tls.csr"
    printf '%s\n' "subjectAltName=IP:127.0.0.1" "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth" >"$pki/ext.cnf"
    openssl x509 -req -in "$pki/tls.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -set_serial 1 \
        -days 1 -extfile "$pki/ext.cnf" -out "$pki/tls.crt" 2>/dev/null
    SERVER_TLS_ARGS=(--tls-cert "$pki/tls.crt" --tls-key "$pki/tls.key")
    CLIENT_TLS_ARGS=(--tls-ca "$pki/ca.crt")
    SCHEME=https
    TRANSPORT=TLS
elif [ "$TLS" != 0 ]; then
    echo "CLB_BENCH_TLS must be 0 or 1, not '$TLS'" >&2
    exit 2
fi

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

echo "servers: $SERVER_BINS ($(git -C "$ROOT" rev-parse --short HEAD) tree for the rest);" \
    "gRPC $TRANSPORT; out: $OUT"
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
        "${SERVER_TLS_ARGS[@]}" >"$OUT/server-$tag-$n.log" 2>&1 &
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
        "$BIN/clb-sync-worker" --server "$SCHEME://$grpc" "${CLIENT_TLS_ARGS[@]}" \
            --nrp-endpoint "http://$nrp" --subscription sub --resource-group rg --credential none --capacity 4 \
            --worker-id "bench-worker-$w" >"$OUT/worker-$tag-$n-$w.log" 2>&1 &
        PIDS+=($!)
    done
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    # shellcheck disable=SC2086
    if "$BIN/clbctl" -o json "${CLIENT_TLS_ARGS[@]}" load --state-server "$SCHEME://$grpc" \
        --server-pid "$server_pid" --node-agents "$n" $LOAD_ARGS >"$OUT/report-$tag-$n.json" 2>"$OUT/clbctl-$tag-$n.log"; then
        :
    else
        echo "clbctl load --node-agents $n failed: see $OUT/clbctl-$tag-$n.log" >&2
    fi
    row=$(jq -r '.row // empty' "$OUT/report-$tag-$n.json" 2>/dev/null || true)
    label=$tag
    [ "$TLS" = 1 ] && label="$tag over TLS"
    echo "| $label ${row:-| $n | failed |} $load |"
    cleanup
done
done
echo "end: $(date -u +%Y-%m-%dT%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
