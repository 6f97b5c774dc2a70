"""`make preflight`: is the account ready for the Serving stack? (tools/preflight/__main__.py)

The decisions are pure functions in :mod:`tools.preflight.checks`; ``__main__`` reads AWS.
"""
