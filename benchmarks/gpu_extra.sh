#!/usr/bin/env bash
# The GPU host kit's EXTRA measurement for issues 37 and 38 (../shared/gpu-host/README.md: run
# last, with the gateway's environment exported and PY, PROJECT, MODEL, LOGS, GATEWAY_PORT,
# VLLM_PORT, LEFT set; the kit run with COLD_TRITON=1, so its own gateway start compiled every
# Triton kernel into an empty $TRITON_CACHE_DIR).
#
#   RUN_SECONDS=565 COLD_TRITON=1 VLLM_COMPARE=0 BATCH_SIZES=1 DECODE_ROUNDS=1 COLD_REQUESTS=3 \
#     EXTRA=KIT/project/benchmarks/gpu_extra.sh EXTRA_SECONDS=345 bash KIT/run.sh
#
# 1. start cache: pack that Triton cache as a start-cache artifact (gateway.start_cache pack) and
#    verify it for this host;
# 2. vLLM's own server without a cap: the sustainable rate (a closed loop of 64 =
#    max_num_seqs, 10 s: no admission in the way, so both servers below get the same neutral
#    rate) and a burst of 512 (8x max_num_seqs), the first-come-first-served reference
#    (benchmarks/gpu_surge.py);
# 3. the gateway, started on an empty Triton cache with GATEWAY_START_CACHE=the artifact (time
#    to /ping 200 and three short requests 1 s apart): the surge (2x that rate, 20 s) and the
#    same burst;
# 4. vLLM's own server behind its valve, --max-num-queued-tokens sized as vLLM's docs say
#    (target TTFT x prefill rate: the SLO x the drain rate the gateway measured), the same
#    surge and burst;
# 5. when time is left (EXTRA_START_WITHOUT=1 and 130 s): a gateway start WITHOUT the cache, an
#    empty Triton cache and GATEWAY_START_CACHE=off (every start comes after the kit's, so all
#    have the operating system's file cache warm).
# Results under $LOGS/extra (packed into the kit's tarball); the last line sums them up.
# Knobs (for a dry run on vLLM's CPU build): EXTRA_ADAPTER [smoke] and EXTRA_ADAPTER_DIR
# [$MODEL/adapters/smoke], EXTRA_CLIENTS [64], EXTRA_CLOSED_S [10], EXTRA_DURATION_S [20],
# EXTRA_BURST [512], EXTRA_START_WITHOUT [1]. vLLM's server gets the gateway's ENGINE_* settings.
# A shorter rerun: EXTRA_SERVERS [nocap gateway valve] (which of 2-4 run), EXTRA_RATE (the
# sustainable rate an earlier run measured: the same arrivals), EXTRA_WARM_START=1 (the gateway
# on the kit's warm Triton cache instead of the start cache: the quickest start).
set -uo pipefail
# The kit hands these over in the environment; the gateway refuses a GATEWAY_* it does not know.
export -n GATEWAY_PORT VLLM_PORT LEFT
X=$LOGS/extra
mkdir -p "$X"
SLO_S=2
ADAPTER=${EXTRA_ADAPTER:-smoke}
ADAPTER_DIR=${EXTRA_ADAPTER_DIR:-$MODEL/adapters/smoke}
VLLM_FLAGS=(--max-model-len "$ENGINE_MAX_MODEL_LEN" --max-num-seqs "$ENGINE_MAX_NUM_SEQS"
            --max-num-batched-tokens "$ENGINE_MAX_NUM_BATCHED_TOKENS" --enable-lora
            --max-loras 1 --max-lora-rank "${ENGINE_MAX_LORA_RANK:-8}")
