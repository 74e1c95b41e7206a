"""Tokenizer + chat template for a checkpoint or bundle directory (tokenizers + jinja2 only).

>>> tok = ChatTokenizer.from_dir("~/.cache/dflash-edge/models/smollm2-135m-instruct")   # doctest: +SKIP
>>> ids = tok.encode_chat([{"role": "user", "content": "Hi"}])                          # doctest: +SKIP
>>> tok.decode(ids)                                                                      # doctest: +SKIP
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelFormatError

CHAT_TEMPLATE_FILE = "chat_template.jinja"


@dataclass
class ChatTokenizer:
    tokenizer: object                 # tokenizers.Tokenizer
    chat_template: str | None
    bos_token: str | None = None
    eos_token: str | None = None

    @classmethod
    def from_dir(cls, path: str | Path) -> "ChatTokenizer":
        from tokenizers import Tokenizer

        path = Path(path).expanduser()
        tok_file = path / "tokenizer.json"
        if not tok_file.exists():
            raise ModelFormatError(f"{tok_file} not found: the directory needs the tokenizer.json it was built with")
        extra = {}
        cfg_file = path / "tokenizer_config.json"
        try:
            if cfg_file.exists():
                extra = json.loads(cfg_file.read_bytes().decode("utf-8"))
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as err:       # noqa: BLE001 (tokenizers raises plain Exception on a damaged file)
            raise ModelFormatError(f"{path}: tokenizer.json / tokenizer_config.json cannot be read ({err}); the "
                                   f"files are damaged: copy or export them again") from err
        if not isinstance(extra, dict):
            raise ModelFormatError(f"{cfg_file} is not a JSON object; copy or export it again")
        template = extra.get("chat_template")
        if template is None and (path / CHAT_TEMPLATE_FILE).is_file():    # where newer transformers saves it
            template = (path / CHAT_TEMPLATE_FILE).read_text()
        return cls(tokenizer, template,
                   _token_text(extra.get("bos_token")), _token_text(extra.get("eos_token")))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The chat template applied to `messages` (role/content dicts), as text."""
        if not self.chat_template:
            raise ModelFormatError("this model has no chat template: pass a raw prompt (chat=False)")
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt))

    def token_id(self, text: str) -> int:
        tid = self.tokenizer.token_to_id(text)
        if tid is None:
            raise ModelFormatError(f"token {text!r} is not in the vocabulary")
        return tid


def _token_text(tok) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


def _raise(message: str):
    raise ModelFormatError(f"chat template error: {message}")
