#!/usr/bin/env python3
"""CDK entry point: one Stage per environment in config/ (default: dev and prod).

Choose environments with `-c environments=prod` (comma-separated). Configuration errors and
cdk-nag findings are printed as short messages, not as tracebacks from inside jsii.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from stacks.synth import synthesize  # set the env var before jsii loads

if __name__ == "__main__":
    sys.exit(synthesize())
