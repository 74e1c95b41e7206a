"""Our DFlash2 torch reference (models/dflash2.py) vs z-lab's own DFlash2 forward on one random
drafter: the block's hidden states, the candidates, the greedy path and the sampled path's q rows.

z-lab's code is not shipped or fetched here: pass the path of its `dflash/model.py` (z-lab/dflash,
a commit with `DFlash2DraftModel`). Prints the largest differences; exits 1 on a mismatch.

    python benchmarks/dflash2_zlab_check.py --zlab /path/to/z-lab/dflash/dflash/model.py
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

from dflash_edge.models.dflash2 import draft_lattice, greedy_walk
from dflash_edge.models.dflash2_config import DFlash2Config
from dflash_edge.models.dflash2_weights import new_dflash2

RAW = {
    "architectures": ["DFlash2DraftModel"],
    "is_causal": False,
    "dflash_config": {
        "block_size": 8,
        "conv_group_size": 16,
        "conv_kernel_size": 2,
        "mask_token_id": 3,
        "selector_rank": 24,
        "selector_top_k": 16,
        "output_multiplier": 0.75,
        "final_logit_softcapping": 20.0,
        "target_layer_ids": [1, 3],
    },
    "attention_bias": False,
    "attention_dropout": 0.0,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 128,
    "layer_types": ["sliding_attention"] * 3,
    "max_position_embeddings": 256,
    "model_type": "qwen3",
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "num_target_layers": 6,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "sliding_window": 6,  # smaller than context + block: the two-sided window matters
    "tie_word_embeddings": False,
    "use_sliding_window": True,
    "vocab_size": 300,
}


def load_zlab(path: str):
    spec = importlib.util.spec_from_file_location("zlab_dflash_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zlab", required=True, help="z-lab/dflash's dflash/model.py")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    zlab = load_zlab(args.zlab)
    from transformers import Qwen3Config

    torch.manual_seed(args.seed)
    ours = new_dflash2(DFlash2Config.from_dict(RAW), seed=args.seed, conv_std=0.3)
    zcfg = Qwen3Config(**{k: v for k, v in RAW.items() if k != "architectures"})
    zcfg.dflash_config, zcfg.is_causal = RAW["dflash_config"], False
    theirs = zlab.DFlash2DraftModel(zcfg).eval()
    state = {
        (k + ".weight" if k.endswith("_codebook") else k): v for k, v in ours.state_dict().items()
    }
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    assert not missing and not unexpected, (missing, unexpected)

    h, v, ctx_len, block = RAW["hidden_size"], RAW["vocab_size"], 10, 8
    embed, head = torch.randn(v, h), torch.nn.Linear(h, v, bias=False)
    ctx = torch.randn(1, ctx_len, 2 * h)
    ids = torch.tensor([[7] + [RAW["dflash_config"]["mask_token_id"]] * (block - 1)])
    noise = embed[ids]
    positions = torch.arange(ctx_len + block)
    worst = {}
    with torch.no_grad():
        empty = torch.zeros(1, RAW["num_key_value_heads"], 0, RAW["head_dim"])
        mine, _, _ = ours.step(
            noise,
            positions[ctx_len:],
            ctx,
            positions[:ctx_len],
            [empty] * 3,
            [empty] * 3,
        )
        zl = theirs(position_ids=positions[None], noise_embedding=noise, target_hidden=ctx)
        worst["hidden"] = float((mine - zl).abs().max())
        rows = zl[:, 1:]
        cand, scores = draft_lattice(ours, head, rows, ids[:, 0])
        path = greedy_walk(cand, scores)
        zpath, zcand, _ = theirs.propose(rows, ids[:, 0], head, 0.0)
        same_cands = bool((cand.sort(-1).values == zcand.sort(-1).values).all())
        worst["greedy_path_mismatches"] = int((path != zpath).sum())
        torch.manual_seed(1)
        spath, scand, q = theirs.propose(rows, ids[:, 0], head, 0.7)
        prev, qdiff = 0, 0.0
        for r in range(block - 1):
            mine_q = torch.softmax(scores[0, r, prev] / 0.7, -1)
            order = [int((scand[0, r] == t).nonzero()) for t in cand[0, r]]
            qdiff = max(qdiff, float((mine_q - q[0, r, order]).abs().max()))
            prev = int((cand[0, r] == spath[0, r]).nonzero())
        worst["sampled_q"] = qdiff
    print(f"candidates equal as sets: {same_cands}")
    for name, value in worst.items():
        print(f"{name}: {value:.3g}")
    ok = same_cands and worst["hidden"] < 1e-4 and not worst["greedy_path_mismatches"]
    ok = ok and worst["sampled_q"] < 1e-5
    print("MATCH" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
