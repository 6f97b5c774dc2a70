#!/usr/bin/env bash
# GPU smoke test of the LLM serving path: our gateway + vLLM 0.33 on a real NVIDIA GPU.
#
# Run it on a GPU host (driver >= 580, CUDA 13 capable; e.g. a g5/g6 EC2 instance with the
# Deep Learning AMI, or inside the vllm/vllm-openai:v0.33.0 image) before the first deploy:
#
#   make gpu-smoke                        # Qwen/Qwen2.5-0.5B-Instruct from the Hugging Face Hub
#   MODEL_DIR=/path/to/model make gpu-smoke   # or tools/gpu_smoke.sh itself
#
# It builds a venv with vllm==0.33.0 and the gateway, downloads a small public instruct model,
# makes a random rank-8 LoRA adapter for it with peft, starts `serve --engine vllm`, waits for
# /ping to turn 200 (warmup included), then checks: a multi-turn conversation, a request routed
# to the adapter, a streaming request, and the gateway's KV report. Exit 0 only if all pass.
#
# Then it measures the decode-speed curve the capacity model sizes the fleet with
# (python -m tools.decode_bench: time to first token and time per output token, p50 and p99, at
# each of DECODE_BATCH_SIZES streamed requests in flight) and writes it into config/decode_speed.json
# (DECODE_TABLE), replacing the estimate of the same key. To measure production's profile, serve
# its checkpoint with its engine settings and name its key:
#
#   MODEL_DIR=/models/llama-3-8b-instruct-w4a16 ENGINE_MAX_NUM_SEQS=88 ENGINE_QUANTIZATION=compressed-tensors \
#   DECODE_KEY="NVIDIA A10G|llama-3-8b-instruct|w4a16 int4 g128|auto" DECODE_BATCH_SIZES=1,8,16,32,48,64,88 \
#   make gpu-smoke
#
# (the key is `python -m tools.capacity plan --env prod`'s "Decode speed" line). DECODE_WRITE=0
# prints the profile instead of writing it.
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
if [ ! -x "$work/venv/bin/python" ]; then
  log "creating $work/venv (vllm==0.33.0, peft, gateway requirements)"
  "$python" -m venv "$work/venv"
  "$work/venv/bin/pip" install --quiet -r "$here/containers/llm/requirements.txt" peft huggingface_hub
fi
venv_python="$work/venv/bin/python"

model_dir="${MODEL_DIR:-$work/model}"
if [ ! -f "$model_dir/config.json" ]; then
  log "downloading $model_id to $model_dir"
  "$venv_python" -c "from huggingface_hub import snapshot_download as d; d('$model_id', local_dir='$model_dir')"
fi
adapter_dir="$model_dir/adapters/smoke"
if [ ! -f "$adapter_dir/adapter_config.json" ]; then
  log "creating a random rank-8 LoRA adapter in $adapter_dir"
  "$venv_python" - "$model_dir" "$adapter_dir" <<'PY'
import sys
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.bfloat16)
config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
get_peft_model(model, config).save_pretrained(sys.argv[2])
PY
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
# The gateway's own caps must not hide the engine's batching while measuring.
export GATEWAY_BUCKET_CAPS="S=${ENGINE_MAX_NUM_SEQS},M=${ENGINE_MAX_NUM_SEQS},L=${ENGINE_MAX_NUM_SEQS},XL=${ENGINE_MAX_NUM_SEQS}"

log_file="$work/serve.log"
log "starting serve --engine vllm on :$port (log: $log_file)"
"$venv_python" "$here/containers/llm/serve" --engine vllm --port "$port" >"$log_file" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT

deadline=$((SECONDS + ${STARTUP_TIMEOUT_S:-900}))
until curl -fsS "http://127.0.0.1:$port/ping" >/dev/null 2>&1; do
  kill -0 "$server" 2>/dev/null || { tail -n 50 "$log_file" >&2; fail "serve exited during start"; }
  [ "$SECONDS" -lt "$deadline" ] || { tail -n 50 "$log_file" >&2; fail "/ping not 200 in time"; }
  sleep 5
done
log "/ping: $(curl -fsS "http://127.0.0.1:$port/ping")"

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
log "decode speed for $decode_key at batch sizes ${DECODE_BATCH_SIZES:-1,4,16,32}"
bench_args=(--url "http://127.0.0.1:$port" --key "$decode_key"
  --batch-sizes "${DECODE_BATCH_SIZES:-1,4,16,32}"
  --prompt-tokens "${DECODE_PROMPT_TOKENS:-900}" --output-tokens "${DECODE_OUTPUT_TOKENS:-190}")
if [ "${DECODE_WRITE:-1}" = 1 ]; then bench_args+=(--write "$decode_table"); fi
(cd "$here" && "$venv_python" -m tools.decode_bench "${bench_args[@]}") \
  || fail "decode-speed measurement failed"
log "PASS"
