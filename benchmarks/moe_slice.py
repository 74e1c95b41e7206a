"""MoE targets (issue 25): the expert MLP's two graph forms, and a Qwen3-Coder-30B-A3B slice.

    python benchmarks/moe_slice.py op                 # one sparse MLP at Qwen3-Coder-30B-A3B
                                                      # dims (128 x 768, top-8, hidden 2048),
                                                      # fp32: gather graph vs onnxruntime's MoE
                                                      # op, T = 1 (decode) and T = 16 (verify),
                                                      # interleaved; exactness
    python benchmarks/moe_slice.py write /tmp/moe-fx  # 4-layer slices in bf16, tensor by
                                                      # tensor: MoE and a dense twin
                                                      # (intermediate 6144 = 8 active experts
                                                      # x 768)
    python benchmarks/moe_slice.py run /tmp/moe-fx    # export both (fp32), plain decode
                                                      # interleaved, verify(k)/decode
    python benchmarks/moe_slice.py run /tmp/moe-fx --precision int4
                                                      # the same with int4 weights (QMoE experts)

No weights are committed: `write` generates them (seeded) one tensor at a time, never a torch model.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
from timing import median_ms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

CODER = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 262144,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.0,
    "shared_expert_intermediate_size": 0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_qk_norm": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
LAYERS = 4


class _RandomCkpt:
    """Checkpoint stand-in for the op benchmark: each named tensor random (seeded by name),
    float32."""

    root = "random"

    def __init__(self, shapes: dict):
        self.shapes = shapes

    def array(self, name, shape=None):
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        return (0.02 * rng.standard_normal(self.shapes[name], np.float32)).astype(np.float32)


def _session(write, ckpt, m, tmp: Path, store, fmt, form: str):
    """One sparse MLP written by export/moe_layers.py (`write`) at WeightFormat `fmt`, as an
    onnxruntime session."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    from dflash_edge.export.graph_builder import MS, GraphBuilder

    g = GraphBuilder(
        "target", store, fmt
    )  # forms of one format share one stored copy of the experts
    g.op("Identity", [write(g, "h", ckpt, "model.layers.0", m)], "y")
    graph = helper.make_graph(
        g.nodes,
        form,
        [helper.make_tensor_value_info("h", 1, [1, "T", m.hidden_size])],
        [helper.make_tensor_value_info("y", 1, [1, "T", m.hidden_size])],
        g.inits,
    )
    onnx.save_model(
        helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
        ),
        str(tmp / f"{form}.onnx"),
    )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(tmp / f"{form}.onnx"), opts, providers=["CPUExecutionProvider"])


def op_bench(reps: int, experts: int, int4: bool = False, accuracy_level: int = 0) -> dict:
    """The gather graph and the MoE op on one sparse MLP, both from export/moe_layers.py, side by
    side (with `int4`: also both forms on int4 experts, QMoE at `accuracy_level`). `rows_stable`:
    each token's row of a T-token call equals that token run alone, bit for bit (what greedy
    decoding needs to stay lossless)."""
    from dflash_edge.export.moe_layers import moe_fused, moe_gather
    from dflash_edge.export.weight_format import WeightFormat
    from dflash_edge.export.weight_store import WeightStore
    from dflash_edge.models.names import moe_tensors
    from dflash_edge.models.spec import MoESpec

    m = MoESpec(2048, experts, 8, 768, True)
    ckpt = _RandomCkpt(moe_tensors("model.layers.0", m))
    tmp = Path(tempfile.mkdtemp(prefix="moe-op-"))
    store = WeightStore(tmp)
    formats = {"": WeightFormat()}
    if int4:
        formats["_int4"] = WeightFormat("int4", accuracy_level=accuracy_level)
    sessions = {
        f"{form}{suffix}": _session(write, ckpt, m, tmp, store, fmt, f"{form}{suffix}")
        for suffix, fmt in formats.items()
        for form, write in (("gather", moe_gather), ("moe_op", moe_fused))
    }
    try:
        return _op_figures(sessions, m, reps, int4, accuracy_level)
    finally:
        del sessions
        shutil.rmtree(tmp, ignore_errors=True)  # GBs of stacked experts


def _op_figures(sessions: dict, m, reps: int, int4: bool, accuracy_level: int) -> dict:
    rng = np.random.default_rng(0)
    report = {
        "experts": m.num_experts,
        "top_k": m.top_k,
        "hidden": m.hidden_size,
        "expert_width": m.intermediate,
        "reps": reps,
        "int4_accuracy_level": accuracy_level if int4 else None,
    }
    for tokens in (1, 4, 16):
        feeds = {"h": rng.standard_normal((1, tokens, m.hidden_size), np.float32)}
        outs = {f: s.run(None, feeds)[0] for f, s in sessions.items()}
        report[f"T{tokens}_max_abs_diff"] = float(np.abs(outs["gather"] - outs["moe_op"]).max())
        if int4:
            forms = np.abs(outs["gather_int4"] - outs["moe_op_int4"]).max()
            report[f"T{tokens}_int4_forms_max_abs_diff"] = float(forms)
            err = np.abs(outs["moe_op_int4"] - outs["moe_op"]).max() / np.abs(outs["moe_op"]).max()
            report[f"T{tokens}_int4_rel_err"] = round(float(err), 4)
        if tokens > 1:
            alone = {
                f: [s.run(None, {"h": feeds["h"][:, t : t + 1]})[0][0, 0] for t in range(tokens)]
                for f, s in sessions.items()
            }
            report[f"T{tokens}_rows_stable"] = {
                f: all(np.array_equal(row, outs[f][0, t]) for t, row in enumerate(rows))
                for f, rows in alone.items()
            }
        ms = {f: [] for f in sessions}
        for _ in range(3):  # interleaved rounds
            for form, s in sessions.items():
                ms[form].append(median_ms(lambda: s.run(None, feeds), reps))
        for form in sessions:
            report[f"T{tokens}_{form}_ms"] = round(statistics.median(ms[form]), 3)
    return report


