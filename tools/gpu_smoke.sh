#!/usr/bin/env bash
# GPU smoke test of the LLM serving path: our gateway + vLLM 0.33 on a real NVIDIA GPU, on a host
# with or without network (docs/develop.md#the-gpu-smoke-test-on-a-gpu-host).
#
#   make gpu-smoke                                   # online: Qwen/Qwen2.5-0.5B-Instruct
#   MODEL_DIR=/models/m make gpu-smoke               # a local model directory (offline)
#   MODEL_DIR=/models/shape LOAD_FORMAT=dummy ATTENTION_BACKEND=TRITON_ATTN make gpu-smoke
#       # measurement only: random weights from config.json and a tokenizer (no weight files)
#
# Python: $SMOKE_PYTHON when it can import vllm (an offline host's own environment, e.g. the
# ../shared/gpu-host kit's), else a venv it builds with vllm==0.33.0 (needs network). The model:
# $MODEL_DIR (config.json, tokenizer, and weights unless LOAD_FORMAT=dummy), else MODEL_ID from
# the Hub. A rank-8 LoRA adapter is made from config.json's shapes alone (no weights needed) in
# $MODEL_DIR/adapters/smoke unless one is there.
#
# It reports, in this order:
#   1. cold start: seconds from `serve` to /ping 200, each start phase the gateway logged, then
#      COLD_REQUESTS (10) short streamed chats COLD_INTERVAL (1) s apart: status and TTFT each,
#      "N/10 served";
#   2. the smoke checks: a multi-turn conversation, a request routed to the adapter, a streaming
#      request, the KV pool the engine reported against the GPU budget's plan;
#   3. the decode-speed profile (python -m tools.decode_bench: TTFT and TPOT p50/p99 at each of
#      DECODE_BATCH_SIZES in flight) through the gateway, then through vLLM's own OpenAI server on
#      the same engine settings (VLLM_COMPARE=0 skips it), side by side with their ratio.
# DECODE_WRITE=1 also writes the gateway's profile into config/decode_speed.json (DECODE_TABLE)
# under DECODE_KEY, replacing the estimate of that key (never with LOAD_FORMAT=dummy's random
# weights unless DECODE_KEY is given: answers' lengths are random then). To measure
# production's profile, serve its checkpoint with its engine settings and name its key:
#
#   MODEL_DIR=/models/llama-3-8b-instruct-w4a16 ENGINE_MAX_NUM_SEQS=88 ENGINE_QUANTIZATION=compressed-tensors \
#   DECODE_KEY="NVIDIA A10G|llama-3-8b-instruct|w4a16 int4 g128|auto" DECODE_BATCH_SIZES=1,8,16,32,48,64,88 \
#   DECODE_WRITE=1 make gpu-smoke
#
# (the key is `python -m tools.capacity plan --env prod`'s "Decode speed" line).
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
work="${WORK_DIR:-$here/.cache/gpu-smoke}"
model_id="${MODEL_ID:-Qwen/Qwen2.5-0.5B-Instruct}"
port="${PORT:-8080}"
python="${PYTHON:-python3}"

