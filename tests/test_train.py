"""The distillation recipe on a tiny random target: tier 1 (seconds), but the two whole training
runs are tier 2."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_edge.models.drafter import DraftConfig, load_drafter, new_drafter, save_drafter
from dflash_edge.models.reference_loop import GenerationConfig, target_generate
from dflash_edge.train.dataset import block_keep, make_batch
from dflash_edge.train.evaluate import EvalSpec, reference_eval, replay_eval
from dflash_edge.train.objective import block_hidden, decay_weights, simulated_tau
from dflash_edge.train.responses import GenSpec, generate_batch, load_shard, write_shards
from dflash_edge.train.trainer import RunOptions, TrainConfig, train_drafter

CAPTURE, BLOCK, MASK = (1, 3), 4, 95


def random_prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, 90, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def fresh_drafter(target, seed: int = 0):
    cfg = DraftConfig.for_target(
        target.config,
        num_layers=1,
        block_size=BLOCK,
        mask_token_id=MASK,
        target_layer_ids=list(CAPTURE),
    )
    return new_drafter(cfg, seed=seed)


def learning_run(steps: int) -> TrainConfig:
    """The short recipe the learning tests train with: 8 sequences x 8 anchors a step, lr 1e-2."""
    return TrainConfig(
        steps=steps,
        seqs_per_step=8,
        anchors_per_seq=8,
        gamma=2.0,
        lr=1e-2,
        warmup=5,
        head_dtype="float32",
    )


@pytest.fixture(scope="module")
def samples(tiny_target, tmp_path_factory):
    out = tmp_path_factory.mktemp("responses")
    spec = GenSpec(
        capture=CAPTURE, max_new_tokens=40, batch_size=8, sampled_fraction=0.0, dtype="float32"
    )
    paths = write_shards(tiny_target, random_prompts(48, seed=1), out, spec)
    return [s for p in paths for s in load_shard(p)]


def test_batched_generation_matches_target_and_features(tiny_target):
    prompts = random_prompts(5, seed=7)
    spec = GenSpec(capture=CAPTURE, max_new_tokens=12, sampled_fraction=0.0)
    out = generate_batch(tiny_target, prompts, spec, torch.Generator().manual_seed(0))
    for p, s in zip(prompts, out):
        ref = target_generate(tiny_target, p, GenerationConfig(max_new_tokens=12))
        assert s.tokens[len(p) :].tolist() == ref.token_ids
        full = tiny_target(s.tokens[None, :-1], tiny_target.new_cache(64), capture=CAPTURE).hidden[
            0
        ]
        torch.testing.assert_close(s.features.float(), full, atol=2e-3, rtol=1e-2)


def test_block_mask_sees_strict_past_and_own_block_only():
    keep = block_keep(torch.tensor([3, 6]), ctx_len=8, block=BLOCK)  # [2*B, 8 + 2*B]
    ctx, blocks = keep[:, :8], keep[:, 8:]
    assert ctx[:BLOCK].sum(1).tolist() == [3] * BLOCK and ctx[BLOCK:].sum(1).tolist() == [6] * BLOCK
    assert blocks[:BLOCK, :BLOCK].all() and blocks[BLOCK:, BLOCK:].all()  # bidirectional inside
    assert not blocks[:BLOCK, BLOCK:].any() and not blocks[BLOCK:, :BLOCK].any()  # no other block
    near = block_keep(torch.tensor([3, 6]), ctx_len=8, block=BLOCK, window=2)[
        :, :8
    ]  # curriculum window
    assert near[0].nonzero().flatten().tolist() == [1, 2] and near[
        BLOCK
    ].nonzero().flatten().tolist() == [4, 5]
    assert torch.equal(near, ctx & near) and torch.equal(
        block_keep(torch.tensor([3, 6]), 8, BLOCK, window=0), keep
    )


def test_training_forward_equals_inference_forward(tiny_target, samples):
    drafter, s = fresh_drafter(tiny_target), samples[0]
    anchors = torch.tensor([s.prompt_len, s.prompt_len + 3])
    batch = make_batch([s], [anchors], BLOCK, MASK)
    with torch.no_grad():
        train_h = block_hidden(drafter, tiny_target.model.embed_tokens, batch)[0].view(2, BLOCK, -1)
        for j, a in enumerate(anchors.tolist()):
            ids = torch.full((1, BLOCK), MASK)
            ids[0, 0] = s.tokens[a]
            ctx = s.features[None, :a].float()  # strictly before the anchor
            infer_h = drafter(tiny_target.model.embed_tokens(ids), ctx, drafter.new_cache(64))
            torch.testing.assert_close(train_h[j], infer_h[0], atol=1e-4, rtol=1e-4)
    assert (
        batch.labels.view(2, BLOCK)[0].tolist()
        == [-100] + s.tokens[s.prompt_len + 1 : s.prompt_len + BLOCK].tolist()
    )


def test_decay_weights_and_replayed_tau():
    w = decay_weights(4, gamma=2.0)
    assert w[0] == 0 and w[1] == 1 and torch.isclose(w[3], torch.exp(torch.tensor(-1.0)))
    # anchors 10..19; 2 accepted at 10 -> next anchor 13 (3 tokens), 0 at 13 -> 14, ...
    acc = torch.tensor([2, 0, 0, 0, 1, 0, 0, 0, 0, 0])
    assert simulated_tau(acc, 10, 20, budget=100)[:3] == [3, 1, 2]


@pytest.mark.tier2  # a whole training run (70-105 s on 2 loaded cores): too slow for the fast tier
def test_training_raises_acceptance_well_above_random(tiny_target, samples):
    # A random tiny target has no structure beyond its own repetitions, so a seconds-long run is
    # measured on (a part of) what it was trained on; held-out prompts are for the real recipe.
    train, held = samples, samples[:12]
    spec = EvalSpec(block_size=BLOCK, max_new_tokens=40)
    cats = ["all"] * len(held)
    head = tiny_target.lm_head.weight.detach()
    drafter = fresh_drafter(tiny_target)
    before = replay_eval(drafter, tiny_target.model.embed_tokens, head, held, cats, spec).tau()
    losses = train_drafter(
        tiny_target,
        drafter,
        train,
        learning_run(60),
    )
    after = replay_eval(drafter, tiny_target.model.embed_tokens, head, held, cats, spec)
    print(
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; replayed tau {before:.3f} -> {after.tau():.3f}"
    )
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 0.15
    assert after.tau() > before + 0.2, (before, after.tau())
    assert (
        after.position_rates()[0]
        > 0.15
        > 0.05
        > replay_eval(
            fresh_drafter(tiny_target), tiny_target.model.embed_tokens, head, held, cats, spec
        ).position_rates()[0]
    )
    ref = reference_eval(
        tiny_target, drafter, [s.tokens[: s.prompt_len].tolist() for s in held], cats, spec
    )
    assert abs(ref.tau() - after.tau()) < 0.25  # replay == reference loop


def test_checkpoint_resume_continues_exactly(tiny_target, samples, tmp_path):
    cfg = TrainConfig(
        steps=6, seqs_per_step=4, anchors_per_seq=4, ckpt_minutes=0, head_dtype="float32"
    )
    whole = fresh_drafter(tiny_target)
    train_drafter(tiny_target, whole, samples, cfg)

    def interrupt(drafter, step):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_drafter(
            tiny_target,
            fresh_drafter(tiny_target),
            samples,
            cfg,
            RunOptions(tmp_path, on_eval=interrupt, eval_every=3),
        )
    resumed = fresh_drafter(tiny_target, seed=123)  # weights come from the checkpoint
    train_drafter(tiny_target, resumed, samples, cfg, RunOptions(tmp_path, resume=True))
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


def test_saved_drafter_is_zlab_format(tiny_target, tmp_path):
    drafter = fresh_drafter(tiny_target)
    out = save_drafter(drafter, tmp_path / "d", extra_files={"README.md": "card"})
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == BLOCK
    assert cfg["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": list(CAPTURE)}
    loaded = load_drafter(out, target_config=tiny_target.config)
    assert set(loaded.state_dict()) == set(drafter.state_dict())


def test_prompt_corpus_is_balanced_and_heldout_disjoint():
    from dflash_edge.train.prompts import (
        CATEGORIES,
        HELDOUT_FILE,
        PromptSpec,
        build_prompts,
        read_jsonl,
    )

    train, held = build_prompts(PromptSpec(num_train=120, num_heldout=12))
    assert {r["category"] for r in train} == set(CATEGORIES) == {r["category"] for r in held}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    shipped = read_jsonl(HELDOUT_FILE)
    assert len(shipped) >= 40 and all(r["prompt"] and r["category"] in CATEGORIES for r in shipped)


def test_feature_scaling_trains_and_folds_into_fc_on_save(tiny_target, samples, tmp_path):
    from dflash_edge.train.conditioning import feature_rms, scale_fc_inputs

    drafter = fresh_drafter(tiny_target)
    scale = feature_rms(samples)
    assert scale.shape == (len(CAPTURE) * tiny_target.config.hidden_size,) and (scale > 0).all()
    scale_fc_inputs(drafter, scale)
    raw = drafter.fc.parametrizations.weight.original
    torch.testing.assert_close(drafter.fc.weight, raw / scale)  # effective = trained / scale
    before = raw.detach().clone()
    train_drafter(
        tiny_target,
        drafter,
        samples,
        TrainConfig(steps=3, seqs_per_step=4, anchors_per_seq=4, head_dtype="float32"),
    )
    assert not torch.equal(
        drafter.fc.parametrizations.weight.original, before
    )  # the optimiser moves W
    batch = make_batch([samples[0]], [torch.tensor([samples[0].prompt_len])], BLOCK, MASK)
    loaded = load_drafter(
        save_drafter(drafter, tmp_path / "d", dtype=torch.float32), tiny_target.config
    )
    assert set(loaded.state_dict()) == set(
        fresh_drafter(tiny_target).state_dict()
    )  # plain z-lab names
    with torch.no_grad():
        want = block_hidden(drafter, tiny_target.model.embed_tokens, batch)
        got = block_hidden(loaded, tiny_target.model.embed_tokens, batch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_dtype_auto_resolves_to_a_real_dtype():
    from dflash_edge.train.hardware import resolve_dtype

    assert (
        resolve_dtype("auto") in ("float32", "bfloat16") and resolve_dtype("float32") == "float32"
    )


def test_target_init_copies_the_layers_above_the_deepest_feature(tiny_target, samples):
    """Drafter layer 0 starts as target layer 4 (above capture 3): its context K/V are the
    target's."""
    from dflash_edge.train.target_init import copied_layer_ids, init_from_target

    assert copied_layer_ids(30, 27, 2) == [28, 29] and copied_layer_ids(30, 29, 2) == [28, 29]
    drafter = fresh_drafter(tiny_target)
    assert init_from_target(drafter, tiny_target, samples) == [4]
    s = samples[0]
    target_cache, draft_cache = tiny_target.new_cache(64), drafter.new_cache(64)
    with torch.no_grad():
        tiny_target(s.tokens[None, : len(s.features)], target_cache)
        drafter(
            tiny_target.model.embed_tokens(torch.full((1, BLOCK), MASK)),
            s.features[None].float(),
            draft_cache,
        )
    for got, want in zip(draft_cache.past(0), target_cache.past(4)):  # (K, V) of the context
        torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-2)  # fp16 features


