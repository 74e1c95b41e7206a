"""A tiny GGUF written the way llama.cpp's converter writes one (Q/K rows permuted for `llama`,
byte-level BPE metadata), shared by the import tests and the low-bit export tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

DIMS = dict(n_layers=2, hidden=32, n_heads=4, n_kv=2, ffn=64)
HEAD_DIM = DIMS["hidden"] // DIMS["n_heads"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, in byte order."""
    keep = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(0xA1, 0xAC + 1))
        + list(range(0xAE, 0xFF + 1))
    )
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def tiny_vocab() -> list[str]:
    return SPECIALS + byte_alphabet() + [m.replace(" ", "") for m in MERGES]


def llamacpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's `LlamaModel.permute` (the forward direction)."""
    # [rows, in] -> [H, 2, half, in] -> [H, half, 2, in] -> [rows, in]
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_weights(arch: str, *, untied: bool, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under HF names, in HF layout ([out, in])."""
    rng = np.random.default_rng(seed)
    h, f, kv = DIMS["hidden"], DIMS["ffn"], DIMS["n_kv"] * HEAD_DIM
    r = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    w = {"model.embed_tokens.weight": r(len(tiny_vocab()), h), "model.norm.weight": r(h)}
    if untied:
        w["lm_head.weight"] = r(len(tiny_vocab()), h)
    for i in range(DIMS["n_layers"]):
        p = f"model.layers.{i}."
        w |= {
            p + "self_attn.q_proj.weight": r(h, h),
            p + "self_attn.k_proj.weight": r(kv, h),
            p + "self_attn.v_proj.weight": r(kv, h),
            p + "self_attn.o_proj.weight": r(h, h),
            p + "mlp.gate_proj.weight": r(f, h),
            p + "mlp.up_proj.weight": r(f, h),
            p + "mlp.down_proj.weight": r(h, f),
            p + "input_layernorm.weight": r(h),
            p + "post_attention_layernorm.weight": r(h),
        }
        if arch == "qwen3":
            w |= {
                p + "self_attn.q_norm.weight": r(HEAD_DIM),
                p + "self_attn.k_norm.weight": r(HEAD_DIM),
            }
        if arch == "qwen2":
            w |= {p + f"self_attn.{x}_proj.bias": r(h if x == "q" else kv) for x in "qkv"}
    return w


def gguf_name(hf: str) -> str:
    """Inverse of the importer's table, written out independently for the test."""
    table = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in fixed:
        return fixed[hf]
    _, _, i, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{table[module]}.{kind}"


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    *,
    untied: bool = False,
    drop: tuple = (),
    types: dict | None = None,
    tokenizer_model: str = "gpt2",
) -> dict:
    """Write a tiny GGUF as llama.cpp would; return the HF-layout weights it encodes (dequantised
    where stored quantised). `types`: GGUF name suffix (e.g. "ffn_up.weight") -> quantisation type
    name for those tensors; the embedding is Q8_0 unless `types` names "token_embd.weight"."""
    weights = hf_weights(arch, untied=untied)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(DIMS["n_layers"])
    w.add_context_length(256)
    w.add_embedding_length(DIMS["hidden"])
    w.add_feed_forward_length(DIMS["ffn"])
    w.add_head_count(DIMS["n_heads"])
    w.add_head_count_kv(DIMS["n_kv"])
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_license("apache-2.0")
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tiny_vocab())
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tiny_vocab()) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)
    for hf, arr in weights.items():
        name = gguf_name(hf)
        if name in drop:
            continue
        if arch == "llama" and name.endswith(".attn_q.weight"):
            arr = llamacpp_permute(arr, DIMS["n_heads"])
        elif arch == "llama" and name.endswith(".attn_k.weight"):
            arr = llamacpp_permute(arr, DIMS["n_kv"])
        qtype = next(
            (
                t
                for suffix, t in {"token_embd.weight": "Q8_0", **(types or {})}.items()
                if name.endswith(suffix)
            ),
            None,
        )
        if qtype:  # quantised as real files are; the HF weights become what it encodes
            kind = gguf.GGMLQuantizationType[qtype]
            raw = gguf.quants.quantize(arr, kind)
            w.add_tensor(name, raw, raw_dtype=kind)
            weights[hf] = gguf.quants.dequantize(raw, kind)
            if arch == "llama" and name.endswith(
                (".attn_q.weight", ".attn_k.weight")
            ):  # as the importer un-permutes
                heads = DIMS["n_heads"] if name.endswith(".attn_q.weight") else DIMS["n_kv"]
                weights[hf] = _unpermute(weights[hf], heads)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The inverse of `llamacpp_permute`."""
    return (
        w.reshape(n_heads, w.shape[0] // n_heads // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )
