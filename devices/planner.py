"""Memory and speed plan of a target + DFlash drafter on a device (profiles + model dims, no
graphs).

Memory: weights at the chosen precision (int4/int8 = MatMulNBits blocks of 32 with a float scale and
a zero point each; the embedding and LM head of an int4/int8 target as 8-bit blocks, stored once for
target and drafter, as `export` writes them), the drafter's own layers (export's default: fp16 on a
GPU / Jetson, fp32 beside a low-bit target on a CPU), KV caches preallocated at context + block,
activations, the runtime, and the OS reserve where the OS shares memory. On a CPU the runtime maps
the shared tables read-only from the bundle and the embedding is a Gather, so only the rows used
become resident. Speed: a roofline per step (bytes ÷ bandwidth vs FLOPs ÷ compute, with the device
class's efficiency factors, devices/classes.json) plus a per-layer dispatch cost; on a hybrid
target (Qwen3.5) only the full-attention layers' KV grows with context, the linear layers' conv +
recurrent states (fp32, STATE_BYTES) are read and written whole every call whatever the context;
DFlash's speedup at acceptance length τ is τ · t_decode / (t_draft + t_verify).

>>> t, d, tau = preset("qwen3-8b")                                               # doctest: +SKIP
>>> plan(PlanRequest(t, d, get_profile("jetson-orin-nx-16gb"), "int4", 4096)).fits  # doctest: +SKIP
True
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .dims import DraftDims, ModelDims
from .errors import DeviceError
from .profiles import DeviceProfile, class_factors

GB = 1e9
WEIGHT_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8, "int4": 4, "fp4": 4}
QUANT_BLOCK = 32  # MatMulNBits block: one float scale + one zero point per 32 weights
FLOAT_PRECISIONS = ("fp32", "fp16", "bf16")
# precision -> the compute rates that can run it, best first (weight-only int4 computes in the float
# dtype)
COMPUTE_CHAIN = {
    "fp32": ("fp32",),
    "fp16": ("fp16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp8": ("fp8", "fp16", "fp32"),
    "int8": ("int8", "fp16", "fp32"),
    "int4": ("fp16", "fp32"),
    "fp4": ("fp4", "fp8", "fp16", "fp32"),
}
# a low-bit target's embedding / LM head (export.weight_formats)
TABLE_PRECISION = {
    "int4": "int8",
    "int8": "int8",
}
MIN_CONTEXT = 256
STATE_BYTES = 4  # linear-attention states and their per-token rows stay fp32 (runtime/io_tables.py)


@dataclass(frozen=True)
class PlanRequest:
    target: ModelDims
    drafter: DraftDims
    device: DeviceProfile
    precision: str = "fp16"
    context: int = 4096  # tokens the KV cache holds
    position: int = 0  # position the step times assume (0: at the full context)
    block: int = 0  # verify length (0: the drafter's block size)
    prefill_chunk: int = 64
    tau: float = 2.0  # acceptance length assumed for the recommended verify length
    target_weight_bytes: int | None = (
        None  # exact bytes (from a bundle manifest) instead of the dims' estimate
    )
    draft_weight_bytes: int | None = (
        None  # the drafter's own (the tables it borrows are the target's)
    )
    table_bytes: tuple[float, float] | None = (
        None  # exact (embedding, LM head) bytes of a bundle; tied: (0, head)
    )
    kv_bytes: int = 0  # bytes per target KV element (1: the int8 cache); 0: as the activations
    draft_precision: str = (
        ""  # the drafter's own layers; "": what export writes (draft_precision_of)
    )


def default_draft_precision(precision: str, device_class: str = "cpu") -> str:
    """What `export` writes the drafter's own layers in beside a `precision` target on a device of
    `device_class`: on a GPU / Jetson fp16 (16 bits: half fp32's bytes per draft pass; an fp32
    target, asked for by name, keeps an fp32 drafter); on a CPU fp32 beside int4 / int8 (its fp32
    activations), the target's precision otherwise (an fp16 bundle is fp16 throughout). Where an
    fp16 drafter overflows, export falls back to int8 weights (exporter.py), which keep the
    shipped drafter's acceptance as int4 does (tau 1.539 against fp32's 1.534: docs/BENCHMARKS.md
    "Drafter precision")."""
    if device_class != "cpu" and precision != "fp32":
        return "bf16" if precision == "bf16" else "fp16"
    return {"int4": "fp32", "int8": "fp32"}.get(precision, precision)


def draft_precision_of(req: PlanRequest) -> str:
    """The drafter's precision: as asked, else export's default for the device."""
    return req.draft_precision or default_draft_precision(req.precision, req.device.device_class)


def float_bytes(req: PlanRequest) -> int:
    """Activation / KV / scale dtype: fp32 for fp32 and on CPUs (onnxruntime CPU kernels), else
    fp16."""
    return 4 if req.precision == "fp32" or req.device.device_class == "cpu" else 2


def target_kv_bytes(req: PlanRequest) -> int:
    """The target cache's element size: a bundle's real dtype when known; on CPUs int4/int8 targets
    get the int8 cache (what `export` gives them), everything else caches in the activation
    dtype."""
    if req.kv_bytes:
        return req.kv_bytes
    return (
        1
        if req.device.device_class == "cpu" and req.precision in ("int8", "int4")
        else float_bytes(req)
    )


def bytes_per_weight(req: PlanRequest, precision: str | None = None) -> float:
    """Bytes per weight at `precision` (default the request's)."""
    precision = precision or req.precision
    bits, fb = WEIGHT_BITS[precision], float_bytes(req)
    if precision in ("int8", "int4"):
        return bits / 8 + (fb + bits / 8) / QUANT_BLOCK  # + scale and zero point per block
    if precision == "fp4":
        return 0.5 + 1 / 16  # NVFP4: an fp8 scale per 16 weights
    return bits / 8


def head_bytes(req: PlanRequest) -> tuple[float, float]:
    """(embedding table, LM head) bytes, stored once for target and drafter: a bundle's own when
    given; a low-bit target's as 8-bit blocks (one table when tied); otherwise the LM head at the
    precision and the embedding (a Gather) in the float dtype, shared with a tied head."""
    if req.table_bytes:
        return req.table_bytes
    vh, fb = req.target.embed_params, float_bytes(req)
    tied = req.target.tie_word_embeddings
    if req.precision in TABLE_PRECISION:
        table = vh * bytes_per_weight(req, TABLE_PRECISION[req.precision])
        return (0.0 if tied else table), table
    shared = tied and req.precision in FLOAT_PRECISIONS
    return (0.0 if shared else vh * fb), vh * bytes_per_weight(req)


def weight_bytes(req: PlanRequest) -> tuple[float, float]:
    """(target incl. the tables, drafter's own layers) weight bytes (a bundle's exact bytes when
    given)."""
    embed, head = head_bytes(req)
    target = (
        req.target_weight_bytes or req.target.layer_params() * bytes_per_weight(req) + embed + head
    )
    d, precision = req.drafter, draft_precision_of(req)
    draft = (d.layer_params + d.fc_params(req.target.hidden_size)) * bytes_per_weight(
        req, precision
    )
    draft += d.wide_params * bytes_per_weight(req, wide_precision(precision))  # DFlash2's (or 0)
    draft += d.codebook_params * (2 if precision == "fp16" else 4)
    return float(target), float(req.draft_weight_bytes or draft)


def wide_precision(precision: str) -> str:
    """A DFlash2 drafter's conv and selector projections: 8 bits in a low-bit drafter (fewer break
    the candidates' ranking), else the drafter's own float precision."""
    return "int8" if precision in ("int4", "int8", "fp4") else precision


def resident_weight_bytes(req: PlanRequest) -> tuple[float, float, float]:
    """(target, drafter, load transient) weight bytes in memory: the bytes times the device class's
    residency (its low-bit figure for int4 / int8 where it has one). On a CPU (onnxruntime) the
    runtime maps the shared tables read-only: the embedding is Gathered from the map (only the rows
    used stay resident), and each session that reads the LM head prepacks its own copy (target and
    drafter: two), reading the mapped head while it does (the transient, dropped once the sessions
    are built: runtime/session.release_pages)."""
    f = class_factors(req.device.device_class)

    def residency(precision):
        return (
            f.get("weights_residency_low_bit", f["weights_residency"])
            if precision in TABLE_PRECISION
            else f["weights_residency"]
        )

    target_w, draft_w = weight_bytes(req)
    target, drafter = (
        target_w * residency(req.precision),
        draft_w * residency(draft_precision_of(req)),
    )
    if req.device.device_class != "cpu":
        return target, drafter, 0.0
    embed, head = head_bytes(req)
    return (
        target - embed * residency(req.precision),
        drafter + head * residency(req.precision),
        head,
    )


def linear_state_bytes(t: ModelDims, tokens: int) -> float:
    """A hybrid target's live linear-attention state: the states a call starts from and those it
    returns, plus the per-token rollback rows of the previous and the current call (`tokens` each);
    0 for a dense target."""
    if not t.linear:
        return 0.0
    return 2 * (t.state_bytes(STATE_BYTES) + tokens * t.linear.row_elements * STATE_BYTES)


def memory_plan(req: PlanRequest) -> dict:
    """GB per component, the total, what the device leaves usable, and whether it fits."""
    f = class_factors(req.device.device_class)
    fb, block = float_bytes(req), req.block or req.drafter.block_size
    target_w, draft_w = weight_bytes(req)
    target_res, draft_res, mapped = resident_weight_bytes(req)
    slots = req.context + block
    kv = slots * (
        req.target.kv_bytes_per_token(target_kv_bytes(req)) + req.drafter.kv_bytes_per_token(fb)
    )
    t, inter = (
        req.target,
        (
            req.target.experts_per_token * req.target.moe_intermediate_size
            or req.target.intermediate_size
        ),
    )
    tokens = max(req.prefill_chunk, block)
    # live tensors of the widest call (fp32 logits, hidden states incl. context features, MLP,
    # attention
    # scores), x2: onnxruntime's arena keeps inputs and outputs of neighbouring nodes alive
    act = (
        2
        * tokens
        * (
            t.vocab_size * 4
            + t.hidden_size * (req.drafter.num_target_layer_ids + 6) * fb
            + 2 * inter * fb
            + t.num_heads * slots * 4
        )
    )
    parts = {
        "target_weights": target_res / GB,
        "drafter_weights": draft_res / GB,
        "mapped_head_at_load": mapped / GB,
        "kv_cache": kv / GB,
        "linear_state": linear_state_bytes(t, tokens) / GB,
        "activations": act / GB,
        "runtime": f["runtime_overhead_gb"],
    }
    total = sum(parts.values())
    usable = req.device.usable_memory_gb
    return {
        "components_gb": {k: round(v, 3) for k, v in parts.items()},
        "total_gb": round(total, 3),
        "device_memory_gb": req.device.memory_gb,
        "os_reserve_gb": req.device.os_reserve_gb if req.device.memory_shared_with_os else 0.0,
        "usable_gb": round(usable, 3),
        "fits": total <= usable,
        "weights_on_disk_gb": round((target_w + draft_w) / GB, 3),
        "kv_dtype_bytes": target_kv_bytes(req),
    }


def _compute_tflops(req: PlanRequest, precision: str | None = None) -> float:
    rates, precision = req.device.compute_tflops, precision or req.precision
    for key in COMPUTE_CHAIN[precision]:
        if rates.get(key):
            return float(rates[key])
    raise DeviceError(
        f"device {req.device.name!r} has no compute figure for {precision} (or a fallback); "
        f"its profile lists {sorted(k for k, v in rates.items() if v)}"
    )


def effective_bandwidth_gb_s(req: PlanRequest, precision: str | None = None) -> float:
    """GB/s one step streams its bytes at: the profile's measured decode figure where it has one
    (fit to published runs, devices/published.json), else the nominal figure times the device
    class's efficiency (its low-bit figure for int4 / int8)."""
    if req.device.decode_bandwidth_gb_s:
        return float(req.device.decode_bandwidth_gb_s)
    if not req.device.bandwidth_gb_s:
        raise DeviceError(
            f"device {req.device.name!r} has no bandwidth figure; detect it first (cpu) or fix "
            "its profile"
        )
    return req.device.bandwidth_gb_s * _class_factor(req, "bandwidth_efficiency", precision)


def _class_factor(req: PlanRequest, name: str, precision: str | None = None) -> float:
    """The device class's factor `name`, its low-bit figure for int4 / int8 where it has one."""
    f = class_factors(req.device.device_class)
    low = (precision or req.precision) in TABLE_PRECISION
    return f.get(f"{name}_low_bit", f[name]) if low else f[name]


def _roofline_ms(
    req: PlanRequest, nbytes: float, flops: float, layers: int, precision: str | None = None
) -> dict:
    f = class_factors(req.device.device_class)
    mem = 1e3 * nbytes / (effective_bandwidth_gb_s(req, precision) * GB)
    comp = 1e3 * flops / (_compute_tflops(req, precision) * 1e12 * f["compute_efficiency"])
    over = layers * _class_factor(req, "layer_overhead_ms", precision)
    return {
        "ms": round(max(mem, comp) + over, 4),
        "memory_ms": round(mem, 4),
        "compute_ms": round(comp, 4),
        "overhead_ms": round(over, 4),
        "bound": "memory" if mem >= comp else "compute",
    }


def _experts_touched(t: ModelDims, tokens: int) -> float:
    """Expected distinct experts per layer that `tokens` tokens route to (uniform routing)."""
    return t.num_experts * (1 - (1 - t.experts_per_token / t.num_experts) ** tokens)


def target_step(req: PlanRequest, tokens: int) -> dict:
    """Roofline of one target call on `tokens` tokens at position `context` (1: plain decode)."""
    t, bpw = req.target, bytes_per_weight(req)
    mlp = (
        t.mlp_params(active=True)
        if not t.num_experts
        else _experts_touched(t, tokens) * 3 * t.hidden_size * t.moe_intermediate_size
        + t.hidden_size * t.num_experts
    )
    layer_bytes = (t.mixer_params + t.mlps(mlp)) * bpw
    tables = head_bytes(req)
    if req.target_weight_bytes:  # a bundle: scale the layers to its real layer bytes
        layer_bytes *= (req.target_weight_bytes - sum(tables)) / (t.layer_params() * bpw)
    pos = req.position or req.context
    # only full layers' KV grows with the position; a hybrid's states are read and rewritten whole
    # (constant)
    nbytes = (
        layer_bytes
        + tables[1]
        + pos * t.kv_bytes_per_token(target_kv_bytes(req))
        + linear_state_bytes(t, tokens)
    )
    attn_flops = 4 * pos * t.num_heads * t.head_dim * t.full_layers + (
        t.linear.token_flops if t.linear else 0
    )
    flops = tokens * (2 * t.active_params + attn_flops)
    return _roofline_ms(req, nbytes, flops, t.num_layers)


def draft_step(req: PlanRequest, block: int) -> dict:
    """Roofline of one drafter call: `block` positions over the cached context features."""
    d, t, fb, precision = req.drafter, req.target, float_bytes(req), draft_precision_of(req)
    own = d.layer_params + d.fc_params(t.hidden_size)
    pos = req.position or req.context
    nbytes = (
        own * bytes_per_weight(req, precision)
        + d.wide_params
        * bytes_per_weight(req, wide_precision(precision))  # DFlash2's conv, selector
        + head_bytes(req)[1]
        + pos * d.kv_bytes_per_token(fb)
    )
    own += d.wide_params
    flops = block * (2 * (own + t.embed_params) + 4 * pos * d.num_heads * d.head_dim * d.num_layers)
    return _roofline_ms(req, nbytes, flops, d.num_layers, precision)


def alpha_for_tau(tau: float, block: int) -> float:
    """Per-position acceptance rate α with (1 - α^B) / (1 - α) = τ (geometric acceptance, bonus
    included)."""
    tau = min(max(tau, 1.0), block - 1e-9)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 - mid**block) / (1 - mid) < tau else (lo, mid)
    return lo


