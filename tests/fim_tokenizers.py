"""Tiny word-level tokenizers carrying a FIM style's special tokens, and a Generator that uses one.

The tiny models' vocabulary is 96 ids: words `t0`.. fill the low ids and the style's control tokens
the top ones (Qwen2.5-Coder's six at 90..95), so a tiny bundle's graphs run them unchanged.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

VOCAB = 96
SPECIALS = {
    "qwen": [
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ],
    "starcoder": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<reponame>"],
    "codellama": ["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"],
    "none": ["<|im_start|>", "<|im_end|>"],
}


def fim_tokenizer_dir(path: Path, style: str = "qwen", words: dict[str, int] | None = None) -> Path:
    """A tokenizer.json (+ a chat template) at `path`: words t0..tN below the specials of `style`,
    placed at the top ids; `words` renames word ids (e.g. {"<|endoftext|>": 7}: id 7 becomes that
    special token)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    specials = SPECIALS[style]
    first = VOCAB - len(specials)
    vocab = {f"t{i}": i for i in range(first)}
    renamed = {i: w for w, i in (words or {}).items()}
    vocab = {renamed.get(i, w): i for w, i in vocab.items()}
    vocab.update({s: first + i for i, s in enumerate(specials)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True) for s in [*specials, *(words or {})]])
    tok.save(str(path / "tokenizer.json"))
    template = "{% for m in messages %}t1 {{ m['content'] }} t2 {% endfor %}t3"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return path


def with_tokenizer(generator, tok_dir: Path):
    """A shallow copy of `generator` (same graphs and caches, same one-at-a-time guard) reading text
    with the tokenizer in `tok_dir`."""
    from dflash_edge.runtime.fim import find_template
    from dflash_edge.runtime.tokenizer import ChatTokenizer

    gen = copy.copy(generator)
    gen.tokenizer = ChatTokenizer.from_dir(tok_dir)
    gen.fim = find_template(gen.tokenizer)
    return gen
