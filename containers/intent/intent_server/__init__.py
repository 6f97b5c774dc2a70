"""The intent-classifier server: SageMaker's /ping and /invocations over a compiled DistilBERT.

Thin FastAPI shell (:mod:`intent_server.app`) over small modules:

- :mod:`intent_server.settings`    environment → validated settings.
- :mod:`intent_server.invocation`  request body → texts, or a 4xx with a clear message.
- :mod:`intent_server.batching`    which compiled batch sizes to run a request's texts through.
- :mod:`intent_server.placement`   NeuronCores → model copies, load order, the replica pool.
- :mod:`intent_server.predictions` logits → intent, confidence and every score.
- :mod:`intent_server.metrics`     CloudWatch EMF lines from the metrics contract.
- :mod:`intent_server.classifier`  loads the artifact (torch, tokenizers) and classifies.

Runs on Python 3.10 (the Inf1 image) and 3.11 (the Inf2 and cpu images).
"""