def test_unknown_or_missing_device_is_a_clear_error():
    from dflash_edge.train.hardware import DeviceError, resolve_device

    assert resolve_device("cpu") == "cpu" and resolve_device("auto") in ("cpu", "cuda")
    with pytest.raises(DeviceError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="sees no CUDA GPU.*--device cpu"):
            resolve_device("cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
def test_generation_and_training_on_cuda_agree_with_cpu(tiny_target, samples):
    import copy

    gpu_target = copy.deepcopy(tiny_target).to("cuda")
    prompts = random_prompts(6, seed=11)
    spec = GenSpec(capture=CAPTURE, max_new_tokens=16, sampled_fraction=0.5, dtype="float32")
    cpu = generate_batch(tiny_target, prompts, spec, torch.Generator().manual_seed(3))
    gpu = generate_batch(gpu_target, prompts, spec, torch.Generator().manual_seed(3))
    for a, b in zip(cpu, gpu):
        assert a.tokens.tolist() == b.tokens.tolist() and b.features.device.type == "cpu"
        torch.testing.assert_close(a.features, b.features, atol=2e-3, rtol=1e-2)
    cfg = dict(
        steps=20, seqs_per_step=4, anchors_per_seq=4, lr=1e-2, warmup=2, head_dtype="float32"
    )
    on_cpu, on_gpu = fresh_drafter(tiny_target), fresh_drafter(tiny_target)
    lc = train_drafter(tiny_target, on_cpu, samples, TrainConfig(**cfg))
    lg = train_drafter(
        gpu_target, on_gpu, samples, TrainConfig(**cfg, device="cuda", loader_workers=2)
    )  # pinned batches
    assert abs(lc[-1] - lg[-1]) < 0.05 * lc[-1], (
        lc[-1],
        lg[-1],
    )  # TF32 on the GPU: close, not equal
    spec_e = EvalSpec(block_size=BLOCK, max_new_tokens=40)
    held, cats = samples[:6], ["all"] * 6
    tau_c = replay_eval(
        on_cpu, tiny_target.model.embed_tokens, tiny_target.lm_head.weight, held, cats, spec_e
    ).tau()
    tau_g = replay_eval(
        on_gpu, gpu_target.model.embed_tokens, gpu_target.lm_head.weight, held, cats, spec_e
    ).tau()
    assert abs(tau_c - tau_g) < 0.2, (tau_c, tau_g)


def test_batch_workers_match_inline_batches_and_time_budget_stops_early(
    tiny_target, samples, tmp_path
):
    cfg = dict(steps=5, seqs_per_step=4, anchors_per_seq=4, head_dtype="float32")
    inline = train_drafter(tiny_target, fresh_drafter(tiny_target), samples, TrainConfig(**cfg))
    ahead = train_drafter(
        tiny_target, fresh_drafter(tiny_target), samples, TrainConfig(**cfg, loader_workers=2)
    )
    assert ahead == inline  # same batches, same order
    seen = []
    budget = TrainConfig(**{**cfg, "steps": 100_000}, max_minutes=0.01)  # 0.6 s
    losses = train_drafter(
        tiny_target,
        fresh_drafter(tiny_target),
        samples,
        budget,
        RunOptions(tmp_path, on_eval=lambda d, step: seen.append(step)),
    )
    assert 0 < len(losses) < 100_000 and seen == [len(losses)]
    assert torch.load(tmp_path / "last.pt", weights_only=False)["step"] == len(losses)


@pytest.mark.tier2  # a whole training run (70-105 s on 2 loaded cores): too slow for the fast tier
def test_train_cli_data_stage_then_training_to_a_saved_drafter(tiny_checkpoints, tmp_path):
    from dflash_edge.cli import main

    work, out = tmp_path / "work", tmp_path / "drafter"
    args = [
        "train",
        "--target",
        tiny_checkpoints["llama"][1],
        "--out",
        str(out),
        "--work-dir",
        str(work),
        "--prompts",
        "24",
        "--max-new-tokens",
        "12",
        "--gen-batch",
        "8",
        "--layers",
        "1",
        "--block-size",
        "4",
        "--capture",
        "1,3",
        "--steps",
        "6",
        "--eval-every",
        "3",
        "--eval-prompts",
        "6",
        "--device",
        "cpu",
    ]
    assert main(args + ["--data-only"]) == 0
    assert len(list((work / "responses").glob("shard_*.pt"))) == 3 and (work / "heldout").is_dir()
    assert not out.exists() and not list(work.glob("ckpt-*"))  # no training yet
    assert main(args + ["--resume", "--init", "target", "--soft-topk", "4"]) == 0
    assert len(list((work / "responses").glob("soft_*_k4.pt"))) == 3
    best = json.loads((work / "best.json").read_text())
    assert best["step"] in (3, 6) and (out / "README.md").is_file()
    assert (
        json.loads((out / "config.json").read_text())["block_size"] == 4
        and (out / "model.safetensors").is_file()
    )
    prompts = tmp_path / "held.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"prompt": p, "category": c}) + "\n"
            for p, c in [
                ("a b c", "x"),
                ("hello there", "y"),
                ("q", "x"),
                ("one two three four", "y"),
            ]
        )
    )
    ev = [
        "eval-drafter",
        "--target",
        tiny_checkpoints["llama"][1],
        "--draft",
        str(out),
        "--prompts",
        str(prompts),
        "--max-new-tokens",
        "16",
    ]
    assert main(ev + ["--json", str(tmp_path / "ref.json")]) == 0
    assert main(ev + ["--replay", "--json", str(tmp_path / "replay.json")]) == 0
    ref, rep = (json.loads((tmp_path / f).read_text()) for f in ("ref.json", "replay.json"))
    assert ref["verify_steps"] > 4 and {k: v for k, v in ref.items() if k != "prompts"} == {
        k: v for k, v in rep.items() if k != "prompts"
    }  # the same acceptance either way
    assert main(args + ["--device", "tpu"]) == 2  # a clear error, not a traceback