def tau_at(alpha: float, block: int) -> float:
    return (1 - alpha**block) / (1 - alpha) if alpha < 1 else float(block)


def speed_plan(req: PlanRequest) -> dict:
    """Step times, speedup as a function of τ at the request's block, and the best verify length at
    `tau`."""
    block = req.block or req.drafter.block_size
    decode = target_step(req, 1)

    def spec(b: int) -> tuple[float, dict, dict]:
        verify, draft = target_step(req, b), draft_step(req, b)
        return verify["ms"] + draft["ms"], verify, draft

    step_ms, verify, draft = spec(block)
    curve = [
        {"tau": x / 2, "speedup": round((x / 2) * decode["ms"] / step_ms, 3)}
        for x in range(2, 2 * block + 1)
    ]
    alpha = alpha_for_tau(req.tau, req.drafter.block_size)
    best = max(
        range(2, req.drafter.block_size + 1),
        key=lambda b: tau_at(alpha, b) * decode["ms"] / spec(b)[0],
    )
    best_speedup = tau_at(alpha, best) * decode["ms"] / spec(best)[0]
    return {
        "position": req.position or req.context,
        "block": block,
        "decode": decode,
        "verify": verify,
        "draft": draft,
        "plain_tokens_per_s": round(1e3 / decode["ms"], 2),
        "verify_over_decode": round(verify["ms"] / decode["ms"], 3),
        "speedup_vs_tau": curve,
        "break_even_tau": round(step_ms / decode["ms"], 3),
        "assumed_tau": req.tau,
        "alpha": round(alpha, 4),
        "recommended_verify_length": best if best_speedup > 1 else 1,
        "expected_speedup": round(max(best_speedup, 1.0), 3),
        "draft_pays": best_speedup > 1,
    }


