"""Compile the DistilBERT intent classifier for Inferentia (inf1, inf2) or CPU, and package it.

``python -m neuron.compile --target inf1|inf2|cpu --model-dir DIR --out DIR`` is the entry point.
The modules beside it are small and mostly pure, so the serving container copies the ones it
shares with the compiler (all but compile, tracing, random_model and cost) without needing
transformers or, at import time, torch or the Neuron SDK:

- :mod:`neuron.targets`    the three targets: runtime module, SDK packages, the image to run in.
- :mod:`neuron.manifest`   manifest.json, the contract between the compiler and the server.
- :mod:`neuron.parity`     compiled-vs-eager logit comparison with a bound.
- :mod:`neuron.latency`    p50/p90/p99 from latency samples.
- :mod:`neuron.model_archive` model.tar.gz in SageMaker's layout, deterministic; safe extraction.
- :mod:`neuron.samples`    the manga queries used for parity, latency and server warmup.
- :mod:`neuron.tokenization`  fixed-shape (batch × 128) tokenization, shared with the server.
- :mod:`neuron.runtime`    importing torch_neuron / torch_neuronx; finding /dev/neuron* devices.
- :mod:`neuron.cost`       the g4dn-vs-inf1 cost comparison from hourly prices.
- :mod:`neuron.tracing`    the only module that touches torch / torch-neuron / torch-neuronx.
- :mod:`neuron.random_model`  a random DistilBERT + WordPiece tokenizer (tests, benchmarks).

This package must stay importable on Python 3.10: the last Inf1 image ships Python 3.10.
"""
