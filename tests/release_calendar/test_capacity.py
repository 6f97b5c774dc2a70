"""The capacity formula, the daily floors and the model's JSON form for the Lambda."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from release_calendar import (
    CapacityModel,
    DailyFloor,
    capacity_models_from_json,
    capacity_models_to_json,
)
from tests.release_calendar.seed_models import seed_llm_model


@pytest.mark.parametrize(
    ("multiplier", "instances"),
    [(3.0, 12),   # One Piece: 600 × 3 / 200 × 1.3 = 11.7
     (2.0, 8),    # Jump: 7.8
     (1.8, 8),    # Magazine: 7.02
     (2.5, 10),   # anime season: 9.75
     (1.0, 4)],   # 3.9
)
def test_instances_follow_the_formula(multiplier: float, instances: int) -> None:
    assert seed_llm_model().required_instances(multiplier) == instances


def test_float_noise_does_not_add_an_instance() -> None:
    # 350 × 1.1 / 35 is 11.000000000000002 in floating point: 11 instances, not 12.
    model = CapacityModel(base_invocations_per_min=350, per_instance_invocations_per_min=35,
                          headroom=0.0, min_capacity=1, max_capacity=50, timezone="Asia/Tokyo",
                          off_peak=DailyFloor("off-peak", dt.time(1), 1, 5),
                          business_hours=DailyFloor("business-hours", dt.time(8), 2, 50))
    assert 350 * 1.1 / 35 > 11
    assert model.required_instances(1.1) == 11


def test_result_is_clamped_to_the_target_limits() -> None:
    model = seed_llm_model()
    assert model.instances_needed(10.0) == 39
    assert model.required_instances(10.0) == 20
    assert model.required_instances(0.1) == 2  # below the target's minimum of 2


def test_floor_in_force_wraps_midnight() -> None:
    model = seed_llm_model()
    assert model.floor_at(dt.time(0, 30)).name == "business-hours"  # since 08:00 yesterday
    assert model.floor_at(dt.time(1, 0)).name == "off-peak"
    assert model.floor_at(dt.time(7, 59)).name == "off-peak"
    assert model.floor_at(dt.time(8, 0)).name == "business-hours"
    assert model.floor_at(dt.time(23, 59)).name == "business-hours"


def test_invalid_model_names_every_bad_field() -> None:
    with pytest.raises(ValueError, match="CapacityModel") as caught:
        CapacityModel(base_invocations_per_min=0, per_instance_invocations_per_min=-1,
                      headroom=9, min_capacity=5, max_capacity=3, timezone="Asia/Tokyo",
                      off_peak=DailyFloor("Off Peak", dt.time(1), 2, 6),
                      business_hours=DailyFloor("business-hours", dt.time(1), 4, 20))
    text = str(caught.value)
    for fragment in ("base_invocations_per_min 0", "per_instance_invocations_per_min -1",
                     "headroom 9", "min_capacity 5 / max_capacity 3", "off_peak.name 'Off Peak'",
                     "off_peak.start and business_hours.start are both 01:00"):
        assert fragment in text


def test_floor_outside_the_target_limits_is_refused() -> None:
    with pytest.raises(ValueError, match=r"business_hours min 4 max 30: accepted: 2 <= min"):
        CapacityModel(base_invocations_per_min=600, per_instance_invocations_per_min=200,
                      headroom=0.3, min_capacity=2, max_capacity=20, timezone="Asia/Tokyo",
                      off_peak=DailyFloor("off-peak", dt.time(1), 2, 6),
                      business_hours=DailyFloor("business-hours", dt.time(8), 4, 30))


def test_models_round_trip_through_the_lambda_environment_variable() -> None:
    models = {"llm": seed_llm_model(), "intent": seed_llm_model(max_capacity=8)}
    text = capacity_models_to_json(models)
    assert json.loads(text)["llm"]["off_peak"] == {"name": "off-peak", "start": "01:00",
                                                   "min_capacity": 2, "max_capacity": 6}
    assert capacity_models_from_json(text) == models


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("not json", "CALENDAR_CAPACITY_MODELS: not JSON"),
     ("{}", "non-empty object"),
     ('{"llm": {"headroom": 0.3}}', "CALENDAR_CAPACITY_MODELS.llm: missing"),
     ('{"llm": 3}', "CALENDAR_CAPACITY_MODELS.llm: expected an object")],
)
def test_bad_environment_json_names_the_variable(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match="CALENDAR_CAPACITY_MODELS") as caught:
        capacity_models_from_json(text)
    assert fragment in str(caught.value)


def test_bad_field_in_environment_json_names_target_and_field() -> None:
    data = json.loads(capacity_models_to_json({"llm": seed_llm_model()}))
    data["llm"]["off_peak"]["min_capacity"] = "two"
    with pytest.raises(ValueError, match=r"CALENDAR_CAPACITY_MODELS\.llm\.off_peak\.min_capacity"):
        capacity_models_from_json(json.dumps(data))
