"""Tier 1: device profiles, detection from recorded outputs, the planner, `devices` / `devices plan`
CLI."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from dflash_edge.cli import main
from dflash_edge.devices import detect as det
from dflash_edge.devices.dims import ModelDims, preset
from dflash_edge.devices.errors import DeviceError
from dflash_edge.devices.planner import (
    PlanRequest,
    alpha_for_tau,
    bytes_per_weight,
    memory_plan,
    plan,
    target_step,
    tau_at,
)
from dflash_edge.devices.profiles import PROFILE_DIR, get_profile, load_profile_file, load_profiles
from dflash_edge.models import planner_dims
from dflash_edge.runtime.errors import ModelFormatError

from fixtures_bundle import MAX_CONTEXT

DATA = Path(__file__).parent / "data" / "devices"
MEASURED = {"bandwidth_gb_s": 20.0, "fp32_tflops": 0.06}  # stands in for the numpy measurement
PROFILES = sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def cpu_profile():
    return det.detect_cpu(
        DATA / "cpuinfo" / "amd-epyc-2core",
        DATA / "jetson" / "orin-nx-16gb-jp6" / "meminfo",
        measured=MEASURED,
    ).profile


def profile(name):
    return cpu_profile() if name == "cpu" else get_profile(name)


# --- profiles
# ---------------------------------------------------------------------------------------------


def test_at_least_ten_profiles_each_sourced():
    profiles = load_profiles()
    assert len(profiles) >= 10 and {"cpu", "jetson-agx-thor", "rtx-4090-24gb"} <= set(profiles)
    for p in profiles.values():
        assert (
            p.sources["memory_gb"] and p.sources["bandwidth_gb_s"] and p.sources["compute_tflops"]
        )
        if p.name != "cpu":
            assert p.memory_gb > 0 and p.bandwidth_gb_s > 0 and p.compute_tflops["fp16"] > 0


def test_profile_missing_field_is_named(tmp_path):
    data = json.loads((PROFILE_DIR / "jetson-orin-nx-16gb.json").read_text())
    del data["bandwidth_gb_s"]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(DeviceError, match=r"missing field\(s\) \['bandwidth_gb_s'\]"):
        load_profile_file(tmp_path / "bad.json")


def test_profile_unsourced_figure_is_an_error(tmp_path):
    data = json.loads((PROFILE_DIR / "rtx-3060-12gb.json").read_text())
    del data["sources"]["memory_gb"]
    (tmp_path / "rtx.json").write_text(json.dumps(data))
    with pytest.raises(DeviceError, match="sources lacks"):
        load_profiles(tmp_path)


def test_unknown_device_lists_known_ones():
    with pytest.raises(DeviceError, match="unknown device 'orin-nanoo'.*jetson-orin-nano-8gb"):
        get_profile("orin-nanoo")


# --- detection on recorded outputs
# ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "board, expected",
    [
        ("orin-nano-devkit-jp62", "jetson-orin-nano-super-8gb"),
        ("orin-nano-devkit-jp512", "jetson-orin-nano-8gb"),
        ("orin-nx-16gb-jp6", "jetson-orin-nx-16gb"),
        ("agx-orin-32gb-jp5", "jetson-agx-orin-32gb"),
        ("agx-orin-64gb-jp6", "jetson-agx-orin-64gb"),
        ("agx-thor-jp7", "jetson-agx-thor"),
    ],
)
def test_detect_jetson_from_fixtures(board, expected):
    d = DATA / "jetson" / board
    found = det.detect_jetson(d / "model", d / "nv_tegra_release", d / "meminfo")
    assert found.profile.name == expected
    assert found.evidence["l4t"].startswith(("35.", "36.", "38."))


def test_not_a_jetson_without_device_tree(tmp_path):
    assert det.detect_jetson(tmp_path / "model", tmp_path / "rel", tmp_path / "meminfo") is None


@pytest.mark.parametrize(
    "fixture, expected",
    [
        ("rtx-4090.csv", ["rtx-4090-24gb"]),
        ("rtx-3060.csv", ["rtx-3060-12gb"]),
        ("rtx-4060.csv", ["rtx-4060-8gb"]),
        ("two-gpus.csv", ["rtx-4090-24gb", "rtx-3060-12gb"]),
        ("a100.csv", [None]),
        ("no-devices.txt", []),
    ],
)
def test_detect_gpus_from_nvidia_smi(fixture, expected):
    class NoNvml:  # NVML absent: falls back to nvidia-smi's output
        def nvmlInit(self):
            raise OSError("libnvidia-ml.so.1 not found")

    gpus = det.query_gpus(nvml=NoNvml(), smi_output=(DATA / "nvidia-smi" / fixture).read_text())
    profiles = load_profiles()
    assert [getattr(det.match_gpu(g, profiles), "name", None) for g in gpus] == expected


def test_detect_gpu_through_nvml():
    class Mem:
        total = 12 * 2**30

    class FakeNvml:
        def nvmlInit(self):
            pass

        def nvmlDeviceGetCount(self):
            return 1

        def nvmlDeviceGetHandleByIndex(self, i):
            return i

        def nvmlDeviceGetName(self, h):
            return b"NVIDIA GeForce RTX 3060"

        def nvmlDeviceGetMemoryInfo(self, h):
            return Mem()

    (gpu,) = det.query_gpus(nvml=FakeNvml())
    assert det.match_gpu(gpu, load_profiles()).name == "rtx-3060-12gb"


def test_detect_cpu_fills_the_generic_profile():
    p = cpu_profile()
    assert p.name == "cpu" and p.bandwidth_gb_s == 20.0 and p.compute_tflops["fp32"] == 0.06
    assert 15 < p.memory_gb < 17 and "AMD EPYC" in p.title and "avx512f" in p.title
    arm = det.parse_cpuinfo((DATA / "cpuinfo" / "orin-arm64").read_text())
    assert arm["cores"] == 6 and "asimddp" in arm["isa"]


def test_cpu_measurement_from_step_times():
    ticks = iter(range(10**6))
    m = det.measure_cpu(
        seconds=0.0, clock=lambda: next(ticks) * 1e-3
    )  # every timed repeat takes 1 ms
    # copy: 128 MiB read + 128 MiB written per ms; matmul: 2 * 1024^3 flops per ms
    assert m == {"bandwidth_gb_s": 268.44, "fp32_tflops": 2.1475}


# --- planner
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_each_profile_plans(name):
    t, d, tau = preset("qwen3-8b")
    dev = profile(name)
    prec = "int4" if "int4" in dev.precisions else dev.precisions[0]
    out = plan(PlanRequest(t, d, dev, prec, 2048, tau=tau))
    mem, sp = out["memory"], out["speed"]
    assert mem["total_gb"] == pytest.approx(sum(mem["components_gb"].values()), abs=0.01)
    assert out["fits"] == (mem["total_gb"] <= mem["usable_gb"])
    assert 0 < sp["decode"]["ms"] <= sp["verify"]["ms"]
    assert sp["speedup_vs_tau"][0]["tau"] == 1.0 and sp["speedup_vs_tau"][0]["speedup"] < 1
    speedups = [x["speedup"] for x in sp["speedup_vs_tau"]]
    assert speedups == sorted(speedups)  # more acceptance, more speed
    assert 1 <= sp["recommended_verify_length"] <= 16
    if not out["fits"]:
        assert "usable" in out["why_not"]


def test_done_when_orin_nx_int4_fits_and_nano_fp16_does_not():
    t, d, _ = preset("qwen3-8b")
    assert plan(PlanRequest(t, d, get_profile("jetson-orin-nx-16gb"), "int4", 4096))["fits"]
    out = plan(PlanRequest(t, d, get_profile("jetson-orin-nano-8gb"), "fp16", 4096))
    assert (
        not out["fits"]
        and "target weights 16.38" in out["why_not"]
        and "OS reserve" in out["why_not"]
    )


def test_would_fit_names_precision_and_context():
    t, d, _ = preset("qwen3-4b")
    out = plan(PlanRequest(t, d, get_profile("rtx-4060-8gb"), "fp16", 32768))
    assert not out["fits"]
    alts = {a["precision"]: a["context"] for a in out["would_fit"]}
    assert "fp16" not in alts and 8192 < alts["int4"] < 32768 and alts["int4"] > alts["int8"]
    for prec, ctx in alts.items():  # each is the largest context that fits at its precision
        assert memory_plan(PlanRequest(t, d, get_profile("rtx-4060-8gb"), prec, ctx))["fits"]
        assert not memory_plan(PlanRequest(t, d, get_profile("rtx-4060-8gb"), prec, ctx + 1))[
            "fits"
        ]


def test_quantised_bytes_include_scales_and_zero_points():
    t, d, _ = preset("qwen3-8b")
    req = PlanRequest(t, d, get_profile("rtx-4090-24gb"), "int4", 4096)
    assert bytes_per_weight(req) == pytest.approx(
        0.5 + (2 + 0.5) / 32
    )  # fp16 scale + 4-bit zero point
    assert bytes_per_weight(PlanRequest(t, d, cpu_profile(), "int4")) == pytest.approx(
        0.5 + (4 + 0.5) / 32
    )
    sizes = [
        memory_plan(PlanRequest(t, d, get_profile("jetson-agx-thor"), p, 4096))["components_gb"][
            "target_weights"
        ]
        for p in ("fp16", "int8", "int4")
    ]
    assert sizes[0] > sizes[1] > sizes[2] and sizes[0] == pytest.approx(2 * 8.19, rel=0.02)


def test_kv_cache_grows_with_context():
    t, d, _ = preset("llama-3.1-8b")
    dev = get_profile("jetson-agx-orin-64gb")
    kv = [
        memory_plan(PlanRequest(t, d, dev, "fp16", c))["components_gb"]["kv_cache"]
        for c in (1024, 8192)
    ]
    per_token = 2 * 32 * 8 * 128 * 2 + 2 * 5 * 8 * 128 * 2  # target + drafter, fp16
    assert kv[1] - kv[0] == pytest.approx(7168 * per_token / 1e9, rel=1e-3)


def test_low_bit_tables_are_8_bit_stored_once_and_the_cpu_holds_the_head_per_session():
    """As `export` writes them: an int4 target's embedding and LM head are 8-bit blocks stored once
    for target and drafter, the drafter's own layers fp32. On a CPU the embedding is Gathered from a
    read-only map (not resident), each session prepacks its own head (the drafter holds a second
    copy) and the mapped head is read while it does; a GPU holds each table once."""
    from dflash_edge.devices.planner import (
        class_factors,
        draft_precision_of,
        head_bytes,
        weight_bytes,
    )

    t, d, _ = preset("qwen3-8b")
    cpu, gpu = (
        PlanRequest(t, d, dev, "int4", 4096)
        for dev in (cpu_profile(), get_profile("rtx-4090-24gb"))
    )
    embed, head = head_bytes(cpu)
    assert (
        embed == head == pytest.approx(t.embed_params * (1 + (4 + 1) / 32))
    )  # untied, int8 blocks
    assert (
        draft_precision_of(cpu) == "fp32"
        and draft_precision_of(replace(cpu, precision="fp16")) == "fp16"
    )
    target_w, draft_w = weight_bytes(cpu)
    assert draft_w == pytest.approx(
        (d.layer_params + d.fc_params(t.hidden_size)) * 4
    )  # no copy of the tables
    parts = {dev: memory_plan(r)["components_gb"] for dev, r in (("cpu", cpu), ("gpu", gpu))}
    f = class_factors("cpu")
    low, fp32 = f["weights_residency_low_bit"], f["weights_residency"]
    assert parts["cpu"]["target_weights"] == pytest.approx((target_w - embed) * low / 1e9, abs=1e-3)
    assert parts["cpu"]["drafter_weights"] == pytest.approx(
        (draft_w * fp32 + head * low) / 1e9, abs=1e-3
    )
    assert parts["cpu"]["mapped_head_at_load"] == pytest.approx(head / 1e9, abs=1e-3)
    assert (
        parts["gpu"]["mapped_head_at_load"] == 0
        and parts["gpu"]["target_weights"] > parts["cpu"]["target_weights"]
    )


def test_cpu_int4_budgets_the_int8_cache_it_gets():
    """On a CPU, int4/int8 bundles run the fused target's int8 cache (export's default): 1 byte per
    element, the drafter's cache and fp32 bundles stay float32; a bundle's own cache dtype
    (kv_bytes) overrides the guess."""
    t, d, _ = preset("llama-3.1-8b")
    target_kv, draft_kv = 2 * 32 * 8 * 128, 2 * 5 * 8 * 128  # elements per token
    for prec, want in (
        ("int4", target_kv * 1 + draft_kv * 4),
        ("fp32", (target_kv + draft_kv) * 4),
    ):
        kv = [
            memory_plan(PlanRequest(t, d, cpu_profile(), prec, c))["components_gb"]["kv_cache"]
            for c in (1024, 2048)
        ]
        assert kv[1] - kv[0] == pytest.approx(1024 * want / 1e9, abs=1.5e-3), prec
    req = PlanRequest(t, d, cpu_profile(), "int4", 2048, kv_bytes=4)
    assert memory_plan(req)["kv_dtype_bytes"] == 4


def test_moe_counts_active_params_and_verify_touches_more_experts():
    t, d, _ = preset("qwen3-coder-30b-a3b")
    assert t.total_params / 1e9 == pytest.approx(30.5, abs=0.2) and t.active_params / 1e9 < 3.5
    req = PlanRequest(t, d, get_profile("jetson-agx-thor"), "fp8", 4096)
    one, block = target_step(req, 1), target_step(req, 16)
    assert block["memory_ms"] > 4 * one["memory_ms"]  # 16 tokens route to ~82 experts
    dense_t, dense_d, _ = preset("qwen3-8b")
    dense = PlanRequest(dense_t, dense_d, get_profile("jetson-agx-thor"), "fp8", 4096)
    assert target_step(dense, 16)["memory_ms"] == target_step(dense, 1)["memory_ms"]


def test_alpha_roundtrip():
    for tau in (1.2, 2.5, 6.0):
        assert tau_at(alpha_for_tau(tau, 16), 16) == pytest.approx(tau, rel=1e-6)


def test_bad_plan_inputs():
    t, d, _ = preset("qwen3-8b")
    dev = get_profile("rtx-3060-12gb")
    with pytest.raises(DeviceError, match="does not run fp4; it supports"):
        plan(PlanRequest(t, d, dev, "fp4", 4096))
    with pytest.raises(DeviceError, match="block 32 is outside 2..16"):
        plan(PlanRequest(t, d, dev, "int4", 4096, block=32))
    with pytest.raises(DeviceError, match="context 99999 is outside"):
        plan(PlanRequest(t, d, dev, "int4", 99999))
    with pytest.raises(DeviceError, match="unknown model preset 'qwen9'.*qwen3-8b"):
        preset("qwen9")
    with pytest.raises(ModelFormatError, match="lacks required key.*hidden_size"):
        planner_dims({"model_type": "qwen3", "num_attention_heads": 4})


def test_hf_config_dims_match_preset():
    cfg = {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "max_position_embeddings": 40960,
    }
    assert planner_dims(cfg) == preset("qwen3-8b")[0]
    moe = planner_dims(
        {**cfg, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768}
    )
    assert isinstance(moe, ModelDims) and moe.active_params < moe.total_params


# --- CLI
# --------------------------------------------------------------------------------------------------


def test_devices_json_lists_profiles(capsys, monkeypatch):
    monkeypatch.setattr(det, "measure_cpu", lambda seconds=0.3: MEASURED)
    assert main(["devices", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) >= 10 and sum(r["detected"] for r in rows) == 1
    for r in rows:
        assert r["memory_gb"] and r["bandwidth_gb_s"] and r["sources"]["bandwidth_gb_s"]


def test_devices_table_marks_the_detected_one(capsys, monkeypatch):
    board, real = DATA / "jetson" / "agx-thor-jp7", det.detect_jetson
    monkeypatch.setattr(
        det,
        "detect_jetson",
        lambda profiles: real(
            board / "model", board / "nv_tegra_release", board / "meminfo", profiles
        ),
    )
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("*") and "detected" not in ln] == [
        "jetson-agx-thor"
    ]
    assert "l4t=38.2.0" in lines[-1]


def test_plan_cli_done_when(capsys):
    args = ["devices", "plan", "--model", "qwen3-8b", "--context", "4096", "--json"]
    assert main(args + ["--precision", "int4", "--device", "jetson-orin-nx-16gb"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True
    assert main(args + ["--precision", "fp16", "--device", "jetson-orin-nano-8gb"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and "usable" in out["why_not"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--model", "qwen3-8b", "--device", "nano"],
            "unknown device 'nano'; known devices: cpu, ",
        ),
        (
            ["--model", "gpt5", "--device", "rtx-4090-24gb"],
            "unknown model preset 'gpt5'; known presets: smollm2-135m",
        ),
        (["--device", "rtx-4090-24gb"], "exactly one of BUNDLE, --model"),
    ],
)
def test_plan_cli_bad_input_is_one_line(argv, message, capsys):
    assert main(["devices", "plan", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_plan_from_checkpoint_config(tmp_path, capsys):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
            }
        )
    )
    assert (
        main(
            [
                "devices",
                "plan",
                "--target",
                str(tmp_path),
                "--device",
                "rtx-4090-24gb",
                "--precision",
                "int4",
                "--context",
                "8192",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["target_params"]["total"] == preset("llama-3.1-8b")[0].total_params


# --- plans of a bundle (its manifest) and export --device
# -------------------------------------------------


def test_plan_of_a_bundle_uses_its_manifest(tiny_bundle, capsys, monkeypatch):
    tb = tiny_bundle("qwen3", 8)
    monkeypatch.setattr(det, "measure_cpu", lambda seconds=0.3: MEASURED)
    assert main(["devices", "plan", str(tb.path), "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    man = json.loads((tb.path / "manifest.json").read_text())
    disk = sum(f["bytes"] for g in ("target", "drafter") for f in man["graphs"][g]["files"])
    assert out["memory"]["weights_on_disk_gb"] == pytest.approx(disk / 1e9, abs=1e-3)
    assert out["context"] == MAX_CONTEXT and out["block"] == 8 and out["precision"] == "fp32"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--context", str(MAX_CONTEXT + 1)], "exported for context <="),
        (["--block", "4"], "exported for block 8, not 4"),
        (["--precision", "int4"], "holds fp32 weights, not int4"),
    ],
)
def test_plan_of_a_bundle_rejects_what_it_was_not_exported_for(tiny_bundle, extra, message, capsys):
    tb = tiny_bundle("qwen3", 8)
    assert main(["devices", "plan", str(tb.path), "--device", "rtx-3060-12gb", *extra]) == 2
    assert message in capsys.readouterr().err


def test_export_device_refuses_naming_what_would_fit(tmp_path):
    from dflash_edge.export.device_plan import choose_for_device
    from dflash_edge.export.sources import open_target

    cfg = {
        "model_type": "qwen3",
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,  # Qwen3-4B
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    target = open_target(str(tmp_path))
    with pytest.raises(
        DeviceError, match=r"writes fp32 and none of it fits rtx-4060-8gb.*int4 at context 2048"
    ):
        choose_for_device("rtx-4060-8gb", target, "random", 16, 2048, ("fp32",))
    assert (
        main(
            [
                "export",
                "--out",
                str(tmp_path / "b"),
                "--target",
                str(tmp_path),
                "--draft",
                "random",
                "--device",
                "rtx-4060-8gb",
                "--precision",
                "fp32",
            ]
        )
        == 2
    )  # the CLI hook refuses before exporting
    precision, ctx = choose_for_device(
        "rtx-4060-8gb", target, "random", 16, 2048
    )  # any precision: a quantised one
    assert precision in ("int8", "int4") and ctx == 2048
    assert not (tmp_path / "b").exists()
    # a GPU: the fastest that fits (issue 47), not the most precise; fp32 and fp16 fit at 2048
    assert choose_for_device("rtx-4090-24gb", target, "random", 16, 2048) == ("int4", 2048)
    assert choose_for_device("rtx-4090-24gb", target, "random", 16, 2048, ("fp32", "fp16")) == (
        "fp16",
        2048,
    )
    assert choose_for_device("rtx-4090-24gb", target, "random", 16, 40000, ("fp32", "fp16")) == (
        "fp16",
        40000,
    )  # fp32 does not fit there
    precision, ctx = choose_for_device(
        "rtx-4090-24gb", target, "random", 16, 40000, ("fp32",)
    )  # before a shorter context
    assert precision == "fp32" and 256 <= ctx < 40000


@pytest.mark.parametrize("precision", ["fp32", "int4"])
@pytest.mark.parametrize("layout", ["shared", "legacy"])
def test_bundle_mlp_width_recovered_from_bytes(precision, layout):
    """Bundles whose manifest lacks the MLP widths (before session 13): recovered from the bytes,
    whether the tables are shared (listed in the manifest; the drafter fp32 beside an int4 target)
    or copied into a drafter at the target's precision (older layouts, no tables listed)."""
    from dataclasses import replace

    from dflash_edge.cli.devices import _with_intermediate

    t, d, _ = preset("smollm2-135m")
    req = PlanRequest(t, d, cpu_profile(), precision, 2048)
    bpw = bytes_per_weight(req)
    heads = t.embed_params * (1 if t.tie_word_embeddings else 2)
    target_bytes = (t.layer_params() + heads) * bpw  # what a bundle of this precision holds
    if layout == "shared":
        tables, draft_prec = (0.0, heads * bpw), "fp32"
        draft_bytes = (d.layer_params + d.fc_params(t.hidden_size)) * 4
    else:
        tables, draft_prec = None, precision
        draft_bytes = (d.layer_params + d.fc_params(t.hidden_size) + t.embed_params) * bpw
    unknown = replace(
        req,
        target=replace(t, intermediate_size=0),
        drafter=replace(d, intermediate_size=0),
        target_weight_bytes=target_bytes,
        draft_weight_bytes=draft_bytes,
        table_bytes=tables,
        draft_precision=draft_prec,
    )
    got = _with_intermediate(unknown, t.vocab_size)
    assert (
        abs(got.target.intermediate_size - 1536) <= 1
        and abs(got.drafter.intermediate_size - 1536) <= 1
    )
    with pytest.raises(DeviceError, match="do not match its manifest's dims"):
        _with_intermediate(replace(unknown, target_weight_bytes=1000), t.vocab_size)


