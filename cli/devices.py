"""`dflash-edge devices`: device profiles (detected one marked); `devices plan`: fit + speed plan.

The planner (devices/, floor 1) never reads bundles or checkpoints; this module (floor 6) turns a
bundle manifest, a checkpoint's config.json or a preset name into model dims and passes them down.

    dflash-edge devices --json
    dflash-edge devices plan --model qwen3-8b --precision int4 --device jetson-orin-nx-16gb \\
        --context 4096
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..devices.detect import detect, detect_cpu
from ..devices.dims import DraftDims, ModelDims, draft_dims_from_config, preset, recipe_drafter
from ..devices.errors import DeviceError
from ..devices.planner import (
    FLOAT_PRECISIONS,
    PlanRequest,
    bytes_per_weight,
    draft_precision_of,
    head_bytes,
    plan,
)
from ..devices.profiles import get_profile, load_profiles
from ..models import planner_dims
from ..models.fetch import target_files
from ..models.gguf_checkpoint import config_dir, is_gguf
from ..models.locate import config_folder, drafter_folder
from ..runtime.bundle import read_bundle

DEFAULT_TAU = 2.0


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON list of the profiles")
    sub = p.add_subparsers(dest="devices_command", metavar="plan")
    q = sub.add_parser("plan", help="will a model fit on a device, and how fast will it decode?")
    q.add_argument("bundle", nargs="?", help="bundle directory (or use --model / --target)")
    q.add_argument(
        "--model",
        help="a preset: smollm2-135m, qwen3-4b, qwen3-8b, llama-3.1-8b, qwen3-coder-30b-a3b",
    )
    q.add_argument(
        "--target", help="a checkpoint dir, .gguf file or hub id org/name[@REV] (its config.json)"
    )
    q.add_argument(
        "--draft",
        help="with --target: the DFlash drafter's folder or hub id (default: the z-lab recipe, "
        "5 layers)",
    )
    q.add_argument("--device", help="profile name (default: the detected device)")
    q.add_argument(
        "--precision",
        help="weights: fp32, fp16, bf16, fp8, int8, int4, fp4 (default: the bundle's, else fp16)",
    )
    q.add_argument(
        "--context", type=int, help="context tokens (default: the bundle's max context, else 4096)"
    )
    q.add_argument(
        "--block", type=int, help="verify length (default: the bundle's / drafter's block size)"
    )
    q.add_argument(
        "--tau",
        type=float,
        help="acceptance length to plan the verify length for (default: the preset's, else 2.0)",
    )
    q.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args) -> int:
    if getattr(args, "devices_command", None) == "plan":
        return run_plan(args)

    profiles = load_profiles()
    found = detect(profiles)
    profiles[found.profile.name] = found.profile
    rows = [{**p.to_dict(), "detected": p.name == found.profile.name} for p in profiles.values()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'':2}{'name':28} {'memory GB':>10} {'shared':>6} {'GB/s':>7} {'fp16 TFLOPS':>11}  "
        "precisions"
    )
    for r in rows:
        fp16 = r["compute_tflops"].get("fp16") or r["compute_tflops"].get("fp32")
        print(
            f"{'*' if r['detected'] else ' ':2}{r['name']:28} {r['memory_gb'] or 0:>10g} "
            f"{'yes' if r['memory_shared_with_os'] else 'no':>6} {r['bandwidth_gb_s'] or 0:>7g} "
            f"{fp16 or 0:>11g}  "
            f"{','.join(r['precisions'])}"
        )
    print(
        f"* detected: {found.profile.title} "
        f"({', '.join(f'{k}={v}' for k, v in found.evidence.items())})"
    )
    return 0


def _device(name: str | None):

    if name is None:
        return detect().profile
    return detect_cpu().profile if name == "cpu" else get_profile(name)


def request_from_args(args) -> PlanRequest:
    """Model dims from exactly one of BUNDLE / --model / --target, plus the device and options."""
    given = [x for x in (args.bundle, args.model, args.target) if x]
    if len(given) != 1:
        raise DeviceError(
            "devices plan needs exactly one of BUNDLE, --model PRESET or --target CHECKPOINT_DIR"
        )
    device = _device(args.device)
    if args.bundle:
        return bundle_request(args, device)
    if args.model:
        target, drafter, tau = preset(args.model)
    else:
        target, drafter, tau = checkpoint_dims(args.target, args.draft) + (DEFAULT_TAU,)
    return PlanRequest(
        target,
        drafter,
        device,
        precision=args.precision or "fp16",
        context=args.context or 4096,
        block=args.block or 0,
        tau=args.tau or tau,
    )


def checkpoint_dims(target_spec: str, draft_spec: str | None) -> tuple[ModelDims, DraftDims]:
    """Dims from the config.json of a target (folder, .gguf or hub id) and optional drafter."""
    target = planner_dims(_read_json(_model_dir(target_spec, "target") / "config.json"))
    if draft_spec:
        draft_dir = _model_dir(draft_spec, "draft")
        return target, draft_dims_from_config(
            _read_json(draft_dir / "config.json"), f"{draft_dir}/config.json"
        )
    return target, recipe_drafter(target)


def _model_dir(spec: str, what: str) -> Path:
    """The folder holding the config.json of `spec`: a hub id fetches that file alone."""
    folder = config_folder(spec, what)
    if folder is not None:
        return folder
    if what != "target":
        return drafter_folder(spec)
    path = target_files(spec)  # a GGUF: its small files only, never an import of its weights
    return config_dir(path) if is_gguf(path) else path


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DeviceError(
            f"{path} cannot be read ({err}); point at a model directory with a config.json"
        ) from err


def bundle_request(args, device) -> PlanRequest:
    """A bundle's dims, exact weight bytes, precision, block and context from its manifest (never
    its graphs)."""

    bundle = read_bundle(args.bundle, verify=False)
    m, man = bundle.model, bundle.manifest
    # a hybrid bundle (target_hybrid): its manifest lacks the dense dims
    if "target" not in man["graphs"]:
        raise DeviceError(
            f"bundle {args.bundle} has a {', '.join(man['graphs'])} target, which plans from its "
            f"checkpoint: `dflash-edge devices plan --target DIR` (or a preset: --model qwen3.5-4b)"
        )
    precision = man["graphs"]["target"]["precision"]
    if args.precision and args.precision != precision:
        raise DeviceError(
            f"bundle {args.bundle} holds {precision} weights, not {args.precision}; plan it as "
            f"{precision} or export/quantise a {args.precision} bundle"
        )
    if args.block and args.block != bundle.block_size:
        raise DeviceError(
            f"bundle {args.bundle} was exported for block {bundle.block_size}, not {args.block}; "
            f"re-export with --block-size {args.block} or plan with --block {bundle.block_size}"
        )
    if args.context and args.context > bundle.max_context:
        raise DeviceError(
            f"bundle {args.bundle} was exported for context <= {bundle.max_context}, not "
            f"{args.context}; "
            f"re-export with --max-context {args.context} or plan with --context <= "
            f"{bundle.max_context}"
        )
    runs = (
        "target_fused"
        if device.device_class == "cpu" and "target_fused" in man["graphs"]
        else "target"
    )
    graphs = man["graphs"]
    files = {g: {f["path"]: f["bytes"] for f in graphs[g]["files"]} for g in (runs, "drafter")}
    # tables: the target's
    own_draft = sum(b for path, b in files["drafter"].items() if path not in files[runs])
    # exact: what each session reads (the data files hold both flavours)
    if "weight_bytes" in graphs["drafter"]:
        borrowed = sum(  # a region two tensors name (the table's head and lookup) once
            {
                (t["file"], t["offset"]): t["length"]
                for t in man["shared_weights"].get("tensors", [])
                if "drafter" in t["names"]
            }.values()
        )
        own_draft = graphs["drafter"]["weight_bytes"] - borrowed
    target = ModelDims(
        family=m["family"],
        hidden_size=m["hidden_size"],
        intermediate_size=m.get("intermediate_size", 0),  # MoE: its dense layers'
        num_layers=m["num_layers"],
        num_heads=m["num_heads"],
        num_kv_heads=m["num_kv_heads"],
        head_dim=m["head_dim"],
        vocab_size=m["vocab_size"],
        tie_word_embeddings="tied" in man.get("shared_weights", {}).get("lm_head", ""),
        max_position_embeddings=m["max_position_embeddings"],
        **_experts(m),
    )
    drafter = DraftDims(
        num_layers=m["draft_num_layers"],
        hidden_size=m["hidden_size"],
        intermediate_size=m.get("draft_intermediate_size", 0),
        num_heads=m["num_heads"],
        num_kv_heads=m["num_kv_heads"],
        head_dim=m["head_dim"],
        num_target_layer_ids=len(m["target_layer_ids"]),
        block_size=man["trained_block_size"],
    )
    req = PlanRequest(
        target,
        drafter,
        device,
        precision=precision,
        context=bundle.max_context,
        position=args.context or 0,
        block=bundle.block_size,
        prefill_chunk=man["prefill_chunk"],
        tau=args.tau or DEFAULT_TAU,
        target_weight_bytes=graphs[runs].get("weight_bytes") or sum(files[runs].values()),
        draft_weight_bytes=own_draft,
        kv_bytes=_cache_bytes(man, device),
        table_bytes=_table_bytes(man),
        draft_precision=man["graphs"]["drafter"]["precision"],
    )
    # stated by the manifest (session 13+)
    if target.intermediate_size and drafter.intermediate_size:
        return req
    sized = _with_intermediate(req, m.get("draft_vocab_size") or m["vocab_size"])
    # MoE: the manifest states its widths
    return replace(sized, target=target) if target.num_experts else sized


def _table_bytes(man: dict) -> tuple[float, float] | None:
    """(embedding, LM head) bytes from the manifest's shared tensors (a tied table counts as the
    head); None for bundles that list none."""
    tensors = man.get("shared_weights", {}).get("tensors") or []
    embed = sum(t["length"] for t in tensors if t["key"].startswith("embed_tokens"))
    head = sum(t["length"] for t in tensors if t["key"].startswith("lm_head"))
    if not embed and not head:
        return None
    return (0.0, float(embed)) if not head else (float(embed), float(head))


def _experts(m: dict) -> dict:
    """An MoE bundle's expert dims from its manifest `model` (families/qwen3_moe.py); {}: dense."""
    if not m.get("num_experts"):
        return {}
    return {
        "num_experts": m["num_experts"],
        "experts_per_token": m["experts_per_token"],
        "moe_intermediate_size": m["moe_intermediate_size"],
        "dense_layers": m["num_layers"] - len(m["sparse_layers"]),
    }


