"""The planner held to published device measurements (devices/published.json, docs/devices.md)."""

from dataclasses import replace
from pathlib import Path

import pytest

from dflash_edge.devices.planner import effective_bandwidth_gb_s
from dflash_edge.devices.profiles import get_profile, load_profiles
from dflash_edge.devices.published import (
    BAND,
    compare,
    format_bytes,
    load_published,
    model_dims,
    render_doc,
    row_request,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "devices.md"


@pytest.fixture(scope="module")
def rows():
    return compare()


def test_doc_table_is_the_planner_today(rows):
    # every printed prediction is recomputed: regenerate with
    # `python -m dflash_edge.devices.published docs/devices.md`
    text = DOC.read_text()
    assert render_doc(text, rows) == text


def test_every_row_within_the_band_or_an_explained_outlier(rows):
    inside = [r["id"] for r in rows if abs(r["error"]) <= BAND]
    outside = [r for r in rows if abs(r["error"]) > BAND]
    assert all(r["outlier"] for r in outside), [r["id"] for r in outside if not r["outlier"]]
    # an outlier that came back inside the band should lose its explanation
    assert not [r["id"] for r in rows if r["outlier"] and abs(r["error"]) <= BAND]
    assert len(inside) >= 8


def test_rows_are_sourced_and_span_the_devices(rows):
    devices = {r["device"] for r in rows}
    for needed in ("agx-orin", "orin-nx", "orin-nano", "thor", "rtx"):
        assert any(needed in d for d in devices), needed
    for r in rows:
        assert r["source"] and r["url"].startswith("https://") and r["date"] and r["sure"]
        assert r["tok_s"] > 0 and r["position"] >= 1
    checks = [r for r in rows if not r["fit"] and not r["outlier"]]
    assert len(checks) >= 8  # rows no constant was fit to


def test_every_fit_device_names_its_runs():
    data = load_published()
    fit_devices = {r["device"] for r in data["rows"] if r["fit"]}
    for p in load_profiles().values():
        if p.decode_bandwidth_gb_s:
            assert "fit" in p.sources["decode_bandwidth_gb_s"] and p.name in fit_devices
            assert p.decode_bandwidth_gb_s <= p.bandwidth_gb_s  # measured never above the peak
    assert fit_devices <= {p.name for p in load_profiles().values() if p.decode_bandwidth_gb_s}


def test_the_issue_pair_on_edge_llm(rows):
    by_id = {r["id"]: r for r in rows}
    for rid in ("edge10-agx-qwen3-8b", "edge10-nx-qwen3-4b", "edge9-agx-qwen3-8b"):
        assert abs(by_id[rid]["error"]) <= BAND


def test_format_bytes_of_trt_int4_awq():
    data = load_published()
    t = model_dims("qwen3-8b", data)
    total, (embed, head) = format_bytes(t, data["formats"]["trt-int4-awq"])
    # 4 bits + an fp16 scale per 128 weights; untied fp16 embedding and head
    assert head == embed == t.embed_params * 2
    assert total == pytest.approx(t.layer_params() * (0.5 + 2 / 128) + 2 * head)


def test_measured_bandwidth_replaces_the_nominal_one():
    data = load_published()
    row = next(r for r in data["rows"] if r["id"] == "edge10-agx-qwen3-8b")
    req = row_request(row, data)
    assert effective_bandwidth_gb_s(req) == req.device.decode_bandwidth_gb_s
    nominal = replace(req, device=replace(get_profile(row["device"]), decode_bandwidth_gb_s=None))
    assert effective_bandwidth_gb_s(nominal) == pytest.approx(req.device.bandwidth_gb_s * 0.8)


def test_a_decode_bandwidth_needs_its_source():
    import json

    from dflash_edge.devices.errors import DeviceError
    from dflash_edge.devices.profiles import PROFILE_DIR, parse_profile

    data = json.loads((PROFILE_DIR / "jetson-orin-nx-16gb.json").read_text())
    del data["sources"]["decode_bandwidth_gb_s"]
    with pytest.raises(DeviceError, match="decode_bandwidth_gb_s needs sources"):
        parse_profile(data, "nx.json")
