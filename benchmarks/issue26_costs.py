"""Issue 26 costs: sliding-window drafters and the hybrid (Qwen3.5) target graph's rollback.

    python benchmarks/issue26_costs.py window   # draft ms and drafter-cache MB at 64 / 1,024 /
                                                # 2,000 cached positions: a 2-layer drafter
                                                # (hidden 512) all full vs all W=64
    python benchmarks/issue26_costs.py hybrid [--precision int4]
                                                # a Qwen3.5-4B-dimension slice (3 Gated DeltaNet
                                                # + 1 gated full layer, vocab cut to 1,024), fp32,
                                                # 512 cached positions: decode (T=1) and verify
                                                # (T=16) ms of export/hybrid_target.py's graph,
                                                # the bytes of state it returns, the rebuild
                                                # after a partial accept; decode at 64 vs 1,800
                                                # cached positions (what grows with context)

Random weights (seeded), built in a temp folder; medians of interleaved runs on `--threads` threads.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from timing import median_ms, round_robin_ms

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def window(root: Path, threads: int) -> None:
    import torch

    from dflash_edge.export.exporter import ExportOptions, export_bundle
    from dflash_edge.models import load_target
    from dflash_edge.models.drafter import DraftConfig, new_drafter, save_drafter
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.sampling import SamplingParams

    from tiny import add_tiny_tokenizer, hf_model, save_hf

    dims = dict(
        hidden_size=512,
        intermediate_size=1024,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        num_hidden_layers=4,
        max_position_embeddings=4096,
        vocab_size=96,
    )
    ckpt = save_hf(hf_model("qwen3", overrides=dims), root / "target")
    add_tiny_tokenizer(root / "target")
    target_cfg, gens = load_target(ckpt).config, {}
    for name, kinds, w in (
        ("full", ["full_attention"] * 2, None),
        ("window64", ["sliding_attention"] * 2, 64),
    ):
        cfg = DraftConfig.for_target(target_cfg, num_layers=2, block_size=16, mask_token_id=5)
        cfg.layer_types, cfg.sliding_window = kinds, w
        draft = save_drafter(new_drafter(cfg, seed=1), root / f"draft-{name}", dtype=torch.float32)
        out = export_bundle(
            ExportOptions(
                out=root / f"bundle-{name}",
                target=ckpt,
                draft=str(draft),
                block_size=16,
                max_context=2048,
                prefill_chunk=64,
            ),
            progress=False,
        )
        gens[name] = Generator.load(out, threads=threads, spin=False)
    for ctx in (64, 1024, 2000):
        ids = [(7 * i) % 90 + 6 for i in range(ctx)]
        row = {}
        for name, gen in gens.items():
            gen._prefill(
                ids, SamplingParams(), reuse=False
            )  # the target's features for every position

            def draft(gen=gen):
                gen.drafter.kv.pos = ctx - 16  # one block of new context, as after an accept
                gen.drafter.draft(ids[-1], ctx)

            row[name] = round(median_ms(draft, 30, skip=2), 2)
        print(f"context {ctx:>5}: draft ms " + ", ".join(f"{n} {v}" for n, v in row.items()))
    print(
        "drafter cache MB: "
        + ", ".join(f"{n} {g.drafter.kv.nbytes / 1e6:.2f}" for n, g in gens.items())
    )


def hybrid(root: Path, threads: int, precision: str = "fp32") -> None:
    import onnxruntime as ort
    import torch
    import transformers

    from dflash_edge.export.hybrid_target import GRAPH, build_hybrid_target
    from dflash_edge.export.target_job import TargetJob
    from dflash_edge.export.weight_store import WeightStore
    from dflash_edge.models.checkpoint import Checkpoint
    from dflash_edge.models.config import TargetConfig

    text = dict(
        vocab_size=1024,
        hidden_size=2560,
        intermediate_size=9216,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
    )
    torch.manual_seed(0)
    with torch.no_grad():
        transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**text)).save_pretrained(
            root / "ck"
        )
    cfg = TargetConfig.from_json(root / "ck")
    from dflash_edge.export.weight_format import WeightFormat

    fmt = WeightFormat(
        precision, 0 if precision == "fp32" else 8
    )  # as the exporter's weight_formats
    job = TargetJob(
        cfg, Checkpoint.open(root / "ck"), (1,), WeightStore(root), {GRAPH: {"fmt": fmt}}
    )
    path = build_hybrid_target(job, root / "h.onnx")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    lin, hv, cached = len(cfg.linear_layers), cfg.linear_num_value_heads, 512
    rng = np.random.default_rng(0)

    def feeds(num: int, carried: int, kept: int, cached: int = cached) -> dict:
        return {
            "input_ids": np.arange(num)[None] % 1000,
            "logits_from": np.array([0]),
            "start": np.array([cached]),
            "kept": np.array([kept]),
            "past_key": rng.random((cached, 1, 4, 256), np.float32),
            "past_value": rng.random((cached, 1, 4, 256), np.float32),
            "conv_base": np.zeros((lin, cfg.conv_dim, 3), np.float32),
            "rec_base": np.zeros((lin, hv, 128, 128), np.float32),
            "prev_qkv": rng.random((carried, lin, cfg.conv_dim), np.float32),
            "prev_k": rng.random((carried, lin, hv, 128), np.float32),
            "prev_u": rng.random((carried, lin, hv, 128), np.float32),
            "prev_decay": -rng.random((carried, lin, hv), np.float32),
        }

    cases = {
        "decode after a decode": feeds(1, 1, 1),
        "verify after a full accept": feeds(16, 16, 16),
        "verify after a partial accept (7 of 16)": feeds(16, 16, 7),
        "decode at 64 cached positions": feeds(1, 1, 1, 64),
        "decode at 1,800 cached positions": feeds(1, 1, 1, 1800),
    }
    names = [o.name for o in session.get_outputs()]
    state = sum(
        o.nbytes
        for n, o in zip(names, session.run(None, cases["verify after a full accept"]))
        if n in ("conv_start", "rec_start", "qkv", "delta_k", "delta_u", "decay")
    )
    times = round_robin_ms({k: lambda f=f: session.run(None, f) for k, f in cases.items()}, 8)
    for name, ms in times.items():
        print(f"{name}: {ms:.1f} ms")
    print(
        f"state returned by a verify of 16 ({lin} linear layers): {state / 1e6:.1f} MB "
        f"(a recurrent state per token would be {16 * lin * hv * 128 * 128 * 4 / 1e6:.1f} MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("window", "hybrid"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision", default="fp32", choices=("fp32", "int8", "int4"), help="hybrid: the weights"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.what == "window":
            window(Path(tmp), args.threads)
        else:
            hybrid(Path(tmp), args.threads, args.precision)


if __name__ == "__main__":
    main()