[ -n "${ENGINE_GPU_MEMORY_UTILIZATION:-}" ] && VLLM_FLAGS+=(--gpu-memory-utilization "$ENGINE_GPU_MEMORY_UTILIZATION")
[ -n "${ENGINE_BLOCK_SIZE:-}" ] && VLLM_FLAGS+=(--block-size "$ENGINE_BLOCK_SIZE")
[ "${ENGINE_ENFORCE_EAGER:-false}" = true ] && VLLM_FLAGS+=(--enforce-eager)
say() { printf '[extra %4ss] %s\n' "$SECONDS" "$*" | tee -a "$X/progress.log"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

wait_ping() { # url pid seconds -> 0 when /ping answered 200
  local deadline=$((SECONDS + $3))
  until curl -fsS -m 3 "$1/ping" > /dev/null 2>&1; do
    kill -0 "$2" 2>/dev/null || return 1
    [ "$SECONDS" -lt "$deadline" ] || return 2
    sleep 0.5
  done
}
stop() { kill -TERM -- "-$1" 2>/dev/null; for _ in $(seq 1 30); do kill -0 "$1" 2>/dev/null || return 0; sleep 1; done; kill -KILL -- "-$1" 2>/dev/null; sleep 2; }

start_gateway() { # label, then KEY=VALUE environment: starts it, waits for /ping, times it
  local label=$1; shift
  local t0; t0=$(date +%s%N)
  (exec env "$@" setsid "$PY" "$PROJECT/containers/llm/serve" --engine vllm --port "$GATEWAY_PORT") \
    > "$X/serve-$label.log" 2>&1 &
  GW=$!
  if wait_ping "http://127.0.0.1:$GATEWAY_PORT" "$GW" 240; then
    local healthy_ms; healthy_ms=$(ms_since "$t0")
    "$PY" "$KIT/hostcheck.py" cold-start "http://127.0.0.1:$GATEWAY_PORT" "$X/first-$label.jsonl" \
      --requests 3 --interval 1 --timeout-s 60 > "$X/first-$label.log" 2>&1
    say "start $label: /ping 200 after ${healthy_ms} ms; first requests: $(tail -n 1 "$X/first-$label.log")"
    grep -E '"(start_phase|start_cache|start_cache_refused)"' "$X/serve-$label.log" | cut -c1-400 >> "$X/progress.log"
    echo "$label healthy_ms=$healthy_ms" >> "$X/starts.txt"
    return 0
  fi
  say "start $label: FAILED ($(grep -E 'Error|error' "$X/serve-$label.log" | tail -n 2 | tr '\n' ' ' | cut -c1-300))"
  return 1
}

surge() { # label url path [--rate R]
  local label=$1 url=$2 path=$3; shift 3
  (cd "$PROJECT" && timeout 150 "$PY" benchmarks/gpu_surge.py --url "$url" --path "$path" \
     --model "$ADAPTER" --label "$label" --multiple 2 --duration-s "${EXTRA_DURATION_S:-20}" \
     --burst "${EXTRA_BURST:-512}" --clients "${EXTRA_CLIENTS:-64}" \
     --closed-s "${EXTRA_CLOSED_S:-10}" --slo-s "$SLO_S" --json "$X/surge-$label.json" "$@") > /dev/null 2> "$X/surge-$label.log"
  say "surge $label: $(grep -E '\] (surge|burst|sustainable)' "$X/surge-$label.log" | cut -c1-400 | tr '\n' ' ')"
}

start_vllm() { # label [vLLM flags...]: vLLM's own server on the gateway's engine settings; sets VS
  local label=$1; shift
  (exec setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
     --served-model-name "$GATEWAY_SERVED_MODEL_NAME" --port "$VLLM_PORT" "${VLLM_FLAGS[@]}" \
     --lora-modules "$ADAPTER=$ADAPTER_DIR" "$@") > "$X/vllm-server-$label.log" 2>&1 &
  VS=$!
  local t0; t0=$(date +%s%N)
  until curl -fsS -m 3 "http://127.0.0.1:$VLLM_PORT/health" > /dev/null 2>&1; do
    kill -0 "$VS" 2>/dev/null || break; [ "$(ms_since "$t0")" -lt 180000 ] || break; sleep 1
  done
  if curl -fsS -m 3 "http://127.0.0.1:$VLLM_PORT/health" > /dev/null 2>&1; then
    say "vLLM server $label up after $(ms_since "$t0") ms"; return 0; fi
  say "vLLM server $label FAILED: $(grep -E 'Error' "$X/vllm-server-$label.log" | tail -n 2 | tr '\n' ' ' | cut -c1-300)"
  return 1
}

# 1. the artifact, from the Triton cache the kit's own (cold) gateway start filled
say "triton cache from the kit's start: ${TRITON_CACHE_DIR:-unset} ($(find "${TRITON_CACHE_DIR:-/nonexistent}" -type f 2>/dev/null | wc -l) files)"
(cd "$PROJECT" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}.:containers/llm" "$PY" -m gateway.start_cache pack --triton "$TRITON_CACHE_DIR" \
   --model-dir "$MODEL" --out "$X/start-cache") > "$X/pack.log" 2>&1 || say "pack FAILED: $(tail -n 2 "$X/pack.log" | tr '\n' ' ')"
(cd "$PROJECT" && PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}.:containers/llm" "$PY" -m gateway.start_cache verify "$X/start-cache" --model-dir "$MODEL") \
  > "$X/verify.log" 2>&1; say "verify: rc=$? $(tail -n 1 "$X/verify.log" | cut -c1-300)"
cp "$X/start-cache/start-cache.json" "$X/start-cache.json" 2>/dev/null
ls -la "$X/start-cache" >> "$X/progress.log" 2>&1

# 2. vLLM's server without a cap: the neutral sustainable rate and the first-come-first-served burst
RATE=${EXTRA_RATE:-}
SERVERS=" ${EXTRA_SERVERS:-nocap gateway valve} "
if [[ $SERVERS == *" nocap "* ]] && start_vllm nocap; then
  surge vllm-nocap "http://127.0.0.1:$VLLM_PORT" /v1/chat/completions --duration-s 0
  RATE=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["rate_per_s"])' \
         "$X/surge-vllm-nocap.json" 2>/dev/null || echo "")