def max_context(req: PlanRequest) -> int:
    """The largest context (>= MIN_CONTEXT, <= the model's positions) that fits; 0 when none
    does."""
    block = req.block or req.drafter.block_size
    lo, hi = MIN_CONTEXT, req.target.max_position_embeddings - block
    if not memory_plan(replace(req, context=lo))["fits"]:
        return 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if memory_plan(replace(req, context=mid))["fits"] else (lo, mid - 1)
    return lo


def alternatives(req: PlanRequest) -> list[dict]:
    """What would fit: each supported precision at the requested context, else its largest
    context."""
    out = []
    for prec in sorted(
        (p for p in req.device.precisions if p in WEIGHT_BITS), key=lambda p: -WEIGHT_BITS[p]
    ):
        alt = replace(
            req,
            precision=prec,
            target_weight_bytes=None,
            draft_weight_bytes=None,
            table_bytes=None,
            draft_precision="",
        )
        if memory_plan(alt)["fits"]:
            out.append({"precision": prec, "context": req.context})
        elif ctx := max_context(alt):
            out.append({"precision": prec, "context": ctx})
    return out


def check_request(req: PlanRequest) -> None:
    d = req.device
    if req.precision not in WEIGHT_BITS:
        raise DeviceError(f"unknown precision {req.precision!r}; known: {', '.join(WEIGHT_BITS)}")
    if req.precision not in d.precisions:
        raise DeviceError(
            f"device {d.name!r} does not run {req.precision}; it supports {', '.join(d.precisions)}"
        )
    block = req.block or req.drafter.block_size
    if not 2 <= block <= req.drafter.block_size:
        raise DeviceError(
            f"block {block} is outside 2..{req.drafter.block_size} (the drafter's trained block "
            "size)"
        )
    limit = req.target.max_position_embeddings - block
    if not 1 <= req.context <= limit:
        raise DeviceError(
            f"context {req.context} is outside 1..{limit} (the model's "
            f"{req.target.max_position_embeddings} positions minus the block)"
        )
    if d.memory_gb is None:
        raise DeviceError(
            f"device {d.name!r} has no memory figure; the generic cpu profile is filled by "
            "detection"
        )


