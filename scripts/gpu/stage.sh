#!/usr/bin/env bash
# GPU machine, call 1: keep the first half (carried as .gpu/a) in /tmp while the machine stays warm.
set -euo pipefail
mkdir -p /tmp/dfe-gpu && cp .gpu/a/* /tmp/dfe-gpu/
ls -la /tmp/dfe-gpu
nvidia-smi -L || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
