"""make start-cache: build, pack and verify the GPU start cache (docs/develop.md#the-start-cache).

    python -m tools.start_cache build --model-dir DIR --out DIR [--gateway-env-file F]
    python -m tools.start_cache pack --triton DIR [--vllm-cache DIR] --model-dir DIR --out DIR
    python -m tools.start_cache verify DIR --model-dir DIR

``build`` starts the gateway (``containers/llm/serve``, the deployment's ``GATEWAY_*``/``ENGINE_*``
settings from the environment and the env file) with empty, fresh ``TRITON_CACHE_DIR`` and
``VLLM_CACHE_ROOT``, waits for /ping 200 (its warmup pays every first-use compile), stops it and
packs both folders; ``pack`` packs folders an earlier run filled; both write
``OUT/start-cache.tar.gz`` and ``OUT/start-cache.json`` (this host's GPU and versions, the engine
fingerprint of those settings: :mod:`gateway.start_cache.fingerprint`). ``verify`` prints the
verdict the container would reach on this host and exits 1 on a refusal. Run it with the Python
the engine runs with (the versions it records are that Python's packages).
"""