# --- hybrid (linear-attention) targets
# ----------------------------------------------------------------------


def test_hybrid_state_is_constant_and_kv_grows_only_with_full_layers():
    """Qwen3.5-4B: 24 Gated DeltaNet layers hold a conv state [8192, 3] and a recurrent state [32,
    128, 128] in fp32 at any context; only the 8 full-attention layers (and the drafter) cache K/V
    per position."""
    t, d, _ = preset("qwen3.5-4b")
    assert (t.full_layers, t.linear.num_layers) == (8, 24)
    assert t.state_bytes(4) == 24 * (8192 * 3 + 32 * 128 * 128) * 4
    dev = get_profile("jetson-agx-orin-64gb")
    mems = [memory_plan(PlanRequest(t, d, dev, "fp16", c))["components_gb"] for c in (1024, 8192)]
    assert (
        mems[0]["linear_state"] == mems[1]["linear_state"] >= 2 * t.state_bytes(4) / 1e9
    )  # started-from + returned
    per_token = 2 * 8 * 4 * 256 * 2 + 2 * 5 * 4 * 256 * 2  # target's 8 full layers + drafter, fp16
    assert mems[1]["kv_cache"] - mems[0]["kv_cache"] == pytest.approx(
        7168 * per_token / 1e9, rel=1e-3
    )
    dense = memory_plan(PlanRequest(replace(t, linear=None), d, dev, "fp16", 1024))["components_gb"]
    assert dense["linear_state"] == 0  # 24 more KV layers instead, at 1024 + 16 slots
    assert dense["kv_cache"] - mems[0]["kv_cache"] == pytest.approx(
        1040 * 2 * 24 * 4 * 256 * 2 / 1e9, abs=1.5e-3
    )


