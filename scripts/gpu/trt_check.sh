#!/usr/bin/env bash
# GPU machine, one call (< 8 min; nothing to carry): the one TensorRT path (docs/design.md "TensorRT"),
# onnxruntime's TensorRT execution provider on a bundle's own graphs, end to end. Writes a Qwen3-0.6B-width
# checkpoint with random weights (benchmarks/realsize.py), exports it, runs `build-engines` (engine build
# time, cache size), loads it again on TensorRT (must find the cache: load time), then decodes greedily
# plain and with the drafter on TensorRT and on the CPU provider and prints, per provider, tok/s plain and
# speculative, acceptance (tau), and whether TensorRT's tokens equal the CPU's (lossless check).
# Random weights: tau ~1, so speculative is slower; this checks the path and records its figures.
# Needs torch, onnx, safetensors, tokenizers and onnxruntime-gpu with TensorRT (no network is used).
#   device tool: command `bash scripts/gpu/trt_check.sh`, timeout 540; results in $OUT/trt.json + log.txt
set -uo pipefail
T0=$SECONDS
: "${OUT:?OUT must be set (the device tool sets it)}"
LAYERS=${LAYERS:-12} NEW=${NEW:-64} PRECISION=${PRECISION:-fp16}
S=/tmp/dfe-trt
export PYTHONUNBUFFERED=1 PYTHONPATH=$S/site DFLASH_EDGE_HOME=$S/home
log() { echo "[$((SECONDS - T0))s] $*" | tee -a "$OUT/log.txt"; }

mkdir -p $S && python3 scripts/gpu/install_offline.py $S/site >>"$OUT/log.txt" 2>&1 || { log "install failed"; exit 3; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/log.txt"
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" 2>&1 | tee -a "$OUT/log.txt"
python3 -c "import tensorrt as t; print('tensorrt', t.__version__)" 2>&1 | tee -a "$OUT/log.txt"
python3 benchmarks/realsize.py write $S/fx --layers "$LAYERS" >>"$OUT/log.txt" 2>&1 || { log "fixture failed"; exit 3; }
python3 -m dflash_edge.cli export --target $S/fx/target --draft $S/fx/draft --out $S/bundle --max-context 1024 \
  --precision "$PRECISION" --force >>"$OUT/log.txt" 2>&1 || { log "export failed (see log.txt)"; exit 3; }
log "exported ($LAYERS layers, $PRECISION): $(du -sh $S/bundle | cut -f1)"
t=$SECONDS
python3 -m dflash_edge.cli build-engines $S/bundle >>"$OUT/log.txt" 2>&1 || { log "build-engines failed (see log.txt)"; exit 2; }
log "build-engines: $((SECONDS - t)) s wall; cache $(du -sh $S/bundle/.trt-cache | cut -f1): $(ls $S/bundle/.trt-cache | tr '\n' ' ')"
python3 - "$S/bundle" "$NEW" <<'PY' 2>>"$OUT/log.txt" | tee "$OUT/trt.json"
import json, statistics, sys, time
from dflash_edge.runtime import Generator
bundle, new = sys.argv[1], int(sys.argv[2])
out, tokens = {}, {}
for provider in ("tensorrt", "cpu"):
    t = time.perf_counter()
    gen = Generator.load(bundle, provider=provider, target_graph="target", use_tuned=False)
    row = {"load_s": round(time.perf_counter() - t, 2)}
    v = min(gen.bundle.model["vocab_size"], 1000)
    prompts = [[(7 * p + 3 * i) % (v - 5) + 5 for i in range(24 + 8 * p)] for p in range(4)]
    for draft in ("none", "drafter"):
        rates, taus, ids = [], [], []
        for p in prompts:
            r = gen.generate_ids(p, new, draft=draft, stop_token_ids=[])
            rates.append(len(r.token_ids) / r.stats.decode_s if r.stats.decode_s else 0)
            taus.append(r.stats.mean_acceptance_length); ids.append(r.token_ids)
        row[draft] = {"tok_s": round(statistics.median(rates), 1), "tau": round(statistics.median(taus), 2)}
        tokens[provider, draft] = ids
    row["spec_equals_plain"] = tokens[provider, "none"] == tokens[provider, "drafter"]
    out[provider] = row
same = [a == b for a, b in zip(tokens["tensorrt", "none"], tokens["cpu", "none"])]
out["tensorrt_equals_cpu"] = {"prompts_identical": sum(same), "of": len(same)}
print(json.dumps(out, indent=1))
sys.exit(0 if out["tensorrt"]["spec_equals_plain"] else 1)
PY
status=${PIPESTATUS[0]}
log "done (exit $status: 0 = TensorRT drafting lossless against its own plain decoding)"
exit $status
