"""Scaling simulator: replays traffic traces through a SageMaker variant's scaling policies as
synthesized (target tracking, step scaling, scheduled floors and the release calendar), with a
provisioning delay, and reports dropped requests, seconds over capacity, instance-hours and cost
with and without the calendar. ``python -m tools.scaling_sim --help``; docs/scaling.md.
"""