def runs_on(req: PlanRequest) -> dict:
    """Which target flavour the device runs and how its low-bit weights should be written
    (`export --low-bit-ops`): a CPU runs the fused target over the source's own blocks (onnxruntime
    fuses them into MatMulNBits); a GPU or Jetson builds TensorRT engines from the portable graphs,
    whose INT4 / INT8 weights must follow TensorRT's weight-only rules (the same bytes either way:
    one copy)."""
    cpu = req.device.device_class == "cpu"
    low_bit = req.precision in ("int4", "int8")
    ops = ("standard" if cpu else "tensorrt") if low_bit else None
    return {"target_graph": "target_fused" if cpu else "target", "low_bit_ops": ops}


def plan(req: PlanRequest) -> dict:
    """The full plan: memory (fits, why not, what would fit) and speed; JSON-ready."""
    check_request(req)
    mem = memory_plan(req)
    out = {
        "device": req.device.name,
        "device_class": req.device.device_class,
        "precision": req.precision,
        "context": req.context,
        "block": req.block or req.drafter.block_size,
        "target_params": {
            "total": req.target.total_params,
            "active_per_token": req.target.active_params,
        },
        "memory": mem,
        "fits": mem["fits"],
        "speed": speed_plan(req),
        "runs": runs_on(req),
    }
    if not mem["fits"]:
        comps = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in mem["components_gb"].items())
        reserve = (
            f" after the {mem['os_reserve_gb']:g} GB OS reserve" if mem["os_reserve_gb"] else ""
        )
        out["why_not"] = (
            f"needs {mem['total_gb']:.2f} GB ({comps}) but {req.device.name} has "
            f"{mem['usable_gb']:.2f} GB usable{reserve}"
        )
        out["would_fit"] = alternatives(req)
    return out
