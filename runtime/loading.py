"""How `Generator.load` opens a bundle, in three steps: check, sessions, models.

    check     the arguments (`LoadOptions.checked`), the bundle read (sha256 unless verify=False),
              its I/O tables this runtime's, its KV cache within the device's memory, the target
              graph it runs (`checked_bundle`)
    sessions  one onnxruntime session per graph, sharing one config, the TensorRT profiles and the
              weights both graphs hold (`GraphSessions`)
    models    the target and drafter wrappers with their preallocated buffers (`target_model`,
              `draft_model`)

>>> opts = LoadOptions(provider="cpu").checked()                      # doctest: +SKIP
>>> b, name = checked_bundle("bundle/", opts)                         # doctest: +SKIP
>>> target = target_model(b, name, GraphSessions(b, opts))            # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .bundle import Bundle, BundleError, check_kv_fits, read_bundle
from .draft_model import DraftModel
from .io_tables import GRAPHS, io_manifest, model_dims, pick_graph
from .session import (
    SessionConfig,
    low_bit_settings,
    open_graph,
    release_pages,
    shared_initializers,
    warn_not_row_exact,
)
from .targets import TARGET_MODELS, TargetModel, TargetSpec
from .trt_profiles import symbol_ranges, trt_cache_dir, trt_profiles
from .validate import InvalidArgumentError, check_flag

FLAGS = ("spin", "verify", "use_tuned", "share_weights", "drafter")


@dataclass(frozen=True)
class LoadOptions:
    """`Generator.load`'s keyword arguments (see there for what each does)."""

    provider: str = "cpu"
    threads: int = 0
    spin: bool = True
    verify: bool = True
    target_graph: str | None = None
    use_tuned: bool = True
    share_weights: bool = True
    drafter: bool = True

    def checked(self) -> "LoadOptions":
        """The flags and `target_graph` checked (InvalidArgumentError names the argument);
        `provider` and `threads` are checked by the caller, so that a lowered thread count warns
        at its line."""
        flags = {name: check_flag(name, getattr(self, name)) for name in FLAGS}
        if self.target_graph is not None and not isinstance(self.target_graph, str):
            raise InvalidArgumentError(
                "target_graph",
                f"target_graph={self.target_graph!r:.60}: expected a graph name "
                f"('target', 'target_fused') or None",
            )
        return replace(self, **flags)


def checked_bundle(bundle: str | Path | Bundle, opts: LoadOptions) -> tuple[Bundle, str]:
    """Step 1, check: (the bundle read and checked, the target graph it runs on `opts.provider`).

    The target graph: `opts.target_graph`, else the fused flavour where the provider runs it
    (io_tables.pick_graph), the portable one elsewhere."""
    if not isinstance(bundle, (str, Path, Bundle)):
        raise InvalidArgumentError(
            "bundle", f"bundle={bundle!r:.60}: expected a bundle directory (str or Path)"
        )
    b = bundle if isinstance(bundle, Bundle) else read_bundle(bundle, verify=opts.verify)
    _check_io_tables(b)
    check_kv_fits(b, opts.provider)  # before any buffer is allocated
    graphs = b.manifest["graphs"]
    # an int8 fused target: its own; fused where it runs
    kv_dtypes = {g: b.graph_kv_dtype(g) for g in graphs}
    name = opts.target_graph or pick_graph(graphs, "target", opts.provider, kv_dtypes)
    if name not in graphs or name not in TARGET_MODELS:
        raise BundleError(
            f"target_graph={name!r}: {b.root} has no such target graph; it has "
            f"{', '.join(n for n in graphs if n in TARGET_MODELS)}"
        )
    return b, name


