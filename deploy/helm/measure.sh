#!/usr/bin/env bash
# measure.sh BACKEND [SECONDS] [CLIENTS]: the real rls under a hostile load, its peak memory and CPU.
#
# Builds rls (from this checkout) and the shared load tool, starts rls with BACKEND (memory or
# redis; redis starts a throwaway redis-server) and the bounds the chart sets by default, and
# drives it for SECONDS (default 90) with CLIENTS workers (default 256) asking about random
# descriptor values out of 50 million, so that almost every request is a key never seen before:
# the memory backend fills to its --memory-max-bytes and starts forgetting, the Redis backend's
# denial cache and Redis itself fill. Every second it samples rls's resident memory and CPU time
# from /proc; it prints the peak RSS (VmHWM), the largest CPU used in any one second and the mean.
#
# Extra rls flags: RLS_FLAGS="--memory-max-bytes=268435456" measure.sh memory (rls's own
# defaults instead of the chart's). BENCH=/path/to/shared/bench (default: shared/bench beside the checkout).
set -eu
backend=${1:?usage: measure.sh memory|redis [SECONDS] [CLIENTS]}; secs=${2:-90}; clients=${3:-256}
root=$(cd "$(dirname "$0")/../.." && pwd); bench=${BENCH:-$root/../shared/bench}
bin=$(mktemp -d); dir=$(mktemp -d); pids=(); rp=
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$rp" ] && redis-cli -p "$rp" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$bin" "$dir"
}
trap cleanup EXIT
[ -d "$bench/rlsload" ] || { echo "measure.sh: no load tool at $bench/rlsload: set BENCH to the shared bench folder" >&2; exit 2; }
for tool in redis-server redis-cli curl bc python3; do
  command -v $tool >/dev/null || { echo "measure.sh: $tool is missing (apt-get install redis-server curl bc python3)" >&2; exit 2; }
done
(cd "$root" && go build -o "$bin/rls" ./cmd/rls)
(cd "$bench" && go build -o "$bin/" ./rlsload)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# A limit high enough that the load is never denied (the worst case for state: every key
# charged and kept) and one low enough that every key is denied after its first request (the
# worst case for the denial cache): half the keys go to each.
cat > "$dir/rules.yaml" <<'R'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
R
# The bounds the chart's values.yaml sets (values.yaml: limits).
chart_flags=(--grpc-max-calls=1024 --max-inflight-bytes=33554432 --memory-max-bytes=67108864 --redis-local-cache-size=16384)
gp=$(port); hp=$(port)
extra=()
if [ "$backend" = redis ]; then
  rp=$(port); redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes >/dev/null
  extra=(--backend=redis --redis-url="redis://127.0.0.1:$rp/0")
fi
# shellcheck disable=SC2086
"$bin/rls" --config "$dir" --grpc-addr "127.0.0.1:$gp" --http-addr "127.0.0.1:$hp" --debug-addr '' --log-level error \
  "${chart_flags[@]}" "${extra[@]}" ${RLS_FLAGS:-} >"$dir/rls.log" 2>&1 & rls=$!; pids+=($rls)
for _ in $(seq 50); do curl -fs "127.0.0.1:$hp/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
tick=$(getconf CLK_TCK)
cpu() { awk '{print $14+$15}' "/proc/$rls/stat"; }
"$bin/rlsload" -addr "127.0.0.1:$gp" -domain bench -key user -keys 50000000 -c $((clients / 2)) -d "${secs}s" -label "$backend-user" > "$dir/load1" & pids+=($!); l1=$!
"$bin/rlsload" -addr "127.0.0.1:$gp" -domain bench -key tight -keys 50000000 -c $((clients / 2)) -d "${secs}s" -label "$backend-tight" > "$dir/load2" & pids+=($!); l2=$!
start=$(cpu); prev=$start; maxc=0; t0=$(date +%s.%N)
while kill -0 $l1 2>/dev/null || kill -0 $l2 2>/dev/null; do
  sleep 1
  [ -e "/proc/$rls/stat" ] || { echo "rls exited:"; cat "$dir/rls.log"; exit 1; }
  now=$(cpu); d=$((now - prev)); prev=$now; [ $d -gt $maxc ] && maxc=$d
  rss=$(awk '/VmRSS/{print $2}' "/proc/$rls/status")
  printf '%4ss rss=%6d MiB cpu=%5.2f cores\n' $(( $(date +%s) - ${t0%.*} )) $((rss / 1024)) "$(echo "$d / $tick" | bc -l)"
done
wait $l1 $l2 || true
t1=$(date +%s.%N)
hwm=$(awk '/VmHWM/{print $2}' "/proc/$rls/status")
cat "$dir/load1" "$dir/load2"
echo "$backend: peak RSS $((hwm / 1024)) MiB; CPU peak $(echo "$maxc / $tick" | bc -l | cut -c1-4) cores in one second, mean $(echo "($prev - $start) / $tick / ($t1 - $t0)" | bc -l | cut -c1-4) cores over ${secs}s"
