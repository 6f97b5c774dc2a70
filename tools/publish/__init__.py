"""`make publish`: check the model artifacts, then upload them to exactly the settings' keys.

    python -m tools.publish --env prod --model DIR --adapters DIR --intent model.tar.gz
    python -m tools.publish --env prod --show-layout

The keys come from :func:`stacks.artifact_layout.artifact_layout` (the function the stacks use);
the checks from :mod:`tools.publish.checks`; the upload from :mod:`tools.publish.upload`.
"""