def _cache_bytes(man: dict, device) -> int:
    """Bytes per cached K/V element of the target the device would run: on a CPU the fused graph,
    whose int8 cache is 1 byte (0: as the activations; GPUs run the portable graph)."""
    fused = man["graphs"].get("target_fused", {})
    return (
        1
        if fused.get("kv_cache", {}).get("dtype") == "int8" and device.device_class == "cpu"
        else 0
    )


def _with_intermediate(req: PlanRequest, draft_vocab: int) -> PlanRequest:
    """Recover the MLP widths the manifest does not state from the graphs' byte counts (exact for
    float weights; quantised ones are taken as `bytes_per_weight` throughout, embedding included: an
    estimate)."""
    t, d, bpw = req.target, req.drafter, bytes_per_weight(req)
    embed, head = head_bytes(req)
    # quantisers differ on the embedding
    if req.precision not in FLOAT_PRECISIONS and not req.table_bytes:
        embed, head = 0.0, t.embed_params * (1 if t.tie_word_embeddings else 2) * bpw
    inter = ((req.target_weight_bytes - embed - head) / bpw / t.num_layers - t.attn_params) / (
        3 * t.hidden_size
    )
    draft_head = head * draft_vocab / t.vocab_size
    # tables shared with the target: the drafter holds only a reduced head's rows
    if req.table_bytes:
        draft_head = 0.0 if draft_vocab == t.vocab_size else draft_head
    else:  # older bundles: the drafter holds its own copy of the tables
        draft_head += embed
    d_layers = (req.draft_weight_bytes - draft_head) / bytes_per_weight(
        req, draft_precision_of(req)
    ) - d.fc_params(t.hidden_size)
    d_inter = (
        d_layers / d.num_layers - 2 * d.hidden_size * (d.num_heads + d.num_kv_heads) * d.head_dim
    ) / (3 * d.hidden_size)
    if inter < 1 or d_inter < 1:
        raise DeviceError(
            f"bundle weights ({req.target_weight_bytes} / {req.draft_weight_bytes} bytes) do not "
            "match "
            f"its manifest's dims at {req.precision}; plan its checkpoint with --target DIR instead"
        )
    return replace(
        req,
        target=replace(t, intermediate_size=int(inter)),
        drafter=replace(d, intermediate_size=int(d_inter)),
    )