def test_hybrid_decode_grows_with_the_full_layers_kv_only():
    t, d, _ = preset("qwen3.5-9b")
    dense = replace(t, linear=None)  # the same model with every layer full attention

    def growth(dims):
        at = [
            target_step(
                PlanRequest(dims, d, get_profile("jetson-agx-thor"), "int4", 32768, position=p), 1
            )
            for p in (1024, 32768)
        ]
        return at[1]["memory_ms"] - at[0]["memory_ms"]

    assert growth(t) == pytest.approx(growth(dense) * 8 / 32, rel=1e-3)
    out = plan(PlanRequest(t, d, get_profile("jetson-agx-thor"), "int4", 32768))
    assert out["fits"] and out["memory"]["components_gb"]["linear_state"] > 0


def test_hybrid_dims_from_transformers_qwen3_5_config():
    """The 9B preset is transformers' documented Qwen3.5-9B-style default (image-text layout,
    text_config)."""
    configuration_qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.configuration_qwen3_5")
    cfg = configuration_qwen3_5.Qwen3_5Config().to_dict()
    want = preset("qwen3.5-9b")[0]
    context = cfg["text_config"]["max_position_embeddings"]
    assert planner_dims(cfg) == replace(want, max_position_embeddings=context)
    with pytest.raises(DeviceError, match="linear.num_layers=32 must be in 1..31"):
        replace(want, linear={**vars(want.linear), "num_layers": 32})
