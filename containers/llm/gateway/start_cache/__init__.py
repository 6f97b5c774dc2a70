"""The GPU start cache: Triton's and vLLM's compile caches, built once per GPU type and engine
configuration, verified and used at start (docs/develop.md#the-start-cache).

:mod:`~gateway.start_cache.fingerprint` is the pure part (manifest, engine fingerprint, verdict,
tar-member rules); :mod:`~gateway.start_cache.loader` reads, verifies and extracts at start;
:mod:`~gateway.start_cache.cli` builds, packs and verifies one on a GPU host (``make
start-cache``), from a checkout, with the Python the engine runs with:

    python -m gateway.start_cache build --model-dir DIR --out DIR [--gateway-env-file F]
    python -m gateway.start_cache pack --triton DIR [--vllm-cache DIR] --model-dir DIR --out DIR
    python -m gateway.start_cache verify DIR --model-dir DIR

(``containers/llm`` and the repository root on ``PYTHONPATH``, as ``make start-cache`` sets.)
``build`` starts the gateway (``containers/llm/serve``, the deployment's ``GATEWAY_*``/``ENGINE_*``
settings from the environment and the env file) with empty, fresh ``TRITON_CACHE_DIR`` and
``VLLM_CACHE_ROOT``, waits for /ping 200 (its warmup pays every first-use compile), stops it and
packs both folders; ``pack`` packs folders an earlier run filled; both write
``OUT/start-cache.tar.gz`` and ``OUT/start-cache.json`` (this host's GPU and versions, the engine
fingerprint of those settings). ``verify`` prints the verdict the container would reach on this
host and exits 1 on a refusal. The commands live beside the loader, not in ``tools/``: they build
what the container verifies, from the container's own settings and fingerprint.
"""
