"""Start the server: settings, artifact check, preflight, then uvicorn on SageMaker's port.

Exit status: 2 for a bad setting, 3 for an artifact or runtime the server cannot use (a file
that differs from artifact-manifest.json, missing Neuron SDK, wrong target, bad manifest, no
NeuronCore), each with one line on stderr naming the cause. Logs go to stderr; stdout carries
only EMF metric lines.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping, Sequence

EXIT_SETTINGS, EXIT_ARTIFACT = 2, 3
USAGE = "usage: serve [serve]  (SageMaker starts the container as `docker run IMAGE serve`)"


def run(argv: Sequence[str], env: MutableMapping[str, str] | None = None) -> int:
    """Parse argv (``[]`` or ``["serve"]``), check everything, then serve until SIGTERM."""
    if list(argv) not in ([], ["serve"]):
        print(f"error: unexpected arguments {list(argv)}; {USAGE}", file=sys.stderr)
        return EXIT_SETTINGS
    environment: MutableMapping[str, str] = os.environ if env is None else env
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("intent_server")

    from artifact_manifest import ArtifactMismatch, check_model_dir
    from intent_server.classifier import (
        ArtifactError,
        IntentClassifier,
        SdkUnavailableError,
        describe_start,
        preflight,
    )
    from intent_server.settings import SettingsError, load_settings

    try:
        settings = load_settings(environment)
    except SettingsError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_SETTINGS
    try:
        # The unpacked model.tar.gz against the artifact-manifest.json compile.py packed into it
        # (an archive without one, e.g. compiled before it existed, is not checked here).
        verified = check_model_dir(settings.model_dir)
    except ArtifactMismatch as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ARTIFACT
    log.info(verified.describe())
    try:
        checked = preflight(settings, environment)
    except (ArtifactError, SdkUnavailableError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ARTIFACT
    log.info(describe_start(checked, settings))

    import uvicorn

    from intent_server.app import create_app
    from intent_server.metrics import EmfWriter

    app = create_app(
        settings, checked.manifest,
        load_classifier=lambda: IntentClassifier.load(settings, checked, log=log.info),
        emf=EmfWriter(sys.stdout, enabled=settings.metrics_enabled))
    # One process: it owns the NeuronCores and the model copies; requests run in threads.
    # SageMaker sends SIGTERM and SIGKILLs 30 s later: finish in-flight requests within 25 s.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, workers=1,
                            access_log=False, log_level="info", timeout_graceful_shutdown=25,
                            timeout_keep_alive=75)
    uvicorn.Server(config).run()
    return 0


def main() -> None:
    """Console entry point (``python -m intent_server``)."""
    sys.exit(run(sys.argv[1:]))
