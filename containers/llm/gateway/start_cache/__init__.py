"""The GPU start cache: Triton's and vLLM's compile caches, built once per GPU type and engine
configuration, verified and used at start (docs/develop.md#the-start-cache).

:mod:`~gateway.start_cache.fingerprint` is the pure part (manifest, engine fingerprint, verdict,
tar-member rules); :mod:`~gateway.start_cache.loader` reads, verifies and extracts at start.
"""
