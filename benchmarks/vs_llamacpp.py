"""Head to head on one GGUF: our bundle vs llama.cpp (llama-cpp-python), genai int4 a 3rd column.

Three steps, each a subcommand (issue 36 item 5):

  reference  transformers reads the GGUF (dequantised to float32) and writes the held-out text:
             each prompt of a shipped set (our chat template, our tokenizer's ids) followed by the
             fp32 model's own greedy reply, and the fp32 model's top-1 at every reply position,
             teacher-forced (one forward pass over prompt + reply). --checkpoint DIR also saves the
             model as a bf16 Hugging Face folder (for onnxruntime-genai's builder). Needs torch,
             transformers and gguf (our venv's `export` extra).
  fidelity   teacher-forced top-1 agreement with that reference at the reply positions: ours (the
             bundle's target graph, in prefill chunks from an empty cache) and llama.cpp's
             (logits_all=True, the whole sequence evaluated, argmax per position).
  speed      plain greedy decode ms/token (fixed new tokens, no early stop; prefill and the first
             token excluded) on --prompts prompts, and the prefill (prompt in -> first token known)
             of a ~--prefill-tokens prompt (the shipped prompts joined into one user message),
             --rounds times. One engine at a time (each spins its threads), rounds interleaved,
             order alternating; medians and ratios.

Peers run in worker processes of their own venv's python (they need no dflash-edge), JSON lines over
stdin/stdout; every engine gets the same token ids and the same thread count.

    python benchmarks/vs_llamacpp.py reference --gguf F.gguf --ours BUNDLE --out ref.json \\
        [--prompts 8 --new-tokens 48 --checkpoint /tmp/ck]
    python benchmarks/vs_llamacpp.py fidelity --reference ref.json --ours BUNDLE --gguf F.gguf \\
        --llama-python /work/peers/llama/bin/python [--json OUT]
    python benchmarks/vs_llamacpp.py speed --ours BUNDLE --gguf F.gguf --genai GENAI_DIR \\
        --llama-python /work/peers/llama/bin/python --genai-python /work/peers/genai/bin/python \\
        [--prompts 6 --new-tokens 64 --prefill-tokens 1000 --rounds 3 --threads 2 --json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from output import emit_json
from vs_genai import WORKER as GENAI_WORKER  # the genai worker, one copy
from vs_genai import set_genai_threads

LLAMA_WORKER = r"""
import json, sys, time
import numpy as np
import llama_cpp
from llama_cpp import Llama
path, threads, ctx, logits_all = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
llm = Llama(model_path=path, n_ctx=ctx, n_threads=threads, n_threads_batch=threads,
            logits_all=logits_all, verbose=False)
settings = {"llama_cpp_python": llama_cpp.__version__, "n_ctx": ctx, "n_threads": threads,
            "n_threads_batch": threads, "n_batch": llm.n_batch,
            "n_ubatch": llm.context_params.n_ubatch,
            "flash_attn_type": int(llm.context_params.flash_attn_type), "logits_all": logits_all,
            "system_info": llama_cpp.llama_print_system_info().decode()}
print(json.dumps({"ready": True, "settings": settings}), flush=True)
n_vocab = llm.n_vocab()
def last_top1():
    row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))
    return int(row.argmax())
for line in sys.stdin:
    req = json.loads(line)
    llm.reset()
    if req["op"] == "top1":                       # teacher-forced argmax at rows [lo, hi)
        llm.eval(req["ids"])
        top1 = llm.scores[req["lo"]:req["hi"]].argmax(axis=-1).tolist()
        print(json.dumps({"top1": top1}), flush=True)
        continue
    t0 = time.perf_counter()
    llm.eval(req["ids"])
    tokens, stamps = [last_top1()], [time.perf_counter()]
    while len(tokens) < req["new"]:
        llm.eval([tokens[-1]])
        tokens.append(last_top1())
        stamps.append(time.perf_counter())
    print(json.dumps({"tokens": tokens, "prefill_s": stamps[0] - t0,
                      "decode_s": stamps[-1] - stamps[0]}), flush=True)