def _hf_names(cfg: dict) -> list[tuple[str, tuple]]:
    from dflash_edge.models import family_spec
    from dflash_edge.models.config import TargetConfig
    from dflash_edge.models.names import target_tensors

    tc = TargetConfig.from_dict(cfg)
    return sorted(target_tensors(tc, family_spec(tc)).items())


def write(out: Path, layers: int) -> None:
    """bf16 shards tensor by tensor (tests/published.py's writer) for the MoE slice and its dense
    twin."""
    from published import _write_shards, write_zlab_drafter, zlab_config
    from tiny import add_tiny_tokenizer

    moe = {k: v for k, v in CODER.items() if k != "shared_expert_intermediate_size"}
    moe.update(num_hidden_layers=layers, max_window_layers=layers)
    dense = {
        k: v
        for k, v in moe.items()
        if "expert" not in k
        and k
        not in (
            "decoder_sparse_step",
            "mlp_only_layers",
            "norm_topk_prob",
            "router_aux_loss_coef",
            "output_router_logits",
        )
    }
    dense.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    for name, cfg in (("moe", moe), ("dense", dense)):
        root = out / name
        root.mkdir(parents=True, exist_ok=True)
        (root / "config.json").write_text(json.dumps(cfg, indent=1))
        t = time.perf_counter()
        _write_shards(root, _hf_names(cfg), shards=4 if name == "moe" else 2, seed=0)
        add_tiny_tokenizer(root, cfg["vocab_size"])
        print(
            f"{name}: {sum(p.stat().st_size for p in root.glob('*.safetensors')) / 1e9:.2f} GB in "
            f"{time.perf_counter() - t:.0f} s",
            file=sys.stderr,
        )
    write_zlab_drafter(out / "draft", zlab_config(moe, num_layers=1, with_layer_ids=True))


def run(root: Path, new_tokens: int, rounds: int, precision: str = "fp32") -> dict:
    """Export both slices at `precision` (once), then plain decode side by side and each slice's
    verify(k) / decode."""
    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.runtime import Generator

    bundles = {}
    for name in ("moe", "dense"):
        out = root / (f"bundle-{name}" if precision == "fp32" else f"bundle-{name}-{precision}")
        if not (out / "manifest.json").exists():
            export_bundle(
                ExportOptions(
                    out=out,
                    target=str(root / name),
                    draft=str(root / "draft"),
                    block_size=16,
                    max_context=512,
                    force=True,
                    precision=precision,
                    kv_cache="fp32",
                ),
                progress=False,
            )
        bundles[name] = out
    gens = {name: Generator.load(b, spin=False) for name, b in bundles.items()}
    prompt = [int(x) for x in np.random.default_rng(0).integers(100, 4000, size=32)]
    per_token = {name: [] for name in gens}
    for _ in range(rounds):  # interleaved: moe, dense, moe, dense, ...
        for name, gen in gens.items():
            res = gen.generate_ids(
                prompt, max_new_tokens=new_tokens, draft="none", stop_token_ids=[]
            )
            per_token[name].append(1e3 / res.stats.decode_tokens_per_s)
    report = {name: round(statistics.median(v), 2) for name, v in per_token.items()}
    report = {
        "decode_ms_per_token": report,
        "moe_over_dense": round(report["moe"] / report["dense"], 3),
    }
    report["verify_over_decode"] = {name: _verify_costs(gen, prompt) for name, gen in gens.items()}
    return report


def _verify_costs(gen, prompt, reps: int = 5) -> dict:
    """Median target step time for T = k tokens after the prompt, over T = 1 (the fused graph the
    runtime runs)."""
    gen.generate_ids(prompt, 1, stop_token_ids=[])  # prefill: prompt cached
    target, n = gen.target, len(prompt)
    times = {}
    for k in (1, 2, 4, 8, 16):
        step = target.step(k)
        step["input_ids"][0] = np.random.default_rng(k).integers(100, 4000, size=k)
        times[k] = median_ms(lambda: target.forward(k, n), reps)
    return {f"k{k}": round(t / times[1], 3) for k, t in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("op")
    o.add_argument("--reps", type=int, default=20)
    o.add_argument("--experts", type=int, default=128)
    o.add_argument(
        "--int4", action="store_true", help="also both forms on int4 experts (QMoE; blocks of 32)"
    )
    o.add_argument(
        "--accuracy-level",
        type=int,
        default=0,
        help="QMoE's: 0 fp32 activations, 4 int8 activations",
    )
    w = sub.add_parser("write")
    w.add_argument("out", type=Path)
    w.add_argument("--layers", type=int, default=LAYERS)
    r = sub.add_parser("run")
    r.add_argument("root", type=Path)
    r.add_argument("--new-tokens", type=int, default=32)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument(
        "--precision",
        default="fp32",
        help="the slices' weights: fp32, int8, int4 (export --precision)",
    )
    args = p.parse_args()
    if args.cmd == "op":
        print(
            json.dumps(op_bench(args.reps, args.experts, args.int4, args.accuracy_level), indent=1)
        )
    elif args.cmd == "write":
        write(args.out, args.layers)
    else:
        print(json.dumps(run(args.root, args.new_tokens, args.rounds, args.precision), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