log() { printf '[gpu-smoke] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

command -v nvidia-smi >/dev/null || fail "no nvidia-smi: run this on an NVIDIA GPU host"
driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
log "GPU: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n1), driver $driver"
[ "${driver%%.*}" -ge 580 ] || fail "driver $driver < 580: vLLM 0.33's CUDA 13 build will not run"

mkdir -p "$work"
if [ -n "${SMOKE_PYTHON:-}" ] && "$SMOKE_PYTHON" -c 'import vllm' 2>/dev/null; then
  venv_python="$SMOKE_PYTHON"
  log "using $venv_python (vllm $("$venv_python" -c 'import vllm; print(vllm.__version__)'))"
else
  if [ ! -x "$work/venv/bin/python" ]; then
    log "creating $work/venv (vllm==0.33.0, gateway requirements; needs network)"
    "$python" -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet -r "$here/containers/llm/requirements.txt" huggingface_hub
  fi
  venv_python="$work/venv/bin/python"
fi

# The smoke test's Python steps (tools/gpu_smoke_report.py), in its environment.
report() {
  (cd "$here" && PYTHONPATH="$here:$here/containers/llm" "$venv_python" -c \
    'import sys; from tools.gpu_smoke_report import main; sys.exit(main(sys.argv[1:]))' "$@")
}

model_dir="${MODEL_DIR:-$work/model}"
if [ ! -f "$model_dir/config.json" ]; then
  [ -z "${MODEL_DIR:-}" ] || fail "$model_dir/config.json missing: MODEL_DIR must be a model directory"
  log "downloading $model_id to $model_dir"
  "$venv_python" -c "from huggingface_hub import snapshot_download as d; d('$model_id', local_dir='$model_dir')"
fi
adapter_dir="$model_dir/adapters/smoke"
if [ ! -f "$adapter_dir/adapter_config.json" ]; then
  log "creating a random rank-8 LoRA adapter in $adapter_dir (from config.json's shapes)"
  report adapter "$model_dir" "$adapter_dir"
fi

export PYTHONPATH="$here:$here/containers/llm"
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export GATEWAY_ENGINE=vllm GATEWAY_MODEL_DIR="$model_dir" GATEWAY_SERVED_MODEL_NAME=smoke-base
export GATEWAY_ADAPTERS="smoke=smoke" GATEWAY_ROUTING_TABLE="recommendation=smoke"
export GATEWAY_LOCALE_ROUTES="" GATEWAY_METRICS_ENDPOINT_NAME=gpu-smoke
# Defaults for the small public model; any of them may be given in the environment instead.
export ENGINE_MAX_MODEL_LEN="${ENGINE_MAX_MODEL_LEN:-4096}"
export ENGINE_GPU_MEMORY_UTILIZATION="${ENGINE_GPU_MEMORY_UTILIZATION:-0.80}"
export ENGINE_MAX_NUM_SEQS="${ENGINE_MAX_NUM_SEQS:-32}"
export ENGINE_MAX_NUM_BATCHED_TOKENS="${ENGINE_MAX_NUM_BATCHED_TOKENS:-2048}"
export ENGINE_ENABLE_LORA=true ENGINE_MAX_LORAS=1 ENGINE_MAX_LORA_RANK=8
export ENGINE_DTYPE="${ENGINE_DTYPE:-auto}" ENGINE_QUANTIZATION="${ENGINE_QUANTIZATION:-}"
export ENGINE_KV_CACHE_DTYPE="${ENGINE_KV_CACHE_DTYPE:-auto}"
# Measurement-only engine arguments (docs/gateway.md: a deployed stage refuses dummy weights).
if [ -n "${LOAD_FORMAT:-}" ]; then export ENGINE_LOAD_FORMAT="$LOAD_FORMAT"; fi
if [ -n "${ATTENTION_BACKEND:-}" ]; then export ENGINE_ATTENTION_BACKEND="$ATTENTION_BACKEND"; fi
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
# The gateway's own caps must not hide the engine's batching while measuring.
export GATEWAY_BUCKET_CAPS="S=${ENGINE_MAX_NUM_SEQS},M=${ENGINE_MAX_NUM_SEQS},L=${ENGINE_MAX_NUM_SEQS},XL=${ENGINE_MAX_NUM_SEQS}"

log_file="$work/serve.log"
log "starting serve --engine vllm on :$port (log: $log_file)"
started=$SECONDS
"$venv_python" "$here/containers/llm/serve" --engine vllm --port "$port" >"$log_file" 2>&1 &
server=$!
vllm_server=""
trap 'kill $server $vllm_server 2>/dev/null || true; wait 2>/dev/null || true' EXIT

deadline=$((SECONDS + ${STARTUP_TIMEOUT_S:-900}))
until curl -fsS "http://127.0.0.1:$port/ping" >/dev/null 2>&1; do
  kill -0 "$server" 2>/dev/null || { tail -n 50 "$log_file" >&2; fail "serve exited during start"; }
  [ "$SECONDS" -lt "$deadline" ] || { tail -n 50 "$log_file" >&2; fail "/ping not 200 in time"; }
  sleep 1
done
log "cold start: /ping 200 after $((SECONDS - started)) s; phases: $(grep '"start_phase"' "$log_file" | tr '\n' ' ')"
report cold --url "http://127.0.0.1:$port" --requests "${COLD_REQUESTS:-10}" \
  --interval "${COLD_INTERVAL:-1}" || fail "cold start: a request was not served"

chat() {
  curl -fsS "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -d "$1"
}

log "multi-turn conversation"
reply="$(chat '{"messages":[
  {"role":"system","content":"You are a manga shopping assistant."},
  {"role":"user","content":"I liked Demon Slayer."},
  {"role":"assistant","content":"Great! Do you prefer action or drama?"},
  {"role":"user","content":"Action, please. Recommend two series."}],"max_tokens":64}')"