"""


class Worker:
    """A peer engine in a worker process of its own venv's python."""

    def __init__(self, python: str, code: str, *args: str):
        self.proc = subprocess.Popen(
            [python, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {python} {args[0]} did not start (see its stderr above)")
        self.settings = json.loads(line)["settings"]

    def ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def run(self, ids: list[int], new: int) -> dict:
        return self.ask({"op": "generate", "ids": ids, "new": new})

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def llama_worker(args, logits_all: bool) -> Worker:
    ctx = str(args.ctx)
    return Worker(args.llama_python, LLAMA_WORKER, args.gguf, str(args.threads), ctx,
                  "1" if logits_all else "0")  # fmt: skip


def genai_worker(args) -> Worker:
    """genai's worker (vs_genai.py's), its threads pinned in genai_config.json first."""
    set_genai_threads(Path(args.genai), args.threads)
    return Worker(args.genai_python, GENAI_WORKER, str(args.genai), str(args.threads))


class Ours:
    """Our bundle, in this process: the target alone (plain decoding)."""

    def __init__(self, bundle: str, threads: int, chunk: int = 0, gen=None):
        import onnxruntime

        from dflash_edge.runtime import Generator

        self.gen = gen or Generator.load(bundle, threads=threads, verify=False, drafter=False)
        self.chunk = chunk or self.gen.bundle.manifest["prefill_chunk"]
        m = self.gen.bundle.manifest
        self.settings = {
            "onnxruntime": onnxruntime.__version__,
            "intra_op_threads": threads,
            "prefill_chunk": self.chunk,
            "max_context": self.gen.max_context,
            "target_graph": self.gen.target.GRAPH,
            "precision": m["graphs"][self.gen.target.GRAPH].get("precision"),
            "kv_cache": m["graphs"][self.gen.target.GRAPH].get("kv_cache", {}).get("dtype", "fp32"),
        }

    def run(self, ids: list[int], new: int) -> dict:
        self.gen.prefill_chunk = self.chunk  # the graph is dynamic in T: any chunk runs
        res = self.gen.generate_ids(ids, new, draft="none", stop_token_ids=())
        s = res.stats
        return {"tokens": res.token_ids, "prefill_s": s.prefill_s, "decode_s": s.decode_s}

    def close(self) -> None:
        pass


def encoder(bundle: str):
    """Our chat template and tokenizer, as the bundle holds them: text -> one user message's ids."""
    from dflash_edge.runtime.tokenizer import ChatTokenizer

    tok = ChatTokenizer.from_dir(bundle)
    return lambda text: tok.encode_chat([{"role": "user", "content": text}])


def prompt_ids(encode, n: int) -> list[list[int]]:
    from dflash_edge.data import read_prompts

    return [encode(row["prompt"]) for row in read_prompts("heldout", n)]


def long_prompt(encode, tokens: int) -> list[int]:
    """The shipped prompts (bench, then heldout) as one numbered user message of <= `tokens` ids."""
    from dflash_edge.data import read_prompts

    rows = read_prompts("bench") + read_prompts("heldout")
    lines = ["Answer each of these questions in one sentence."]
    ids = encode(lines[0])
    for i, row in enumerate(rows, 1):
        trial = encode("\n".join([*lines, f"{i}. {row['prompt']}"]))
        if len(trial) > tokens:
            break
        lines.append(f"{i}. {row['prompt']}")
        ids = trial
    return ids


# ---------------------------------------------------------------------------------- reference
def cmd_reference(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    gguf = Path(args.gguf).resolve()
    encode = encoder(args.ours)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    load_s = time.perf_counter() - t0
    eos = [t for t in np.atleast_1d(model.generation_config.eos_token_id or []).tolist()]
    texts = []
    with torch.no_grad():
        for ids in prompt_ids(encode, args.prompts):
            x = torch.tensor([ids])
            out = model.generate(
                x, max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=eos or None
            )
            reply = out[0, len(ids) :].tolist()
            logits = model(out).logits[0, len(ids) - 1 : -1]  # row i predicts token i + 1
            top1 = logits.argmax(-1).tolist()
            texts.append({"prompt": ids, "reply": reply, "ref_top1": top1})
            print(f"reference: {len(texts)}/{args.prompts}, {len(reply)} tokens", file=sys.stderr)
    report = {
        "gguf": str(gguf),
        "reference": "transformers AutoModelForCausalLM(gguf_file=..., dtype=float32)",
        "load_s": round(load_s, 1),
        "positions": sum(len(t["reply"]) for t in texts),
        "reply_is_own_top1": float(
            np.mean([a == b for t in texts for a, b in zip(t["reply"], t["ref_top1"])])
        ),
        "texts": texts,
    }
    Path(args.out).write_text(json.dumps(report) + "\n")  # first: the checkpoint may fail
    if args.checkpoint:
        save_checkpoint(model, gguf, Path(args.checkpoint))
    return {k: v for k, v in report.items() if k != "texts"}


def save_checkpoint(model, gguf: Path, out: Path) -> None:
    """A bf16 Hugging Face folder of the dequantised model (transformers refuses save_pretrained on
    a model loaded from a GGUF: its weights are written with safetensors directly)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    model.generation_config.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


# ---------------------------------------------------------------------------------- fidelity
def cmd_fidelity(args) -> dict:
    from dflash_edge.export.kv_cache import teacher_forced_logits

    ref = json.loads(Path(args.reference).read_text())
    ours = Ours(args.ours, args.threads)
    args.ctx = max(len(t["prompt"]) + len(t["reply"]) for t in ref["texts"]) + 8
    llama = llama_worker(args, logits_all=True)
    hits = {"ours": 0, "llama.cpp": 0, "ours=llama.cpp": 0}
    total = 0
    for t in ref["texts"]:
        ids, lo = t["prompt"] + t["reply"], len(t["prompt"]) - 1
        hi = lo + len(t["reply"])
        want = np.asarray(t["ref_top1"])
        mine = teacher_forced_logits(ours.gen, ids, slice(lo, hi)).argmax(-1)
        theirs = np.asarray(llama.ask({"op": "top1", "ids": ids, "lo": lo, "hi": hi})["top1"])
        hits["ours"] += int((mine == want).sum())
        hits["llama.cpp"] += int((theirs == want).sum())
        hits["ours=llama.cpp"] += int((mine == theirs).sum())
        total += len(want)
    llama.close()
    pct = {k: round(100.0 * v / max(total, 1), 2) for k, v in hits.items()}
    return {
        "gguf": ref["gguf"],
        "bundle": args.ours,
        "positions": total,
        "texts": len(ref["texts"]),
        "top1_agreement_with_fp32_pct": {k: pct[k] for k in ("ours", "llama.cpp")},
        "ours_minus_llama_points": round(pct["ours"] - pct["llama.cpp"], 2),
        "ours_vs_llama_top1_pct": pct["ours=llama.cpp"],
        "settings": {"ours": ours.settings, "llama.cpp": llama.settings},
    }


# ---------------------------------------------------------------------------------- speed
def cmd_speed(args) -> dict:
    ours = Ours(args.ours, args.threads)
    engines = {"ours": ours}
    for chunk in args.ours_chunks:  # the same session, prefill in other chunk sizes
        engines[f"ours-c{chunk}"] = Ours(args.ours, args.threads, chunk, ours.gen)
    args.ctx = args.prefill_tokens + args.new_tokens + 64
    engines["llama.cpp"] = llama_worker(args, logits_all=False)
    if args.genai:
        engines["genai-int4"] = genai_worker(args)
    encode = encoder(args.ours)
    prompts = prompt_ids(encode, args.prompts)
    long_ids = long_prompt(encode, args.prefill_tokens)
    for e in engines.values():  # warm-up: one short run each
        e.run(encode("Hello"), 8)
    ms = {k: [] for k in engines}
    prefill = {k: [] for k in engines}
    tokens = {k: [] for k in engines}
    jobs = [("decode", ids) for ids in prompts] + [("prefill", long_ids)] * args.rounds
    for i, (kind, ids) in enumerate(jobs):
        order = list(engines) if i % 2 == 0 else list(reversed(engines))
        for name in order:
            if kind == "decode" and name.startswith("ours-c"):
                continue  # chunk variants: the same decode as `ours`
            new = args.new_tokens if kind == "decode" else args.prefill_new
            out = engines[name].run(ids, new)
            if kind == "decode":
                ms[name].append(1e3 * out["decode_s"] / (new - 1))
                tokens[name].append(out["tokens"])
            else:
                prefill[name].append(out["prefill_s"])
        last = ms if kind == "decode" else prefill
        print(
            f"{kind} {i + 1}/{len(jobs)} ({len(ids)} ids): "
            + ", ".join(f"{k} {v[-1]:.3f}" for k, v in last.items() if v),
            file=sys.stderr,
        )
    settings = {k: e.settings for k, e in engines.items()}
    for e in engines.values():
        e.close()
    med_ms = {k: round(statistics.median(v), 2) for k, v in ms.items() if v}
    med_pf = {k: round(statistics.median(v), 3) for k, v in prefill.items()}

    def ratios(med):
        ours_ = [k for k in med if k.startswith("ours")]
        return {f"{a}/{b}": round(med[a] / med[b], 3) for a in ours_ for b in med if b not in ours_}

    def same(a, b):
        pairs = [x == y for s, t in zip(tokens[a], tokens[b]) for x, y in zip(s, t)]
        return round(float(np.mean(pairs)), 3)

    return {
        "gguf": args.gguf,
        "bundle": args.ours,
        "threads": args.threads,
        "decode": {
            "prompts": len(prompts),
            "new_tokens": args.new_tokens,
            "median_ms_per_token": med_ms,
            "ratios": ratios(med_ms),
            "all_ms_per_token": {k: [round(x, 2) for x in v] for k, v in ms.items() if v},
            "same_greedy_tokens_as_ours": {k: same("ours", k) for k in med_ms if k != "ours"},
        },
        "prefill": {
            "prompt_tokens": len(long_ids),
            "rounds": args.rounds,
            "median_s": med_pf,
            "ratios": ratios(med_pf),
            "all_s": {k: [round(x, 3) for x in v] for k, v in prefill.items()},
        },
        "settings": settings,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------------- profile
def node_kinds(graph: Path) -> dict[str, str]:
    """node name -> "MatMulNBits(bits=B, acc=A, N=.., K=..)" for the graph's MatMulNBits nodes (the
    weight formats time is spent on)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    kinds = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            kinds[node.name] = (
                f"MatMulNBits(bits={a.get('bits', 4)}, acc={a.get('accuracy_level', 0)}, "
                f"N={a['N']}, K={a['K']})"
            )
    return kinds


def cmd_profile(args) -> dict:
    """Where our prefill's time goes: onnxruntime's profiler on the long prompt, per op type."""
    import onnxruntime as ort

    made = []
    plain = ort.SessionOptions

    def profiled():  # every session this process opens writes a profile
        opts = plain()
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(args.out_dir) / f"ort{len(made)}")
        made.append(opts)
        return opts

    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    ort.SessionOptions = profiled
    try:
        ours = Ours(args.ours, args.threads)
    finally:
        ort.SessionOptions = plain
    long_ids = long_prompt(encoder(args.ours), args.prefill_tokens)
    runner = ours.gen.target.runner
    spans = {}  # chunk -> the indices of its measured run's model_run calls
    for chunk in args.chunks:
        ours.chunk = chunk
        ours.run(long_ids, 2)  # warm-up of this chunk size's shapes
        first = runner.calls
        out = ours.run(long_ids, 2)
        spans[chunk] = (first, runner.calls, out["prefill_s"])
    events = json.loads(Path(runner.session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    if len(runs) != runner.calls:
        raise SystemExit(f"{len(runs)} model_run events for {runner.calls} runs: profile unusable")
    kinds = node_kinds(Path(args.ours) / f"{ours.gen.target.GRAPH}.onnx")
    report = {"prompt_tokens": len(long_ids), "threads": args.threads, "chunks": {}}
    for chunk, (lo, hi, prefill_s) in spans.items():
        t0, t1 = runs[lo]["ts"], runs[hi - 1]["ts"] + runs[hi - 1]["dur"]
        by_op: dict[str, float] = {}
        for ev in nodes:
            if t0 <= ev["ts"] <= t1:
                name = ev["name"][: -len("_kernel_time")]
                op = kinds.get(name, ev["args"]["op_name"])
                by_op[op] = by_op.get(op, 0.0) + ev["dur"] / 1e6
        total = sum(by_op.values())
        report["chunks"][chunk] = {
            "prefill_s": round(prefill_s, 3),  # profiled: a little slower than unprofiled
            "runs": hi - lo,
            "run_s": round((t1 - t0) / 1e6, 3),
            "kernel_s": round(total, 3),
            "kernel_s_by_op": {
                k: round(v, 3) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])
            },
        }
        print(f"chunk {chunk}: {report['chunks'][chunk]}", file=sys.stderr)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_ref = sub.add_parser("reference", help="the fp32 reference text (transformers on the GGUF)")
    p_fid = sub.add_parser("fidelity", help="teacher-forced top-1 agreement with the reference")
    p_spd = sub.add_parser("speed", help="decode ms/token and a long prefill, interleaved")
    p_pro = sub.add_parser("profile", help="our long prefill under onnxruntime's profiler")
    for p in (p_ref, p_fid, p_spd, p_pro):
        p.add_argument("--ours", required=True, help="our bundle (exported from the same GGUF)")
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--json", default=None, help="also write the result here")
    for p in (p_ref, p_fid, p_spd):
        p.add_argument("--gguf", required=True)
    for p in (p_fid, p_spd):
        p.add_argument("--llama-python", default="/work/peers/llama/bin/python")
    p_ref.add_argument("--out", required=True, help="reference JSON to write")
    p_ref.add_argument("--prompts", type=int, default=8, help="held-out prompts")
    p_ref.add_argument("--new-tokens", type=int, default=48, help="reply tokens per prompt")
    p_ref.add_argument("--checkpoint", default=None, help="also save a bf16 HF folder here")
    p_fid.add_argument("--reference", required=True, help="JSON from `reference`")
    p_spd.add_argument("--genai", default=None, help="onnxruntime-genai model folder (3rd column)")
    p_spd.add_argument("--genai-python", default="/work/peers/genai/bin/python")
    p_spd.add_argument("--prompts", type=int, default=6)
    p_spd.add_argument("--new-tokens", type=int, default=64)
    for p in (p_spd, p_pro):
        p.add_argument("--prefill-tokens", type=int, default=1000)
    p_pro.add_argument("--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[64])
    p_pro.add_argument("--out-dir", default="/tmp/vs_llamacpp_profile")
    p_spd.add_argument("--prefill-new", type=int, default=2, help="tokens after the long prompt")
    p_spd.add_argument(
        "--ours-chunks",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[],
        help="also ours with these prefill chunk sizes, e.g. 256,512 (the bundle's: `ours`)",
    )
    p_spd.add_argument("--rounds", type=int, default=3, help="long-prompt prefills per engine")
    args = ap.parse_args(argv)
    run = {
        "reference": cmd_reference,
        "fidelity": cmd_fidelity,
        "speed": cmd_speed,
        "profile": cmd_profile,
    }[args.cmd]
    result = run(args)
    emit_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
