"""What the exporter reads, opened lazily: the target and drafter checkpoints (headers only), their
configs, the tokenizer and a reduced draft vocabulary, every tensor checked by name and shape before
any is read. The graph writers (portable_target, fused_target, portable_drafter) then read one
tensor at a time from these checkpoints: there is no other way into a bundle.

Also parity's independent check (`reference`): the torch graph modules of models/graphs.py over the
torch models of models/, built on the meta device with each decoder layer's weights read from the
checkpoint when it runs and dropped after it, so parity never holds a whole model either.

>>> src = open_sources(opts, open_target(opts.target), scratch=Path("/tmp/x"))  # doctest: +SKIP
>>> src.target_cfg.hidden_size, src.draft_cfg.target_layer_ids   # doctest: +SKIP
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..models import build_target
from ..models.checkpoint import Checkpoint, check_shapes
from ..models.config import TargetConfig
from ..models.dflash2_config import open_drafter_files
from ..models.families import family
from ..models.families.qwen3 import attention_spec
from ..models.fetch import target_files
from ..models.gguf_checkpoint import config_dir, is_gguf, open_gguf
from ..models.locate import drafter_folder
from ..models.names import drafter_tensors
from ..runtime.errors import ModelFormatError
from .drafters import drafter_kind
from .fits import check_fits, peak_weight_bytes


@dataclass
class Sources:
    target_dir: Path  # config.json and tokenizer files (a GGUF's: a small folder in the cache)
    target_cfg: object  # models.config.TargetConfig
    target_ckpt: object  # models.checkpoint.Checkpoint
    draft_cfg: object  # draft_config.DraftConfig
    draft_ckpt: object
    draft_source: str  # where the drafter came from (a directory, or "random")
    tokenizer: object
    vocab: object = None  # sorted int64 token ids of a reduced draft vocabulary, or None

    @property
    def kind(self):
        """The drafter's kind module (export/drafters/)."""
        return drafter_kind(self.draft_cfg)


class Target:
    """A target spec resolved once (`open_target`), its config and tokenizer read once, when first
    asked for: what the export's choices (choices.py) and its writers share."""

    def __init__(self, spec: str | None):
        self.files = target_files(spec)  # a hub id is resolved (fetched) here, once
        self.gguf = is_gguf(self.files)

    @cached_property
    def dir(self) -> Path:
        """The folder of config.json + tokenizer (a GGUF's small files, in the cache)."""
        return config_dir(self.files) if self.gguf else self.files

    @cached_property
    def config(self):
        """models.config.TargetConfig (or the family's own subclass)."""
        return TargetConfig.from_json(self.dir)

    @cached_property
    def tokenizer(self):
        """runtime.tokenizer.ChatTokenizer."""
        from ..runtime.tokenizer import ChatTokenizer

        return ChatTokenizer.from_dir(self.dir)

    def open_checkpoint(self):
        """The checkpoint (headers only; a GGUF's tensors streamed from the file), opened anew for
        each bundle written, so its memory-mapped shards go with that write's sources."""
        return open_gguf(self.files)[0] if self.gguf else Checkpoint.open(self.files)


def open_target(spec: str | None) -> Target:
    """The `Target` of a spec: a checkpoint folder, a cached model's name, "default" / None, or a
    GGUF file read in place (models/gguf_checkpoint.py: its tensors streamed from the file, only
    its small files written to the cache)."""
    return Target(spec)


def open_sources(opts, target: Target, scratch: Path) -> Sources:
    """Configs, checkpoints (headers) and tokenizer for `opts` (ExportOptions) over the opened
    `target`; a random drafter is written to `scratch`."""
    tc, ckpt = target.config, _checked_target(opts, target)
    tok = target.tokenizer
    draft_dir, source = drafter_dir(opts.draft, tc, tok, scratch)
    dc, dckpt = open_drafter(draft_dir, tc)
    if dc.window_layers and dc.sliding_window > opts.max_context:
        raise ModelFormatError(
            f"drafter sliding_window={dc.sliding_window} is larger than the bundle's context "
            f"(--max-context {opts.max_context}): its window would never slide; export with "
            f"--max-context >= {dc.sliding_window}"
        )
    vocab = None
    if opts.draft_vocab:
        from ..models.draft_vocab import load_draft_vocab

        vocab = load_draft_vocab(
            None if source == "random" else draft_dir, opts.draft_vocab, tc.vocab_size
        )
    return Sources(target.dir, tc, ckpt, dc, dckpt, source, tok, vocab)


def _checked_target(opts, target: Target):
    """`target`'s checkpoint, checked (dtypes, memory, the family's tensors by name and shape)
    before any weight is read; an image-text one answering to the text model's names."""
    tc, ckpt = target.config, target.open_checkpoint()
    ckpt.check_dtypes(tc.torch_dtype)
    tied = ("lm_head.weight",) if tc.tie_word_embeddings else ()
    if opts.memory_check:  # before any weight is read: say so now, with the estimate
        precision = getattr(opts, "precision", "fp32")
        check_fits(
            peak_weight_bytes(ckpt.num_params(tied), tc.vocab_size * tc.hidden_size, precision),
            f"{target.dir.name} ({precision})",
        )
    fam = family(tc.model_type)
    fam.check_tensors(tc, ckpt.names())  # e.g. an expert count off by the config's, named first
    check_shapes(fam.tensors(tc), ckpt, ignore=tied + _not_text(ckpt))
    if fam.text_prefix(tc) != "model":
        ckpt = TextNames(ckpt, fam.text_prefix(tc))
    return ckpt