fi
[ -n "${VS:-}" ] && stop "$VS"
say "sustainable rate: ${RATE:-not measured (the gateway measures its own)}"

# 3. the gateway, started with the cache (EXTRA_WARM_START=1: on the kit's warm Triton cache)
mkdir -p "$X/triton-with" "$X/triton-without"
if [ "${EXTRA_WARM_START:-0}" = 1 ]; then GW_START=(warm GATEWAY_START_CACHE=off)
else GW_START=(with TRITON_CACHE_DIR="$X/triton-with" GATEWAY_START_CACHE="$X/start-cache"); fi
if [[ $SERVERS == *" gateway "* ]] && start_gateway "${GW_START[@]}"; then
  surge gateway "http://127.0.0.1:$GATEWAY_PORT" /invocations ${RATE:+--rate "$RATE"}
  curl -fsS -m 3 "http://127.0.0.1:$GATEWAY_PORT/ping" > "$X/ping-after-surge.json"
  stop "$GW"
fi
DRAIN=$("$PY" -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["admission"]["drain_tokens_per_s"]))' \
        "$X/ping-after-surge.json" 2>/dev/null || echo 15000)
[ -n "$RATE" ] || RATE=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["rate_per_s"])' \
                         "$X/surge-gateway.json" 2>/dev/null || echo "")

# 4. vLLM's server behind its valve, sized by vLLM's rule from the gateway's measured drain rate
VALVE=$((DRAIN * SLO_S))
if [[ $SERVERS == *" valve "* ]]; then
  say "vLLM valve: --max-num-queued-tokens $VALVE (SLO ${SLO_S} s x drain ${DRAIN} tokens/s)"
  if start_vllm "q$VALVE" --max-num-queued-tokens "$VALVE"; then
    surge "vllm-q$VALVE" "http://127.0.0.1:$VLLM_PORT" /v1/chat/completions ${RATE:+--rate "$RATE"}
  fi
  stop "$VS"
fi

# 5. a start without the cache, when time is left
if [ "${EXTRA_START_WITHOUT:-1}" = 1 ] && [ $((LEFT - SECONDS)) -ge 130 ]; then
  start_gateway without TRITON_CACHE_DIR="$X/triton-without" GATEWAY_START_CACHE=off && stop "$GW"
else say "start without the cache: skipped ($((LEFT - SECONDS)) s left)"; fi

"$PY" - "$X" <<'PY'
import json, pathlib, sys
x = pathlib.Path(sys.argv[1]); parts = []
for line in (x / "starts.txt").read_text().splitlines() if (x / "starts.txt").exists() else []:
    parts.append(line)
def line(name, r):
    near = r.get("near_slo")
    starts = (" started within the SLO / 100 / 200 ms before it "
              + " / ".join(str(n) for n in near["within"]) if near else "")
    return (f"{name} good {r['good']}/{r['sent']} admitted {r['admitted']} p99 {r['ttft_p99_ms']:.0f} ms"
            f" refusal p99 {r['refusal_p99_ms']:.0f} ms{starts}")
for f in sorted(x.glob("surge-*.json")):
    r = json.loads(f.read_text())
    runs = [line(name, r[name]) for name in ("surge", "burst") if name in r]
    parts.append(f"{r['label']} (rate {r['rate_per_s']:.2f}/s): " + ", ".join(runs))
print("; ".join(parts))
PY
