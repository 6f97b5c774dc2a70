"""The g4dn-vs-inf1 comparison (docs/design-decisions.md#intent-on-inferentia), recomputed
from prices."""

from __future__ import annotations

import sys
import types

import pytest

from neuron import cost


def test_seed_prices_reproduce_the_seed_saving() -> None:
    # The story: 4 × ml.g4dn.xlarge at $0.736/h → 2 × ml.inf1.xlarge at $0.228/h, "$1,790/month".
    saving = cost.compare_fleets(gpu_price_per_hour_usd=0.736, inferentia_price_per_hour_usd=0.228,
                                 hours_per_month=cost.SEED_HOURS_PER_MONTH)
    assert saving.before.per_hour_usd == pytest.approx(2.944)
    assert saving.after.per_hour_usd == pytest.approx(0.456)
    assert saving.saving_per_hour_usd == pytest.approx(2.488)
    assert saving.saving_per_month_usd == pytest.approx(1791.36)
    assert round(saving.saving_per_month_usd, -1) == 1790
    assert saving.saving_fraction == pytest.approx(0.845, abs=1e-3)
    assert saving.per_instance_price_ratio == pytest.approx(0.31, abs=0.01)  # "70 % less"
    report = saving.report()
    assert "$2.944/h" in report
    assert "$0.456/h" in report
    assert "$1,791/month" in report


@pytest.mark.parametrize("kwargs", [
    {"gpu_price_per_hour_usd": 0.0, "inferentia_price_per_hour_usd": 0.2},
    {"gpu_price_per_hour_usd": 0.7, "inferentia_price_per_hour_usd": float("nan")},
    {"gpu_price_per_hour_usd": 0.7, "inferentia_price_per_hour_usd": 0.2, "gpu_count": 0},
    {"gpu_price_per_hour_usd": 0.7, "inferentia_price_per_hour_usd": 0.2, "hours_per_month": 0},
])
def test_bad_inputs_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        cost.compare_fleets(**kwargs)  # type: ignore[arg-type]


def test_cli_with_the_seed_prices(capsys: pytest.CaptureFixture[str]) -> None:
    assert cost.main(["--gpu-price", "0.736", "--inferentia-price", "0.228",
                      "--hours-per-month", "720"]) == 0
    out = capsys.readouterr().out
    assert "$1,791/month" in out
    assert "given on the command line" in out


def test_cli_reads_the_platform_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    gpu_budget = pytest.importorskip("gpu_budget")
    g4dn = gpu_budget.instance_type("ml.g4dn.xlarge").on_demand_usd_per_hour
    inf1 = gpu_budget.instance_type("ml.inf1.xlarge").on_demand_usd_per_hour
    assert cost.main([]) == 0
    out = capsys.readouterr().out
    expected = cost.compare_fleets(gpu_price_per_hour_usd=g4dn, inferentia_price_per_hour_usd=inf1)
    assert out.startswith(expected.report())
    assert f"${4 * g4dn:.3f}/h" in out
    assert "gpu_budget catalog" in out
    assert expected.saving_per_month_usd > 0, "Inferentia must still be the cheaper fleet"


def test_cli_uses_whatever_the_catalog_says(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    prices = {"ml.g4dn.xlarge": 1.0, "ml.inf1.xlarge": 0.25}
    catalog = types.ModuleType("gpu_budget")
    catalog.instance_type = lambda name: types.SimpleNamespace(  # type: ignore[attr-defined]
        on_demand_usd_per_hour=prices[name], price_basis="list", price_region="test-region")
    monkeypatch.setitem(sys.modules, "gpu_budget", catalog)
    assert cost.main([]) == 0
    out = capsys.readouterr().out
    assert "$4.000/h" in out
    assert "$0.500/h" in out
    assert "$2,555/month" in out
    assert "test-region on-demand" in out


def test_cli_names_an_unknown_instance(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("gpu_budget")
    assert cost.main(["--gpu-instance", "ml.g9.xlarge"]) == 2
    assert "ml.g9.xlarge" in capsys.readouterr().err


def test_cli_without_catalog_or_prices_explains(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "gpu_budget", None)  # import gpu_budget → ImportError
    assert cost.main([]) == 2
    assert "--gpu-price" in capsys.readouterr().err
