"""Quantisation settings side by side: top-1 agreement, perplexity, size and plain decode of the TARGET graph.

Each setting re-quantises only target.onnx of an fp32 bundle (the drafter is copied) and is scored on the
same teacher-forced text: held-out prompts + the fp32 target's greedy replies (cached in --cache), as in
`dflash-edge quantize`'s quality report, but with fewer positions and no drafter runs, so many settings fit.

    python benchmarks/quant_sweep.py /work/bundles/fp32 --positions 600 \\
        rtn4=int4 rtn4-head8=int4,embedding_bits:8 hqq4-head8=int4,algorithm:hqq,embedding_bits:8 w8=int8

A setting is NAME=PRECISION[,FIELD:VALUE...] with QuantSettings fields (block_size, accuracy_level,
embedding_bits, symmetric, algorithm).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_setting(spec: str):
    from dflash_edge.quantize.precisions import QuantSettings

    precision, *fields = spec.split(",")
    kwargs = {}
    for field in fields:
        key, value = field.split(":")
        kwargs[key] = value == "True" if key == "symmetric" else value if key == "algorithm" else int(value)
    return precision, QuantSettings(**kwargs)


def replies(ref, positions: int, cache: Path) -> list:
    from dflash_edge.quantize.quality import load_prompts

    texts = json.loads(cache.read_text()) if cache.exists() else []
    prompts = load_prompts(None)
    while sum(len(r) for _, r in texts) < positions and len(texts) < len(prompts):
        ids = ref.encode(prompts[len(texts)])
        texts.append((ids, ref.generate_ids(ids, 128, draft="none").token_ids))
        cache.write_text(json.dumps(texts))
    out, n = [], 0
    for text in texts:
        if n >= positions:
            break
        out.append(text)
        n += len(text[1])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle", help="fp32 bundle")
    ap.add_argument("settings", nargs="+", help="NAME=PRECISION[,FIELD:VALUE...]")
    ap.add_argument("--positions", type=int, default=600)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", default="/tmp/quant-sweep-replies.json", help="fp32 replies (reused across runs)")
    args = ap.parse_args(argv)
    from dflash_edge.quantize import quality
    from dflash_edge.quantize.bundle_quant import family
    from dflash_edge.quantize.graph_io import load_graph, save_graph
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import file_entry, read_bundle, write_manifest

    src = read_bundle(args.bundle)
    ref = Generator.load(src, threads=args.threads)
    texts = replies(ref, args.positions, Path(args.cache))
    for spec in args.settings:
        name, setting = spec.split("=", 1)
        precision, settings = parse_setting(setting)
        with tempfile.TemporaryDirectory(prefix="quant-sweep-") as tmp:
            out = Path(tmp) / "bundle"
            shutil.copytree(src.root, out, ignore=shutil.ignore_patterns("target.onnx*"))
            t = time.perf_counter()
            model = load_graph(src.graph_path("target"))
            family(precision).quantize(model, settings)
            files = save_graph(model, out / "target.onnx")
            seconds = time.perf_counter() - t
            del model
            manifest = json.loads(json.dumps(src.manifest))
            manifest["graphs"]["target"]["files"] = [file_entry(out, f) for f in files]
            write_manifest(out, manifest)
            quant = Generator.load(out, threads=args.threads, verify=False)
            m = quality._text_metrics(ref, quant, texts)
            ms = [1e3 * r.stats.decode_s / (r.stats.new_tokens - 1)
                  for r in (quant.generate_ids(ids, 64, draft="none", stop_token_ids=()) for ids, _ in texts[:2])]
            mb = sum(f["bytes"] for f in manifest["graphs"]["target"]["files"]) / 1e6
            print(f"| {name} | `{setting}` | {m['top1_agreement']:.2%} | {m['perplexity']['quantized']:.3f} "
                  f"(fp32 {m['perplexity']['reference']:.3f}) | {m['positions']} | {mb:.1f} | "
                  f"{statistics.median(ms):.1f} | {seconds:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
