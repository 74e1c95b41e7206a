"""Per-channel scaling of the target features fed to the drafter's `fc`, folded into `fc` on save.

The target's hidden states differ in scale by layer (RMS ~2.7 at layer 1, ~27 at layer 27 for
SmolLM2) and carry a few outlier channels (RMS 100-450, and ~2.5e4 at the first token). Adam moves
every weight by about the learning rate, so through raw features the outlier channels dominate
`fc`'s output and the informative ones learn slowly. Training reparametrises
`fc.weight = W * (1 / s)` with `s` the per-channel RMS of the training features: the optimiser
sees unit-scale inputs, and the effective weight (what inference and the z-lab file hold) is the
plain `fc.weight`, so the saved format does not change.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize


class InputScale(nn.Module):
    """Parametrization: weight [out, in] -> weight * inv_scale[None, :]."""

    def __init__(self, inv_scale: torch.Tensor):
        super().__init__()
        self.register_buffer("inv_scale", inv_scale.float().clone())

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.inv_scale.to(weight.dtype)

    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        return weight / self.inv_scale.to(weight.dtype)


def feature_rows(samples, max_rows: int) -> torch.Tensor:
    """fp32 features [>= max_rows or all, n_ids*H] of the first samples (first token skipped:
    massive activations); stops reading (the shards are memory-mapped) once `max_rows` rows are
    in."""
    rows, total = [], 0
    for s in samples:
        f = s.features[1:]
        rows.append(f)
        total += len(f)
        if total >= max_rows:
            break
    return torch.cat(rows).float()


def feature_rms(samples, max_rows: int = 200_000) -> torch.Tensor:
    """[n_ids*H] per-channel RMS of the features of `samples`."""
    rms = feature_rows(samples, max_rows).pow(2).mean(0).sqrt()
    return rms.clamp(min=1e-2 * rms.median().clamp(min=1e-6).item())


def scale_fc_inputs(drafter, scale: torch.Tensor, init_std: float | None = 0.02) -> None:
    """Train `drafter.fc` on inputs divided by `scale`.

    With `init_std` the trained weight is redrawn from N(0, init_std) (a fresh drafter: every
    channel starts alike); with None the current effective weight is kept.
    """
    parametrize.register_parametrization(drafter.fc, "weight", InputScale(1.0 / scale))
    if init_std is not None:
        with torch.no_grad():
            drafter.fc.parametrizations.weight.original.normal_(0.0, init_std)
