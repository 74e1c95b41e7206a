#!/usr/bin/env bash
# GPU machine, one call (< 5 min; nothing to carry): is the CUDA / TensorRT path lossless, and how fast is
# plain vs speculative decoding there? Writes a Qwen3-0.6B-width checkpoint with random weights in the
# published layout (bf16 shards + index, z-lab drafter), exports it, then for each provider runs greedy
# decoding with and without the drafter (must be identical: exit 1 otherwise) and reports tokens/s.
# Random weights: acceptance ~1 token/step, so speculative is slower here; this checks the path, not the gain.
# Needs torch, onnx, safetensors, tokenizers and onnxruntime-gpu on the machine (no network is used).
#   device tool: command `bash scripts/gpu/check.sh`, timeout 300; results in $OUT/check.json + log.txt
set -uo pipefail
T0=$SECONDS
: "${OUT:?OUT must be set (the device tool sets it)}"
LAYERS=${LAYERS:-12} PROMPTS=${PROMPTS:-4} NEW=${NEW:-64} PROVIDERS=${PROVIDERS:-"cuda tensorrt"}
S=/tmp/dfe-check
export PYTHONUNBUFFERED=1 PYTHONPATH=$S/site DFLASH_EDGE_HOME=$S/home
log() { echo "[$((SECONDS - T0))s] $*" | tee -a "$OUT/log.txt"; }

mkdir -p $S && python3 scripts/gpu/install_offline.py $S/site >>"$OUT/log.txt" 2>&1 || { log "install failed"; exit 3; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/log.txt" 2>&1
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" 2>&1 | tee -a "$OUT/log.txt"
python3 benchmarks/realsize.py write $S/fx --layers "$LAYERS" >>"$OUT/log.txt" 2>&1 || { log "fixture failed"; exit 3; }
log "fixture written ($LAYERS layers)"
python3 -m dflash_edge.cli export --target $S/fx/target --draft $S/fx/draft --out $S/bundle --max-context 1024 \
  --force >>"$OUT/log.txt" 2>&1 || { log "export failed (see log.txt)"; exit 3; }
log "exported: $(du -sh $S/bundle | cut -f1)"
status=0
echo "[" > "$OUT/check.json"
for p in cpu $PROVIDERS; do
  python3 benchmarks/realsize.py run $S/bundle --provider "$p" --prompts "$PROMPTS" --new-tokens "$NEW" \
    > $S/$p.json 2>>"$OUT/log.txt"
  rc=$?
  [ $rc -eq 0 ] || status=1
  log "$p: exit $rc $(tr -d '\n ' < $S/$p.json | head -c 400)"
  cat $S/$p.json >> "$OUT/check.json"; echo "," >> "$OUT/check.json"
done
echo "{}]" >> "$OUT/check.json"
log "done (exit $status: 0 = every provider lossless)"
exit $status
