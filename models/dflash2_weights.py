"""DFlash2 drafters made here rather than loaded: random ones (tests, benchmarks) and DFlash1
drafters converted with a neutral conv and a zero selector (issue 38: they draft exactly what the
DFlash1 drafter drafts).

>>> model = from_dflash1(load_drafter("dflash1/"), DFlash2Config(**vars(cfg)))  # doctest: +SKIP
"""

from __future__ import annotations

import torch

from .dflash2_config import DFlash2Config
from .drafter import DFlashDrafter


def new_dflash2(cfg: DFlash2Config, seed: int = 0, conv_std: float = 0.02) -> DFlashDrafter:
    """A randomly initialised DFlash2 drafter: matrices ~N(0, 0.02), codebooks ~N(0, 1), unit
    norms, conv base taps ~N(0, conv_std) plus 1 on tap 0 (the identity conv, perturbed)."""
    model = DFlashDrafter(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_codebook"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
            elif name.endswith("base_kernel"):
                p.copy_(torch.randn(p.shape, generator=g) * conv_std)
                p[:, 0] += 1.0
    return model.eval()


def from_dflash1(drafter: DFlashDrafter, cfg: DFlash2Config) -> DFlashDrafter:
    """`drafter`'s weights in a DFlash2 drafter with a neutral conv (tap 0 = 1, the other taps and
    the kernel projections 0) and a zero selector."""
    model = DFlashDrafter(cfg)
    missing, unexpected = model.load_state_dict(drafter.state_dict(), strict=False)
    if unexpected:
        raise ValueError(f"not a DFlash1 drafter of these dims: unexpected tensors {unexpected}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in missing:
                p.zero_()
                if name.endswith("base_kernel"):
                    p[:, 0] = 1.0
    return model.eval()