def run_plan(args) -> int:
    out = plan(request_from_args(args))
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    mem, sp = out["memory"], out["speed"]
    at = f" (step times at position {sp['position']})" if sp["position"] != out["context"] else ""
    print(
        f"{out['device']}: {out['precision']} at context {out['context']}{at}, block {out['block']}"
    )
    print(
        "memory: "
        + ", ".join(f"{k} {v:.2f}" for k, v in mem["components_gb"].items())
        + f" = {mem['total_gb']:.2f} GB of {mem['usable_gb']:.2f} GB usable -> "
        + ("fits" if out["fits"] else "does NOT fit")
    )
    runs = out["runs"]
    print(
        f"runs: {runs['target_graph']}"
        + (f" (export --low-bit-ops {runs['low_bit_ops']})" if runs["low_bit_ops"] else "")
    )
    if not out["fits"]:
        print(f"why: {out['why_not']}")
        alts = ", ".join(f"{a['precision']} at context {a['context']}" for a in out["would_fit"])
        print(f"would fit: {alts or 'nothing at any supported precision with context >= 256'}")
    print(
        f"plain decode {sp['decode']['ms']:.2f} ms/token ({sp['plain_tokens_per_s']} tok/s, "
        f"{sp['decode']['bound']}-bound); "
        f"verify({sp['block']}) {sp['verify']['ms']:.2f} ms, draft {sp['draft']['ms']:.2f} ms; "
        f"DFlash pays above tau {sp['break_even_tau']}"
    )
    print(
        f"at tau {sp['assumed_tau']}: verify length {sp['recommended_verify_length']}, expected "
        "speedup "
        f"{sp['expected_speedup']}x"
        + ("" if sp["draft_pays"] else " (plain decoding: drafting does not pay)")
    )
    return 0
