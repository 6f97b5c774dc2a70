"""The moto gap closed in tests/tools/moto_fixes.py that no deploy meets every run: DeleteChangeSet
of a name no change set has (the CDK CLI's clean-up before a deploy to an existing stack, and
after a failed one)."""

from __future__ import annotations

import pytest
from moto.cloudformation.models import CloudFormationBackend

from tests.tools.moto_fixes import patched


def test_deleting_a_change_set_that_does_not_exist_is_not_an_error() -> None:
    """moto 5.2.5 raises (a server error to the CLI; when this first assertion fails, moto fixed
    it and the patch can go); patched, the call deletes nothing and succeeds, as
    CloudFormation's does."""
    # A backend of its own: the process-wide ones keep what an earlier deploy in this worker left
    # (test_deploy_role's runs leave a change set of this very name, which moto then deletes).
    backend = CloudFormationBackend("ap-northeast-1", "123456789012")
    with pytest.raises(UnboundLocalError):
        backend.delete_change_set("cdk-deploy-change-set")
    with patched():
        backend.delete_change_set("cdk-deploy-change-set")
    assert backend.change_sets == {}
