"""The decode-speed table: the file format, its checks, interpolation, and the shipped estimate."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from capacity_model import (
    DecodePoint,
    DecodeProfile,
    DecodeTableError,
    Latency,
    RooflineInputs,
    estimate_profile,
    parse_decode_table,
)
from stacks.settings import REPO_ROOT

SHIPPED = REPO_ROOT / "config" / "decode_speed.json"


def point(batch: int, ttft: float, tpot: float, status: str = "measured") -> dict[str, Any]:
    return {"batch_size": batch, "ttft_ms": {"p50": ttft, "p99": 2 * ttft},
            "tpot_ms": {"p50": tpot, "p99": 1.1 * tpot}, "status": status, "source": "bench"}


def document(*points: dict[str, Any]) -> dict[str, Any]:
    return {"version": 1, "profiles": [{
        "gpu": "NVIDIA A10G", "model": "m", "quantization": "q", "kv_cache_dtype": "auto",
        "prompt_tokens": 1000, "output_tokens": 200,
        "points": list(points) or [point(1, 100, 10), point(9, 200, 30)]}]}


def parse(data: dict[str, Any]) -> Any:
    return parse_decode_table(json.dumps(data), source="t.json")


def test_interpolates_between_points_and_knows_where_it_ends() -> None:
    profile = parse(document()).lookup("NVIDIA A10G", "m", "q", "auto")
    middle = profile.at(5)
    assert (middle.ttft.p50_ms, middle.tpot.p50_ms) == (150, 20)
    assert middle.tpot.p99_ms == pytest.approx(22)
    assert profile.at(0.5) == profile.points[0]  # below the first point: one request's latency
    assert profile.max_batch_size == 9
    with pytest.raises(DecodeTableError, match=r"batch size 10 is beyond the largest one the "
                                               r"profile covers \(9\); accepted: 1-9"):
        profile.at(10)


def test_a_profile_is_measured_only_when_every_point_is() -> None:
    measured = parse(document()).profiles[0]
    assert measured.status == "measured"
    mixed = parse(document(point(1, 100, 10), point(4, 150, 20, "assumption"))).profiles[0]
    assert mixed.status == "assumption"
    assert mixed.at(2).status == "assumption"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(version=2), "t.json.version: 2 is not accepted; accepted: 1"),
    (lambda d: d["profiles"][0].pop("gpu"), "t.json.profiles[0]: missing ['gpu']"),
    (lambda d: d["profiles"][0].update(colour="red"), "unknown ['colour']"),
    (lambda d: d["profiles"][0].update(prompt_tokens=0),
     "t.json.profiles[0].prompt_tokens: 0 is not accepted; accepted: an integer >= 1"),
    (lambda d: d["profiles"][0]["points"][1].update(batch_size=1),
     "t.json.profiles[0].points: batch sizes [1, 1] are not accepted; accepted: strictly "
     "increasing"),
    (lambda d: d["profiles"][0]["points"][0].update(status="guessed"),
     "points[0].status: 'guessed' is not accepted; accepted: assumption, measured"),
    (lambda d: d["profiles"][0]["points"][0].update(source=""),
     "points[0].source: accepted: a non-empty string saying where the figures come from"),
    (lambda d: d["profiles"][0]["points"][0]["tpot_ms"].update(p99=1),
     "points[0].tpot_ms: p99 1 is below p50 10; accepted: p99 >= p50"),
    (lambda d: d["profiles"][0]["points"][0]["ttft_ms"].update(p50=-3),
     "points[0].ttft_ms.p50: -3 is not accepted; accepted: a number > 0"),
    (lambda d: d["profiles"].append(copy.deepcopy(d["profiles"][0])),
     "two profiles for NVIDIA A10G / m / q / auto"),
])
def test_bad_tables_name_the_place_and_what_is_accepted(edit: Any, message: str) -> None:
    data = document()
    edit(data)
    with pytest.raises(DecodeTableError) as info:
        parse(data)
    assert message in str(info.value)


def test_not_json_and_an_unknown_profile() -> None:
    with pytest.raises(DecodeTableError, match=r"t.json: not JSON"):
        parse_decode_table("{", source="t.json")
    table = parse(document())
    with pytest.raises(DecodeTableError) as info:
        table.lookup("NVIDIA L4", "m", "q", "auto")
    assert "no decode profile for NVIDIA L4 / m / q / auto" in str(info.value)
    assert "the table has: NVIDIA A10G / m / q / auto" in str(info.value)
    assert "tools/gpu_smoke.sh" in str(info.value)


def test_a_measured_profile_replaces_the_estimate_of_the_same_key_and_round_trips() -> None:
    table = parse(document(point(1, 100, 10, "assumption"), point(9, 200, 30, "assumption")))
    measured = DecodeProfile(
        gpu="NVIDIA A10G", model="m", quantization="q", kv_cache_dtype="auto",
        prompt_tokens=900, output_tokens=190,
        points=(DecodePoint(1, Latency(90, 180), Latency(11, 12), "measured", "gpu-smoke"),))
    other = DecodeProfile(gpu="NVIDIA L4", model="m", quantization="q", kv_cache_dtype="auto",
                          prompt_tokens=900, output_tokens=190, points=measured.points)
    updated = table.with_profile(measured).with_profile(other)
    assert len(updated.profiles) == 2
    assert updated.lookup("NVIDIA A10G", "m", "q", "auto").status == "measured"
    again = parse_decode_table(updated.to_json(), source="again")
    assert again.profiles == tuple(sorted(updated.profiles, key=lambda p: p.key))


def test_the_shipped_estimates_are_what_their_stated_inputs_give() -> None:
    """Every profile of config/decode_speed.json that is an estimate records its inputs; the
    roofline recomputed from them gives exactly the points in the file (the file cannot drift
    from the method it claims), and every figure says it is an assumption."""
    table = parse_decode_table(SHIPPED.read_text(encoding="utf-8"), source=str(SHIPPED))
    estimated = [p for p in table.profiles if p.estimated_from]
    assert estimated, "the shipped table holds the A10G estimates until gpu-smoke measures"
    for profile in estimated:
        inputs = RooflineInputs.from_dict(profile.estimated_from)
        again = estimate_profile(gpu=profile.gpu, model=profile.model,
                                 quantization=profile.quantization,
                                 kv_cache_dtype=profile.kv_cache_dtype, inputs=inputs,
                                 batch_sizes=[p.batch_size for p in profile.points])
        assert again.points == profile.points, profile.describe()
        assert all(p.status == "assumption" and "not measured" in p.source
                   for p in profile.points)
        assert (profile.prompt_tokens, profile.output_tokens) == (
            inputs.prompt_tokens, inputs.output_tokens)
