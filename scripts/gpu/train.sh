#!/usr/bin/env bash
# GPU machine, call 2 (right after stage.sh, while the machine is warm; carry [.gpu/b]):
# rebuild the default model from the two halves, install dflash-edge offline, generate the data on
# the GPU, train under a deadline, and leave the drafter in $OUT (weights split in <16 MiB parts;
# join them here with `cat model.safetensors.part.* > model.safetensors`).
# Every knob is an environment variable (defaults below); BUDGET is this script's wall-time limit in
# seconds and must sit under the call's timeout.
set -uo pipefail
T0=$SECONDS
: "${OUT:?OUT must be set (the device tool sets it)}"
BUDGET=${BUDGET:-560} GEN_BATCH=${GEN_BATCH:-512} LAYERS=${LAYERS:-2}
BLOCK=${BLOCK:-16} SEQS=${SEQS:-64} ANCHORS=${ANCHORS:-32} GAMMA=${GAMMA:-7} LR=${LR:-1.5e-3}
EVAL_EVERY=${EVAL_EVERY:-500} INIT=${INIT:-target} DEVICE=${DEVICE:-cuda} EXTRA=${EXTRA:-}
S=/tmp/dfe-gpu
export PYTHONUNBUFFERED=1 PYTHONPATH=$S/site DFLASH_EDGE_HOME=$S/home
log() { echo "[$((SECONDS - T0))s] $*" | tee -a "$OUT/log.txt"; }
left() { echo $((BUDGET - (SECONDS - T0))); }

[ -f $S/part.00 ] || { log "no $S/part.00: this is not the machine stage.sh ran on (it went back); run both calls again"; exit 3; }
cp .gpu/b/* $S/ || exit 3
python3 - "$S" <<'PYEOF' || { log "could not rebuild the GGUF"; exit 3; }
import glob, hashlib, lzma, sys
s = sys.argv[1]
data = lzma.decompress(b"".join(open(p, "rb").read() for p in sorted(glob.glob(f"{s}/part.*"))))
want = open(f"{s}/model.gguf.sha256").read().strip()
assert hashlib.sha256(data).hexdigest() == want, "sha256 mismatch: the two halves do not match"
open(f"{s}/model.gguf", "wb").write(data)
PYEOF
log "GGUF rebuilt"
# offline install without pip or setuptools (links our subpackages; unzips the pure-Python gguf wheel)
python3 scripts/gpu/install_offline.py "$S/site" "$S"/gguf-*.whl >>"$OUT/log.txt" 2>&1 \
  || { log "offline install failed (see log.txt)"; exit 3; }
python3 -m dflash_edge.cli fetch --gguf $S/model.gguf --name smollm2-135m-instruct >>"$OUT/log.txt" 2>&1 \
  || { log "GGUF import failed (see log.txt)"; exit 3; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >>"$OUT/log.txt" 2>&1
python3 -c "import torch, dflash_edge.train.recipe as r; print('torch', torch.__version__, 'dflash_edge from', r.__file__)" \
  >>"$OUT/log.txt" 2>&1
mkdir -p $S/work && cp $S/prompts_train.jsonl $S/work/   # the prompts prepare.sh built (it sets their number)
log "installed and imported; generating data"

ARGS=(--target default --device "$DEVICE" --out $S/drafter --work-dir $S/work --layers "$LAYERS" --block-size "$BLOCK"
      --init "$INIT" --gen-batch "$GEN_BATCH" --steps 1000000 --seqs-per-step "$SEQS"
      --anchors "$ANCHORS" --gamma "$GAMMA" --lr "$LR" --eval-every "$EVAL_EVERY" --eval-prompts 60 --threads 8 $EXTRA)
timeout -s INT $(( $(left) - 150 )) python3 -m dflash_edge.cli train "${ARGS[@]}" --data-only >>"$OUT/log.txt" 2>&1
log "data stage exit $?: $(tail -c 300 "$OUT/log.txt" | tr '\r' '\n' | tail -1)"
# --max-minutes times the training loop only: leave room for loading (before it) and the last evaluation (after)
# train on the shards that exist (a data stage cut short must not resume generating inside the training call)
NS=$(ls $S/work/responses/shard_*.pt 2>/dev/null | wc -l)
[ "$NS" -gt 0 ] || { log "no response shards were generated"; exit 3; }
MIN=$(python3 -c "print(round(max($(left) - 120, 30) / 60, 2))")
log "training on $NS shards for $MIN min"
timeout -s INT $(( $(left) - 20 )) python3 -m dflash_edge.cli train "${ARGS[@]}" --resume --max-shards "$NS" \
  --max-minutes "$MIN" >>"$OUT/log.txt" 2>&1
log "training exit $?"
grep -E "best|tau =|per-position" "$OUT/log.txt" | tail -12
if [ -f $S/drafter/model.safetensors ]; then
  split -b 15M -d $S/drafter/model.safetensors "$OUT/model.safetensors.part."
  cp $S/drafter/config.json $S/drafter/README.md $S/drafter/draft_vocab.json $S/work/best.json "$OUT/" 2>/dev/null
  log "drafter in \$OUT: $(ls "$OUT" | tr '\n' ' ')"
else
  log "no drafter was saved"
fi