class TextNames:
    """An image-text checkpoint (text model under `prefix`, e.g. model.language_model) that also
    answers to the text model's plain names (`model.embed_tokens.weight`: what the drafter writer
    borrows); all else delegated."""

    def __init__(self, ckpt, prefix: str):
        self.ckpt, self.prefix = ckpt, prefix

    def _name(self, name: str) -> str:
        plain = name.startswith("model.") and not name.startswith(self.prefix + ".")
        return self.prefix + name[len("model") :] if plain else name

    def array(self, name: str, *args, **kwargs):
        return self.ckpt.array(self._name(name), *args, **kwargs)

    def shape(self, name: str):
        return self.ckpt.shape(self._name(name))

    def nbits(self, name: str):
        return self.ckpt.nbits(self._name(name))

    def __getattr__(self, attr):
        return getattr(self.ckpt, attr)


def _not_text(ckpt) -> tuple[str, ...]:
    """Tensors of an image-text checkpoint that text generation does not read (the vision tower,
    multi-token prediction heads): left in the checkpoint, said once."""
    skipped = tuple(n for n in ckpt.names() if n.startswith(("model.visual.", "mtp.")))
    if skipped:
        print(
            f"export: ignoring {len(skipped)} tensors of the vision tower / MTP heads (text only)",
            file=sys.stderr,
        )
    return skipped


def drafter_dir(spec: str | None, target_cfg, tokenizer, scratch: Path) -> tuple[Path, str]:
    """(z-lab drafter folder, source label) for `spec`: a folder or hub id, 'default' (shipped) or
    'random' (written to `scratch`)."""
    target_cfg = family(target_cfg.model_type).dense_view(target_cfg)  # a drafter's dims are dense
    if spec in (None, "default"):
        from ..models.resolve_drafter import default_drafter_path

        path = default_drafter_path(target_cfg)
        if path is not None:
            return path, str(path)
        spec = "random"
    if spec == "random":
        from ..models.drafter import save_drafter
        from ..models.resolve_drafter import RANDOM_WARNING, random_drafter_for

        print(RANDOM_WARNING, file=sys.stderr)
        return save_drafter(
            random_drafter_for(target_cfg, tokenizer), Path(scratch) / "random-drafter"
        ), "random"
    return drafter_folder(spec), str(spec)


def open_drafter(path: Path, target_cfg):
    """(DraftConfig, Checkpoint) of a z-lab drafter folder, checked against the target and by tensor
    name/shape."""
    cfg, ckpt = open_drafter_files(path, target_cfg)
    check_shapes(drafter_tensors(cfg, attention_spec(cfg)), ckpt)
    return cfg, ckpt


def reference(src: Sources, block: int):
    """`inputs -> outputs` (graph -> one tuple per case, numpy) from the torch graph modules
    (models/graphs.py) over layer-by-layer torch models: what parity compares the written graphs
    with. The checkpoints of `src` (a random drafter's in the export's scratch folder) must still
    exist when it runs."""

    def run(inputs: dict) -> dict:
        import torch

        from ..models.graphs import TargetGraph

        target, drafter = _lazy_target(src), _lazy_drafter(src)
        vocab = None if src.vocab is None else torch.as_tensor(src.vocab)
        drafter_graph = src.kind.reference_graph(src.draft_cfg)  # its I/O
        modules = {
            "target": TargetGraph(target, tuple(src.draft_cfg.target_layer_ids)),
            "drafter": drafter_graph(target, drafter, vocab),
        }
        with torch.no_grad():
            return {
                g: [_numpy(modules[g](*_tensors(feeds))) for feeds in cases]
                for g, cases in inputs.items()
                if g in modules
            }

    return run


def _tensors(feeds: tuple) -> list:
    """Graph feeds (numpy, None for a tensor the graph lacks) as a module's arguments: trailing
    Nones dropped (a drafter without sliding layers has no window inputs), the others torch tensors
    or None."""
    import torch

    feeds = list(feeds)
    while feeds and feeds[-1] is None:
        feeds.pop()
    return [None if f is None else torch.from_numpy(f) for f in feeds]


def _numpy(outputs) -> tuple:
    """A graph module's outputs as numpy arrays (None stays None: a tensor the graph does not
    have)."""
    return tuple(None if o is None else o.numpy() for o in outputs)


def _lazy_target(src: Sources):
    from ..models.weights import RowEmbedding, stream_layers

    tied, embed = src.target_cfg.tie_word_embeddings, "model.embed_tokens.weight"
    model = stream_layers(
        lambda: build_target(src.target_cfg),
        src.target_ckpt,
        "model.layers",
        ignore=("lm_head.weight",) if tied else (embed,),
    )
    if tied:
        model.tie_weights()
    else:  # untied: look up rows as needed, never the whole table beside the head
        model.model.embed_tokens = RowEmbedding(src.target_ckpt, embed)
    return model.eval()


def _lazy_drafter(src: Sources):
    from ..models.drafter import DFlashDrafter
    from ..models.weights import stream_layers

    return stream_layers(lambda: DFlashDrafter(src.draft_cfg), src.draft_ckpt, "layers").eval()
