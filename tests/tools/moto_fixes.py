"""Three gaps of moto 5.2.5's CloudFormation that a real CDK deploy into a moto server meets,
closed for the tests that run the CDK CLI against one (docs/design-decisions.md#moto-limits):

* a stack created or updated through a change set (what ``cdk deploy`` does) gets no outputs:
  ``ChangeSet.apply`` updates the resources but not the output map, so DescribeStacks returns no
  ``Outputs`` — here it rebuilds the output map from the applied template, as ``Stack.update``
  does;
* an ``AWS::KMS::Key`` with ``Tags`` fails to create: CloudFormation's ``Key``/``Value`` tags are
  handed to the KMS backend, which reads ``TagKey``/``TagValue`` — here they are translated (and a
  ``KeyPolicy`` object is passed as the JSON text the backend stores);
* DeleteChangeSet of a name no change set has fails with a server error (``UnboundLocalError``
  in ``delete_change_set``, a 500 the SDK retries and then reports as an unreadable response):
  the CDK CLI removes "the existing change set if it exists" before it deploys to a stack that
  exists, and after a deploy that failed, without catching an error, as CloudFormation answers
  such a call without one — here, as there, nothing is deleted and nothing fails. (One
  ``make test`` run on a loaded machine failed the README's first deploy on it.)

:func:`patched` applies all three for the duration of a ``with`` block (the server runs in this
process, so patching its classes patches what it serves).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


def _apply_with_outputs(original: Any) -> Any:
    def apply(self: Any) -> None:
        original(self)
        self.stack.template = self.template
        self.stack._parse_template()
        self.stack.output_map = self.stack._create_output_map()
    return apply


def _key_with_cfn_tags(original: Any) -> Any:
    def create(cls: Any, resource_name: str, cloudformation_json: Any, account_id: str,
               region_name: str, **kwargs: Any) -> Any:
        properties = dict(cloudformation_json["Properties"])
        properties["Tags"] = [{"TagKey": tag["Key"], "TagValue": tag["Value"]}
                              for tag in properties.get("Tags", [])]
        if isinstance(properties.get("KeyPolicy"), dict):
            properties["KeyPolicy"] = json.dumps(properties["KeyPolicy"])
        return original(cls, resource_name, {**cloudformation_json, "Properties": properties},
                        account_id, region_name, **kwargs)
    return classmethod(create)


def _delete_change_set_if_it_exists(original: Any) -> Any:
    def delete(self: Any, change_set_name: str) -> None:
        if change_set_name in self.change_sets or any(
                change_set.change_set_name == change_set_name
                for change_set in self.change_sets.values()):
            original(self, change_set_name)
    return delete


@contextmanager
def patched() -> Iterator[None]:
    """moto's CloudFormation with the three gaps closed."""
    import moto.cloudformation.models as cloudformation
    import moto.kms.models as kms

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cloudformation.ChangeSet, "apply",
                      _apply_with_outputs(cloudformation.ChangeSet.apply))
        patch.setattr(cloudformation.CloudFormationBackend, "delete_change_set",
                      _delete_change_set_if_it_exists(
                          cloudformation.CloudFormationBackend.delete_change_set))
        patch.setattr(kms.Key, "create_from_cloudformation_json",
                      _key_with_cfn_tags(kms.Key.create_from_cloudformation_json.__func__))  # type: ignore[attr-defined]
        yield
