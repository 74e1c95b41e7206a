"""Import a GGUF file (llama.cpp's format) as a Hugging Face-style checkpoint directory.

The output is what `transformers.AutoModelForCausalLM.from_pretrained(out_dir)` and the rest of
dflash-edge read: `config.json`, float32 `model.safetensors`, `tokenizer.json`,
`tokenizer_config.json`, `generation_config.json`, plus `SOURCE.json` (where the weights came from)
and, for low-bit tensors, `gguf_blocks.safetensors`: their exact MatMulNBits operands
(models/gguf_blocks.py), which the exporter writes as they are instead of re-quantising the float32
weights.

    >>> from dflash_edge.models.gguf_import import import_gguf
    >>> import_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2")   # doctest: +SKIP
    PosixPath('models/smollm2')

Quantised tensors are dequantised to float32: the checkpoint holds exactly the weights llama.cpp
would compute with, so it is the same model as the GGUF, not the (unquantised) upstream one.
To export without that float32 copy, read the file in place (models/gguf_checkpoint.py, `export
--target FILE.gguf`): the per-tensor helpers here serve both.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from pathlib import Path

from ..runtime.errors import ModelFormatError
from ..runtime.publish import publish_dir
from .families import gguf_archs
from .gguf_check import check_gguf, corrupt
from .spec import ArchSpec

GGUF_MAGIC = b"GGUF"
BLOCKS_FILE = "gguf_blocks.safetensors"  # exact low-bit operands beside the float32 checkpoint
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


# GGUF tensor name pattern -> HF name pattern; {i} is the layer index, {p} is weight|bias.
TENSOR_NAMES = {
    "token_embd.{p}": "model.embed_tokens.{p}",
    "output_norm.{p}": "model.norm.{p}",
    "output.{p}": "lm_head.{p}",
    "blk.{i}.attn_norm.{p}": "model.layers.{i}.input_layernorm.{p}",
    "blk.{i}.attn_q.{p}": "model.layers.{i}.self_attn.q_proj.{p}",
    "blk.{i}.attn_k.{p}": "model.layers.{i}.self_attn.k_proj.{p}",
    "blk.{i}.attn_v.{p}": "model.layers.{i}.self_attn.v_proj.{p}",
    "blk.{i}.attn_output.{p}": "model.layers.{i}.self_attn.o_proj.{p}",
    "blk.{i}.attn_q_norm.{p}": "model.layers.{i}.self_attn.q_norm.{p}",
    "blk.{i}.attn_k_norm.{p}": "model.layers.{i}.self_attn.k_norm.{p}",
    "blk.{i}.ffn_norm.{p}": "model.layers.{i}.post_attention_layernorm.{p}",
    "blk.{i}.ffn_gate.{p}": "model.layers.{i}.mlp.gate_proj.{p}",
    "blk.{i}.ffn_up.{p}": "model.layers.{i}.mlp.up_proj.{p}",
    "blk.{i}.ffn_down.{p}": "model.layers.{i}.mlp.down_proj.{p}",
}
_TENSOR_PATTERNS = [
    (
        re.compile(
            re.escape(g).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
            + "$"
        ),
        h,
    )
    for g, h in TENSOR_NAMES.items()
]

# Byte-level BPE pre-tokenizers, keyed by `tokenizer.ggml.pre`; each matches the upstream
# tokenizer.json (and llama.cpp's regexes for that name).
_GPT2 = {"split": None, "digits": False, "ignore_merges": False, "nfc": False}
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {
    "gpt-2": _GPT2,
    "smollm": {**_GPT2, "digits": True},  # StarCoder lineage: every digit is its own piece
    "starcoder": {**_GPT2, "digits": True},
    "qwen2": {**_GPT2, "split": _QWEN2_SPLIT, "nfc": True},
    "deepseek-r1-qwen": {**_GPT2, "split": _QWEN2_SPLIT, "nfc": True},
    "llama-bpe": {**_GPT2, "split": _LLAMA3_SPLIT, "ignore_merges": True},
}
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4  # llama.cpp token types


def import_gguf(gguf_path, out_dir, *, source: dict | None = None) -> Path:
    """Convert `gguf_path` into a HF checkpoint at `out_dir`, atomically; return `out_dir`.

    `source` (package, version, upstream, licence...) is merged into `SOURCE.json`.

        >>> import_gguf("tiny.gguf", "out/tiny", source={"license": "Apache-2.0"})  # doctest: +SKIP
    """
    from safetensors.numpy import save_file

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = open_gguf(gguf_path)
    arch = architecture(reader, gguf_path)
    tensors = read_tensors(reader, arch, gguf_path)
    blocks = read_blocks(reader, arch, gguf_path)
    config = build_config(reader, arch, {n: w.shape for n, w in tensors.items()}, gguf_path)
    tokenizer = build_tokenizer(reader, gguf_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        write_config_files(tmp, reader, gguf_path, config, tokenizer)
        write_blocks(tmp / BLOCKS_FILE, *blocks)
        _write_json(tmp / "SOURCE.json", _source_record(reader, gguf_path, source))
        publish_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def open_gguf(path: Path):
    """A `gguf.GGUFReader` for `path`, or a ModelFormatError saying why the file is not one."""
    import gguf

    if not path.is_file():
        raise ModelFormatError(f"GGUF file {path} does not exist; pass the path of a .gguf file.")
    with open(path, "rb") as f:
        magic = f.read(4)
    if len(magic) == len(GGUF_MAGIC) and magic != GGUF_MAGIC:  # shorter: check_gguf names it
        raise ModelFormatError(
            f"{path} is not a GGUF file (it starts with {magic!r}, expected the magic "
            f"{GGUF_MAGIC!r}); "
            "pass a llama.cpp .gguf model file."
        )
    check_gguf(path)  # sizes bounded by the file before GGUFReader reads
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError) as err:  # e.g. a duplicate key or tensor name
        raise corrupt(path, f"GGUFReader refused it ({err})") from err


def architecture(reader, path: Path) -> str:
    """`general.architecture`, checked against the supported ones."""
    arch = _field(reader, "general.architecture", path)
    archs = gguf_archs()  # the families' GGUF entries (models/families/<model_type>.py)
    if arch not in archs:
        raise ModelFormatError(
            f"{path}: general.architecture {arch!r} is not supported; "
            f"supported: {', '.join(sorted(archs))}."
        )
    return arch


def read_tensors(reader, arch: str, path: Path) -> dict:
    """All tensors, dequantised to float32, under HF names; Q/K un-permuted where needed.

    >>> read_tensors(reader, "llama", path)["model.embed_tokens.weight"].shape  # doctest: +SKIP
    (49152, 576)
    """
    check_tensor_table(reader, arch, path)
    heads = rotary_heads(reader, arch, path)
    # the reader already gives row-major numpy shapes ([out, in]), GGUF's reversed order undone
    return {
        hf_tensor_name(t.name, path): float_weight(t.data, t.tensor_type.name, t.name, heads, path)
        for t in reader.tensors
    }


def read_blocks(reader, arch: str, path: Path) -> tuple[dict, dict]:
    """({HF name: NBitsWeight} for every 2-D low-bit tensor with an exact mapping, {HF name: GGUF
    type} for the low-bit ones without one); Q/K rows un-permuted like the float weights."""
    from .gguf_blocks import TYPES

    heads = rotary_heads(reader, arch, path)
    exact, unmapped = {}, {}
    for t in reader.tensors:
        qtype = t.tensor_type.name
        if not is_low_bit(qtype, t.data.shape):
            continue
        name = hf_tensor_name(t.name, path)
        if qtype not in TYPES:
            unmapped[name] = qtype
            continue
        exact[name] = block_weight(t.data, qtype, t.name, heads, path)
    return exact, unmapped


def is_low_bit(qtype: str, shape) -> bool:
    """A 2-D tensor of a GGUF block type (what MatMulNBits could take exactly)."""
    return qtype not in FLOAT_TYPES and len(shape) == 2


def rotary_heads(reader, arch: str, path: Path) -> dict[str, int]:
    """{GGUF name suffix: head count} of the tensors whose rows llama.cpp permuted (Q and K of a
    `rotary_permuted` architecture); {} when it permutes none."""
    if not gguf_archs()[arch].rotary_permuted:
        return {}
    n_heads = _count(reader, f"{arch}.attention.head_count", path)
    n_kv = _count(reader, f"{arch}.attention.head_count_kv", path, default=n_heads)
    return {".attn_q.weight": n_heads, ".attn_k.weight": n_kv}


def hf_row_order(gguf_name: str, rows: int, heads: dict, path: Path | str = "<gguf>"):
    """The GGUF rows of a tensor in HF order (None: the same order): row i of the HF weight is
    GGUF row order[i]."""
    import numpy as np

    suffix = next((s for s in heads if gguf_name.endswith(s)), None)
    return None if suffix is None else unpermute_rotary(np.arange(rows), heads[suffix], path)


def float_weight(data, qtype: str, gguf_name: str, heads: dict, path: Path | str = "<gguf>"):
    """One tensor (GGUFReader's `data`, or its raw bytes [rows, bytes per row]) dequantised to
    float32, Q/K rows un-permuted (`heads`: `rotary_heads`)."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    w = np.ascontiguousarray(dequantize(data, GGMLQuantizationType[qtype]), dtype=np.float32)
    order = hf_row_order(gguf_name, w.shape[0], heads, path) if w.ndim == 2 else None
    return w if order is None else w[order]


def block_weight(data, qtype: str, gguf_name: str, heads: dict, path: Path | str = "<gguf>"):
    """One low-bit tensor's exact MatMulNBits operands (models/gguf_blocks.py), Q/K rows
    un-permuted like the float weights; UnsupportedQuantType for a type without a mapping."""
    from .gguf_blocks import nbits_operands

    w = nbits_operands(data, qtype, name=hf_tensor_name(gguf_name, path))
    order = hf_row_order(gguf_name, w.n, heads, path)
    return w if order is None else w.rows(order)


def write_blocks(path: Path, exact: dict, unmapped: dict) -> None:
    """`exact` as safetensors `NAME/FIELD` tensors (the GGUF offsets of the embedding table only),
    each weight's layout in the metadata under NAME; the unmapped low-bit types under the key
    `unmapped` (the exporter re-quantises those, with a warning)."""
    from safetensors.numpy import save_file

    arrays = {
        f"{name}/{field}": a
        for name, w in exact.items()
        for field, a in w.arrays().items()
        if field != "offset" or name.endswith("embed_tokens.weight")  # only a table looks rows up
    }
    meta = {name: w.meta() for name, w in exact.items()}
    save_file(arrays, str(path), metadata={**meta, "unmapped": json.dumps(unmapped)})


def unpermute_rotary(w, n_heads: int, path: Path | str = "<gguf>"):
    """Undo llama.cpp's `permute` of Q/K rows (it interleaves each head's two rotary halves).

    >>> unpermute_rotary(np.arange(8.0).reshape(8, 1), 1)[:, 0].tolist()  # doctest: +SKIP
    [0.0, 2.0, 4.0, 6.0, 1.0, 3.0, 5.0, 7.0]
    """
    if w.shape[0] % (2 * n_heads):
        raise ModelFormatError(
            f"{path}: a Q/K weight's {w.shape[0]} rows do not split into "
            f"{n_heads} heads of two rotary halves; the head counts in the "
            f"metadata are wrong: re-download the file"
        )
    half = w.shape[0] // n_heads // 2
    # [rows, *rest] -> [H, half, 2, *rest] -> [H, 2, half, *rest] -> [rows, *rest]
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensor_name(gguf_name: str, path: Path | str = "<gguf>") -> str:
    """The HF name for a GGUF tensor name, e.g. `blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`."""
    for pattern, hf in _TENSOR_PATTERNS:
        m = pattern.match(gguf_name)
        if m:
            return hf.format(**m.groupdict())
    raise ModelFormatError(
        f"{path}: tensor {gguf_name!r} has no Hugging Face equivalent in this importer."
    )


def check_tensor_table(reader, arch: str, path: Path) -> None:
    """Every tensor the architecture needs is present and every tensor has an HF name; else one
    ModelFormatError naming them."""
    present = {t.name for t in reader.tensors}
    expected = _expected_gguf_names(reader, arch, gguf_archs()[arch], path)
    _check_tensor_names(present, expected, path)


def _expected_gguf_names(reader, arch: str, spec: ArchSpec, path: Path) -> set[str]:
    n_layers = _count(reader, f"{arch}.block_count", path, limit=len(reader.tensors))
    per_layer = [
        "attn_norm",
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_norm",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
    ]
    per_layer += ["attn_q_norm", "attn_k_norm"] if spec.qk_norm else []
    names = {f"blk.{i}.{n}.weight" for i in range(n_layers) for n in per_layer}
    if spec.qkv_bias:
        names |= {f"blk.{i}.attn_{x}.bias" for i in range(n_layers) for x in "qkv"}
    return names | {"token_embd.weight", "output_norm.weight"}


def _check_tensor_names(present: set[str], expected: set[str], path: Path) -> None:
    missing = sorted(expected - present)
    if missing:
        raise ModelFormatError(
            f"{path}: missing tensors {_some(missing)}; the GGUF is incomplete or not a plain "
            "decoder model."
        )
    extra = sorted(present - expected - {"output.weight"})
    if extra:
        raise ModelFormatError(
            f"{path}: unexpected tensors {_some(extra)} (e.g. rope-frequency or bias tensors) "
            "that this "
            "importer cannot map; only plain llama / qwen2 / qwen3 decoders are supported."
        )


def _some(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" (+{len(names) - n} more)" if len(names) > n else "")


def build_config(reader, arch: str, shapes: dict, path: Path) -> dict:
    """The HF `config.json` dict for this file (fields named as transformers' config classes name
    them); `shapes`: {HF tensor name: shape}."""
    spec = gguf_archs()[arch]

    def key(name, default=...):
        return _field(reader, f"{arch}.{name}", path, default=default)

    hidden, n_heads = key("embedding_length"), key("attention.head_count")
    head_dim = key("attention.key_length", default=hidden // n_heads)
    q_rows = shapes["model.layers.0.self_attn.q_proj.weight"][0]
    if q_rows != n_heads * head_dim:
        raise ModelFormatError(
            f"{path}: attn_q has {q_rows} rows but {arch}.attention.head_count={n_heads} x "
            f"head_dim={head_dim}; "
            "the metadata does not match the weights."
        )
    return {
        "architectures": [spec.hf_class],
        "model_type": spec.model_type,
        "vocab_size": int(shapes["model.embed_tokens.weight"][0]),
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": key("attention.head_count_kv", default=n_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(key("rope.freq_base", default=10000.0)),
        "rope_scaling": _rope_scaling(reader, arch, path),
        "max_position_embeddings": key("context_length"),
        "tie_word_embeddings": "lm_head.weight" not in shapes,
        "attention_bias": spec.qkv_bias,
        "mlp_bias": False,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id", path, default=None),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id", path, default=None),
        "torch_dtype": "float32",
    }


def _rope_scaling(reader, arch: str, path: Path) -> dict | None:
    kind = _field(reader, f"{arch}.rope.scaling.type", path, default="none")
    if kind == "none":
        return None
    factor = _f32(_field(reader, f"{arch}.rope.scaling.factor", path))
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        orig = _field(reader, f"{arch}.rope.scaling.original_context_length", path)
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
    raise ModelFormatError(
        f"{path}: {arch}.rope.scaling.type {kind!r} is not supported (supported: none, linear, "
        "yarn)."
    )


def build_tokenizer(reader, path: Path):
    """A `tokenizers.Tokenizer` (byte-level BPE) from the `tokenizer.ggml.*` metadata."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    kind = _field(reader, "tokenizer.ggml.model", path)
    if kind != "gpt2":
        raise ModelFormatError(
            f"{path}: tokenizer.ggml.model {kind!r} is not supported; only byte-level BPE "
            "('gpt2') tokenizers are."
        )
    pre = _field(reader, "tokenizer.ggml.pre", path, default="gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise ModelFormatError(
            f"{path}: tokenizer.ggml.pre {pre!r} is not supported; supported: "
            f"{', '.join(sorted(PRE_TOKENIZERS))}."
        )
    spec = PRE_TOKENIZERS[pre]
    tokens = _field(reader, "tokenizer.ggml.tokens", path)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, _merges(reader, path), ignore_merges=spec["ignore_merges"]))
    _set_pre_tokenizer(tok, spec)
    tok.decoder = decoders.ByteLevel()
    types = _field(reader, "tokenizer.ggml.token_type", path, default=[])
    tok.add_special_tokens(
        [
            AddedToken(t, normalized=False, special=True)
            for t, ty in zip(tokens, types)
            if ty == _TOKEN_CONTROL
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, normalized=False, special=False)
            for t, ty in zip(tokens, types)
            if ty == _TOKEN_USER_DEFINED
        ]
    )
    _set_post_processor(tok, reader, tokens, path)
    return tok


def _merges(reader, path: Path) -> list[tuple[str, str]]:
    merges = [tuple(m.split(" ")) for m in _field(reader, "tokenizer.ggml.merges", path)]
    bad = [" ".join(m) for m in merges if len(m) != 2]
    if bad:
        raise ModelFormatError(
            f"{path}: tokenizer.ggml.merges has malformed entries {_some(bad)}; expected 'a b'."
        )
    return merges


def _set_pre_tokenizer(tok, spec: dict) -> None:
    from tokenizers import Regex, normalizers, pre_tokenizers

    if spec["nfc"]:
        tok.normalizer = normalizers.NFC()
    steps = [pre_tokenizers.Digits(individual_digits=True)] if spec["digits"] else []
    if spec["split"] is not None:
        steps.append(pre_tokenizers.Split(Regex(spec["split"]), behavior="isolated", invert=False))
    # With a Split step the regex is already applied; ByteLevel then only maps bytes to its
    # alphabet.
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=spec["split"] is None))
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def _set_post_processor(tok, reader, tokens: list[str], path: Path) -> None:
    from tokenizers import processors

    bos_id = _field(reader, "tokenizer.ggml.bos_token_id", path, default=None)
    if _field(reader, "tokenizer.ggml.add_bos_token", path, default=False) and bos_id is not None:
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)


def _tokenizer_config(reader, config: dict, path: Path) -> dict:
    tokens = _field(reader, "tokenizer.ggml.tokens", path)

    def token(key):
        i = _field(reader, f"tokenizer.ggml.{key}", path, default=None)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", path, default=False)),
        "add_eos_token": bool(_field(reader, "tokenizer.ggml.add_eos_token", path, default=False)),
        "chat_template": _field(reader, "tokenizer.chat_template", path, default=None),
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
    }


def _generation_config(reader, config: dict, path: Path) -> dict:
    eos = [
        config["eos_token_id"],
        _field(reader, "tokenizer.ggml.eot_token_id", path, default=None),
    ]
    eos = [i for n, i in enumerate(eos) if i is not None and i not in eos[:n]]
    return {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id", path, default=None),
    }


def write_config_files(folder: Path, reader, path: Path, config: dict, tokenizer) -> None:
    """config.json, tokenizer.json, tokenizer_config.json and generation_config.json into
    `folder`: everything of a checkpoint but its weights."""
    _write_json(folder / "config.json", config)
    tokenizer.save(str(folder / "tokenizer.json"))
    _write_json(folder / "tokenizer_config.json", _tokenizer_config(reader, config, path))
    _write_json(folder / "generation_config.json", _generation_config(reader, config, path))


def _source_record(reader, gguf_path: Path, source: dict | None) -> dict:
    import gguf

    file_type = _field(reader, "general.file_type", gguf_path, default=None)
    record = {
        "gguf_file": gguf_path.name,
        "gguf_sha256": sha256_file(gguf_path),
        "gguf_name": _field(reader, "general.name", gguf_path, default=None),
        "file_type": gguf.LlamaFileType(file_type).name if file_type is not None else None,
        "license": _field(reader, "general.license", gguf_path, default=None),
        "dequantized_to": "float32",
        "exact_blocks": BLOCKS_FILE,
    }
    return {**record, **(source or {})}


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _field(reader, key: str, path: Path, default=...):
    """A metadata value as a Python value; a missing key without default is a ModelFormatError."""
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise ModelFormatError(
                f"{path}: GGUF metadata key {key!r} is missing; the file is incomplete."
            )
        return default
    return field.contents()


def _count(reader, key: str, path: Path, default=..., limit: int = 1 << 16) -> int:
    """A count from the metadata (layers, heads): an int in [1, limit], else a named
    ModelFormatError (a hostile block_count would otherwise size a loop)."""
    value = _field(reader, key, path, default)
    if type(value) is not int or not 1 <= value <= limit:
        raise ModelFormatError(
            f"{path}: GGUF metadata {key} = {str(value)[:40]!r} is not a count "
            f"in [1, {limit}]; the file is corrupt: re-download it"
        )
    return value


def _f32(x: float) -> float:
    """A float32 metadata value as its shortest decimal (9.999999747e-06 -> 1e-05)."""
    import numpy as np

    return float(str(np.float32(x)))
