#!/usr/bin/env bash
# Here (the CPU machine): stage what the offline GPU machine needs for `train.sh`, under .gpu/ (git-ignored):
#   .gpu/a: the first half of the default model's GGUF (xz), its sha256, the gguf wheel, the training prompts
#   .gpu/b: the second half
# Two halves because one device call carries at most 64 MiB with the working tree (~18 MiB).
#   usage: scripts/gpu/prepare.sh [NUM_PROMPTS]      (default 8192)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
N=${1:-8192}
D=.gpu
grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf "$D" && mkdir -p "$D/a" "$D/b" "$D/tmp"
"$PY" - "$N" <<'PYEOF'
import sys
from pathlib import Path
from dflash_edge.models.fetch import download_default_gguf
from dflash_edge.train.prompts import PromptSpec
from dflash_edge.train.recipe import RecipeConfig, prompt_files

download_default_gguf(Path(".gpu/tmp")).rename(".gpu/tmp/model.gguf")
train, _ = prompt_files(RecipeConfig(work_dir=".gpu/a", prompts=PromptSpec(num_train=int(sys.argv[1]))))
print(f"{len(train)} training prompts (the shipped held-out prompts excluded)")
PYEOF
sha256sum "$D/tmp/model.gguf" | cut -d' ' -f1 > "$D/a/model.gguf.sha256"
xz -9 -T2 -c "$D/tmp/model.gguf" > "$D/tmp/model.gguf.xz"
split -b 44M -d "$D/tmp/model.gguf.xz" "$D/tmp/part."
mv "$D/tmp/part.00" "$D/a/" && mv "$D/tmp/part.01" "$D/b/"
[ ! -e "$D/tmp/part.02" ] || { echo "the GGUF does not fit two parts of 44M" >&2; exit 1; }
GGUF_VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('gguf'))")
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$D/a" "gguf==$GGUF_VERSION"
rm -rf "$D/tmp"
du -sh "$D/a" "$D/b"
echo "staged. Device call 1: carry [.gpu/a], command: bash scripts/gpu/stage.sh"
echo "        device call 2 (at once, while warm): carry [.gpu/b], command: bash scripts/gpu/train.sh"