def test_soft_targets_are_the_targets_distributions_and_train(tiny_target, samples, tmp_path):
    import dataclasses
    import os

    from dflash_edge.train.dataset import anchor_range
    from dflash_edge.train.objective import DraftHead, dflash_loss
    from dflash_edge.train.soft_targets import attach_soft_targets, next_token_logits, soft_path

    s = samples[0]
    full = tiny_target(s.tokens[None, :-1], tiny_target.new_cache(64)).logits[0, s.prompt_len - 1 :]
    torch.testing.assert_close(
        next_token_logits(tiny_target, s, CAPTURE), full, atol=2e-2, rtol=1e-2
    )
    shards = write_shards(
        tiny_target,
        random_prompts(16, seed=5),
        tmp_path,
        GenSpec(
            capture=CAPTURE, max_new_tokens=20, batch_size=8, sampled_fraction=0.0, dtype="float32"
        ),
    )
    per_shard = [load_shard(p) for p in shards]
    attach_soft_targets(tiny_target, shards, per_shard, CAPTURE, k=4)
    files = [soft_path(p, 4) for p in shards]
    stamps = [os.stat(f).st_mtime_ns for f in files]
    again = [load_shard(p) for p in shards]
    attach_soft_targets(tiny_target, shards, again, CAPTURE, k=4)  # cached, not recomputed
    assert [os.stat(f).st_mtime_ns for f in files] == stamps
    torch.testing.assert_close(again[1][3].soft_logp, per_shard[1][3].soft_logp)
    flat = [x for group in per_shard for x in group]
    # greedy responses: the target's top-1 is the next token (fp16 features may flip a rare
    # near-tie)
    top1 = torch.cat([x.soft_ids[x.prompt_len - 1 :, 0] for x in flat])
    nxt = torch.cat([x.tokens[x.prompt_len :] for x in flat])
    assert (top1 == nxt).float().mean() > 0.95
    batch = make_batch(
        flat[:2],
        [torch.tensor([flat[0].prompt_len + 1]), torch.tensor([flat[1].prompt_len])],
        BLOCK,
        MASK,
    )
    lab = batch.labels != -100
    torch.testing.assert_close(batch.soft_p.sum(-1)[lab], torch.ones(int(lab.sum())))
    assert (batch.soft_p.sum(-1)[~lab] == 0).all()
    assert (batch.soft_ids[..., 0][lab] == batch.labels[lab]).float().mean() > 0.9
    # the soft loss trains: it falls, and ids outside a reduced head are dropped, not mislabelled
    drafter, head = (
        fresh_drafter(tiny_target),
        DraftHead.build(tiny_target.lm_head.weight, torch.float32),
    )
    losses = train_drafter(
        tiny_target,
        drafter,
        flat,
        learning_run(40),
    )
    assert sum(losses[-8:]) / 8 < sum(losses[:8]) / 8 - 0.05  # above a floor: the entropy
    every = make_batch(flat[:4], [torch.arange(*anchor_range(x)) for x in flat[:4]], BLOCK, MASK)
    hits = [
        dflash_loss(d, tiny_target.model.embed_tokens, head, every, gamma=2.0).correct[0]
        for d in (fresh_drafter(tiny_target), drafter)
    ]
    assert hits[1] > 2 * hits[0] + 5, hits  # first block position
    small = DraftHead.build(tiny_target.lm_head.weight, torch.float32, torch.arange(0, 96, 2))
    out = dflash_loss(drafter, tiny_target.model.embed_tokens, small, batch, gamma=2.0)
    assert torch.isfinite(out.loss)
    hard = dflash_loss(
        drafter,
        tiny_target.model.embed_tokens,
        head,
        dataclasses.replace(batch, soft_ids=None),
        gamma=2.0,
    )
    soft = dflash_loss(drafter, tiny_target.model.embed_tokens, head, batch, gamma=2.0)
    assert not torch.isclose(hard.loss, soft.loss) and torch.equal(hard.correct, soft.correct)
