#!/usr/bin/env bash
# GPU smoke test of the LLM serving path: our gateway + vLLM 0.33 on a real NVIDIA GPU.
#
# Run it on a GPU host (driver >= 580, CUDA 13 capable; e.g. a g5/g6 EC2 instance with the
# Deep Learning AMI, or inside the vllm/vllm-openai:v0.33.0 image) before the first deploy:
#
#   scripts/gpu-smoke.sh                    # Qwen/Qwen2.5-0.5B-Instruct from the Hugging Face Hub
#   MODEL_DIR=/path/to/model scripts/gpu-smoke.sh
#
# It builds a venv with vllm==0.33.0 and the gateway, downloads a small public instruct model,
# makes a random rank-8 LoRA adapter for it with peft, starts `serve --engine vllm`, waits for
# /ping to turn 200 (warmup included), then checks: a multi-turn conversation, a request routed
# to the adapter, a streaming request, and the gateway's KV report. Exit 0 only if all pass.
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
export ENGINE_MAX_MODEL_LEN=4096 ENGINE_GPU_MEMORY_UTILIZATION=0.80 ENGINE_MAX_NUM_SEQS=32
export ENGINE_MAX_NUM_BATCHED_TOKENS=2048 ENGINE_ENABLE_LORA=true ENGINE_MAX_LORAS=1
export ENGINE_MAX_LORA_RANK=8 ENGINE_DTYPE=auto ENGINE_QUANTIZATION=""

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
log "PASS"
