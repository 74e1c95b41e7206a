"""Export's parity check on a recurrent (Gated DeltaNet) target: a correct fp32 graph of a tiny
Qwen3.5 in the published layout passes where the recurrence has long memory and its keys align
(there the old product-form triangular solve was 0.59 off), and a subtly broken graph is refused by
graph and output name."""

import json

import pytest

from dflash_edge.export import exporter, hybrid_target
from dflash_edge.export.parity import ParityError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# a repeated word (one token: the tiny tokenizer's unknown) -> aligned keys, one 60-token call
LONG_PROMPT = " ".join(["again"] * 60)


@pytest.fixture(scope="module")
def issue_shaped(tmp_path_factory):
    """A Qwen3.5 text checkpoint like issue 46's (8 layers, hidden 128, linear value heads 4 over
    key heads 2, tied embeddings, transformers' init at 0.02) whose linear heads decay slowly
    (A_log = -3: ~0.94 a token), as trained long-memory heads do."""
    import torch
    import transformers

    from tiny import add_tiny_tokenizer

    torch.manual_seed(0)
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    )
    model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.fill_(-3.0)
    path = tmp_path_factory.mktemp("qwen3_5-issue") / "target"
    model.save_pretrained(path)
    add_tiny_tokenizer(path, cfg.vocab_size)
    return path


def _export(path, out):
    """Export `path` with no options but where to write (the parity prompt LONG_PROMPT)."""
    opts = exporter.ExportOptions(out=out, target=str(path), draft="random", max_context=256)
    return exporter.export_bundle(opts, progress=False)


def test_a_correct_fp32_hybrid_export_passes(issue_shaped, tmp_path, monkeypatch):
    monkeypatch.setattr(exporter, "PARITY_PROMPT", LONG_PROMPT)
    out = _export(issue_shaped, tmp_path / "b")
    report = json.loads((out / "manifest.json").read_text())["source"]["parity"]
    # fp32 rounding only (the product-form solve: 0.59)
    assert report["target_hybrid.logits.max_abs_diff"] < 1e-5
    assert report["target_hybrid.next_ids.agreement"] == 1.0


def _beta_flipped(orig):
    def gates(g, h, ckpt, name):  # sigmoid(-b): the write gate's sign flipped
        beta, cum = orig(g, h, ckpt, name)
        return g.op("Sub", [g.scalar(1.0), beta]), cum

    return "_gates", gates


def _decay_off(orig):
    def gates(g, h, ckpt, name):  # the log decay 5% too strong
        beta, cum = orig(g, h, ckpt, name)
        return beta, g.op("Mul", [cum, g.scalar(1.05)])

    return "_gates", gates


def _conv_dropped(orig):
    def commit(g, c, hv, km1):  # the conv state not carried into the next call
        conv, rec = orig(g, c, hv, km1)
        return g.op("Mul", [conv, g.scalar(0.0)]), rec

    return "_commit", commit


@pytest.mark.parametrize(
    "name, breaking",
    [("_gates", _beta_flipped), ("_gates", _decay_off), ("_commit", _conv_dropped)],
)
def test_a_broken_hybrid_graph_is_refused(issue_shaped, tmp_path, monkeypatch, name, breaking):
    monkeypatch.setattr(exporter, "PARITY_PROMPT", LONG_PROMPT)
    attr, broken = breaking(getattr(hybrid_target, name))
    monkeypatch.setattr(hybrid_target, attr, broken)
    with pytest.raises(ParityError, match=r"graph 'target_hybrid' output '\w+'"):
        _export(issue_shaped, tmp_path / "b")
    assert not (tmp_path / "b").exists()