echo "$reply" | "$venv_python" -c 'import json,sys; r=json.load(sys.stdin); c=r["choices"][0]; assert c["message"]["content"].strip(), r; print(c["finish_reason"], repr(c["message"]["content"][:80]))' \
  || fail "multi-turn reply malformed: $reply"

log "adapter request (model=smoke)"
reply="$(chat '{"model":"smoke","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}')"
echo "$reply" | grep -q '"model":"smoke"' || fail "adapter reply did not come from the adapter: $reply"

log "streaming request"
stream="$(curl -fsSN "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"messages":[{"role":"user","content":"Count to five."}],"max_tokens":32,"stream":true}')"
echo "$stream" | grep -q '^data: \[DONE\]' || fail "stream did not end with [DONE]"
[ "$(echo "$stream" | grep -c '^data: {')" -ge 2 ] || fail "stream had fewer than two chunks"

log "KV pool the engine reported vs the gateway's admission"
grep -E '"(engine_ready|kv_capacity_vs_plan)"' "$log_file" | tail -n 2 >&2 || true

gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
quantization="$("$venv_python" - "$model_dir" <<'PY'
import json, sys
config = json.load(open(f"{sys.argv[1]}/config.json"))
quant = config.get("quantization_config") or {}
print(f"{quant.get('quant_method', 'quantized')} {quant.get('bits', '')}".strip() if quant else
      {"float16": "fp16"}.get(config.get("torch_dtype"), "bf16"))
PY
)"
decode_key="${DECODE_KEY:-$gpu_name|$(basename "${MODEL_DIR:-$model_id}")|$quantization|$ENGINE_KV_CACHE_DTYPE}"
decode_table="${DECODE_TABLE:-$here/config/decode_speed.json}"
bench_args=(--key "$decode_key" --batch-sizes "${DECODE_BATCH_SIZES:-1,4,16,32}"
  --prompt-tokens "${DECODE_PROMPT_TOKENS:-900}" --output-tokens "${DECODE_OUTPUT_TOKENS:-190}")
log "decode speed for $decode_key at batch sizes ${DECODE_BATCH_SIZES:-1,4,16,32}, through the gateway"
(cd "$here" && "$venv_python" -m tools.decode_bench --url "http://127.0.0.1:$port" \
  --target "the gateway" "${bench_args[@]}") > "$work/profile-gateway.json" \
  || fail "decode-speed measurement through the gateway failed"
if [ "${DECODE_WRITE:-0}" = 1 ]; then
  report write --profile "$work/profile-gateway.json" --table "$decode_table" \
    || fail "could not write the profile into $decode_table"
fi
if [ "${VLLM_COMPARE:-1}" = 1 ]; then
  kill "$server"; wait "$server" 2>/dev/null || true
  vllm_port=$((port + 1))
  log "vLLM's own OpenAI server on :$vllm_port, same engine settings (log: $work/vllm.log)"
  mapfile -t vllm_args < <("$venv_python" "$here/containers/llm/serve" --vllm-server-args)
  "$venv_python" -m vllm.entrypoints.openai.api_server --port "$vllm_port" "${vllm_args[@]}" \
    > "$work/vllm.log" 2>&1 &
  vllm_server=$!
  until curl -fsS "http://127.0.0.1:$vllm_port/health" >/dev/null 2>&1; do
    kill -0 "$vllm_server" 2>/dev/null || { tail -n 50 "$work/vllm.log" >&2; fail "vLLM's server exited"; }
    sleep 2
  done
  (cd "$here" && "$venv_python" -m tools.decode_bench --url "http://127.0.0.1:$vllm_port" \
    --target "vLLM's own server" "${bench_args[@]}") > "$work/profile-vllm.json" \
    || fail "decode-speed measurement through vLLM's server failed"
  report compare "$work/profile-gateway.json" "$work/profile-vllm.json"
fi
log "PASS"