class GraphSessions:
    """Step 2, sessions: opens a bundle's graphs with one SessionConfig, the TensorRT profiles
    and (with `share_weights`) the weights both graphs hold, loaded once for both."""

    def __init__(self, b: Bundle, opts: LoadOptions):
        self.bundle, self.provider = b, opts.provider
        self.config = SessionConfig(
            opts.provider, opts.threads, trt_cache_dir=str(trt_cache_dir(b.root)), spin=opts.spin
        )
        self.profiles = trt_profiles(b) if opts.provider == "tensorrt" else {}
        self.maps: list = []
        self.shared = (
            shared_initializers(b.root, b.manifest, self.config, self.maps)
            if opts.share_weights
            else {}
        )

    def config_for(self, graph: str) -> SessionConfig:
        """Manifest graph `graph`'s session config: fp16 graphs get TensorRT's fp16 kernels,
        DequantizeLinear weights their accuracy level."""
        entry = self.bundle.manifest["graphs"][graph]
        fp16, level = entry["precision"] == "fp16", low_bit_settings(entry)
        return replace(self.config, fp16=fp16, accuracy_level=level)

    def open(self, graph: str):
        """A runner for manifest graph `graph` (`config_for`); shared weights are given, not
        loaded."""
        return open_graph(
            self.bundle.graph_path(graph),
            self.config_for(graph),
            self.profiles.get(graph),
            self.shared.get(graph),
        )

    def release(self) -> None:
        """Drop the shared tables' resident pages once a session is built
        (session.release_pages)."""
        release_pages(self.maps)


def target_model(b: Bundle, name: str, sessions: GraphSessions) -> TargetModel:
    """Step 3, models: target graph `name`'s session and wrapper, its buffers preallocated."""
    runner = sessions.open(name)
    warn_not_row_exact(b.manifest["graphs"][name], sessions.provider)
    sessions.release()  # before the drafter's session is built beside it
    kv_dtype = b.graph_kv_dtype(name)
    _check_cache_dtype(b, name, runner, kv_dtype)
    # T = k + 1, k = 0..B-1; and the prefill chunk
    steps = tuple(range(1, b.block_size + 1))
    pad_rows, chunk = b.graph_pad_rows(name), b.manifest["prefill_chunk"]
    spec = TargetSpec(cache_capacity(b), steps, kv_dtype, pad_rows, prefill_chunk=chunk)
    return TARGET_MODELS[name](runner, model_dims(b.model, b.block_size), spec)


def draft_model(b: Bundle, target: TargetModel, sessions: GraphSessions) -> DraftModel:
    """Step 3, models: the drafter's session and wrapper, reading `target`'s feature buffer."""
    draft = DraftModel(
        sessions.open("drafter"),
        model_dims(b.model, b.block_size),
        target.hidden,
        b.model["mask_token_id"],
        b.kv_dtype,
        max_ctx_rows=symbol_ranges(b.manifest)["C"][2],
    )
    sessions.release()
    return draft


def cache_capacity(b: Bundle) -> int:
    """Positions the caches hold: the live context plus one verify block (or one padded prefill
    chunk) beyond it."""
    slack = b.manifest["kv_cache"]["slack"]
    return b.max_context + max(slack, b.block_size, b.manifest["prefill_chunk"])


def _check_io_tables(b: Bundle) -> None:
    # a drafter's window I/O is there only when it has windows
    dims = model_dims(b.model, b.block_size)
    for name in b.manifest["graphs"]:  # graphs this version has no table for are not used
        if name in GRAPHS and b.manifest["graphs"][name]["io"] != io_manifest(
            name, b.graph_kv_dtype(name), dims
        ):
            raise BundleError(
                f"{b.root}: graph {name!r} declares inputs/outputs that this runtime does not "
                f"implement; re-export the bundle with this dflash-edge version"
            )


def _check_cache_dtype(b: Bundle, name: str, runner, dtype: str) -> None:
    """The graph file's cache inputs must have the dtype its manifest entry promises (int8 vs fp32
    cache)."""
    have = {i.name: i.type for i in runner.session.get_inputs()}
    cache = have.get("past_key.0", have.get("past_key"))
    if cache is not None and cache != f"tensor({'float' if dtype == 'float32' else dtype})":
        raise BundleError(
            f"{b.root}: graph {name!r} has a {cache} KV cache but its manifest entry says {dtype}; "
            f"the manifest does not match the graph: re-export or re-quantise the bundle"
        )
