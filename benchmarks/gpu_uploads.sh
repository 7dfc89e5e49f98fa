#!/usr/bin/env bash
# Issue 15 on the H200: end-to-end uploads through the server's file endpoint against transformers'
# ASR pipeline (bench_uploads.py) with tiny.en and base, then the WER of every preset with base's
# real weights (bench_engine.py --real base + transcript_wer.py), in one call of at most BUDGET_S
# seconds (default 330; the call's limit is 600).
#
# Here first, in the repo root of the checkout that makes the calls:
#   python benchmarks/make_gpu_inputs.py       # .carry/ (ignored by git) with base's four parts, ~10 s
# then the device calls back to back that `make_gpu_inputs.py` prints (the machine stays warm only a
# short while after a call; /tmp/stage keeps what the earlier calls brought; if it went back, the last
# call says what is missing: make the stage calls again, at once):
#   1-3. the three stage calls of gpu_session.sh (tiny_a + inputs; wheels; audio + wheels_b)
#   4-7. run(command="bash benchmarks/gpu_stage.sh", carry=[X], timeout_s=60) for X in .carry/tiny_b,
#        .carry/base_a, .carry/base_b, .carry/base_c
#   8. run(command="bash benchmarks/gpu_uploads.sh", carry=[".carry/base_d"], timeout_s=420)
# Right after gpu_session.sh's calls: calls 5-8 only. tiny.en alone: calls 1-3, then call 8 with carry
# [".carry/tiny_b"].
# Env: UPLOADS (1,8,32), FILES (8 distinct recordings), MINUTES (2: each messy join), MODES
#   (fast,accurate), MODELS ("tiny.en base"; base only when its parts came), SKIP_PRESETS=1,
#   PRESET_REAL ("base"; "base tiny.en" adds tiny.en), PRECISIONS (none,full_fp16,mixed_fp8,aggressive_fp8),
#   DEVICE (cuda), UPLOAD_ARGS (more bench_uploads.py options, e.g. --no-shared), BUDGET_S (330),
#   WANT_S (seconds a model may take; 130 for tiny.en, 170 for base).
# Back in $OUT (flat): bench_uploads_{tiny.en,base}_h200.json, bench_engine_presets_real_h200.json,
#   uploads_*.log, presets.log, presets_wer.txt, summary.txt. To record them: cp FILES_AT/bench_uploads_*_h200.json
#   FILES_AT/bench_engine_presets_real_h200.json benchmarks/results/ (a committed bench_uploads_NAME_h200.json
#   is the next run's --baseline).
# Expected: ~25 s set-up, ~90-120 s tiny.en, ~120-150 s base, ~60 s presets.
set -uo pipefail
START=$SECONDS
BUDGET=${BUDGET_S:-330}
source benchmarks/gpu_budget.sh
source benchmarks/gpu_assemble.sh || exit 2
DEVICE=${DEVICE:-cuda}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>/dev/null
python3 -c "import torch, transformers, httpx; print('torch', torch.__version__, 'transformers', transformers.__version__, 'httpx', httpx.__version__)"
echo "set-up $((SECONDS - START)) s"

models=${MODELS:-tiny.en base}
[ -z "${BASE:-}" ] && models=${models/base/}
preset_real=${PRESET_REAL:-base}
[ -z "${BASE:-}" ] && preset_real=${preset_real/base/}
presets=0
[ -z "${SKIP_PRESETS:-}" ] && [ -n "${preset_real// /}" ] && presets=1
for name in $models; do
  dir=$TINY want=${WANT_S:-130} reserve=$(( presets * 70 ))  # tiny.en: at most 130 s, leaving base 100 s at least
  [[ "$models" == *base* ]] && reserve=$(( reserve + 100 ))
  [ "$name" = base ] && dir=$BASE want=${WANT_S:-170} reserve=$(( presets * 70 ))
  baseline=""  # every recorded run of this model
  for f in benchmarks/results/bench_uploads_${name}_*h200.json; do [ -e "$f" ] && baseline="$baseline --baseline ../$f"; done
  t=$SECONDS
  # timeout signals the whole process group: the spawned server too (SIGKILL 20 s later).
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout -k 20 $(cap $want $reserve) python3 bench_uploads.py \
    --device "$DEVICE" --model "$name=$dir" --uploads "${UPLOADS:-1,8,32}" --files "${FILES:-8}" --minutes "${MINUTES:-2}" \
    --modes "${MODES:-fast,accurate}" --hf-dir "$T/hf" $baseline ${UPLOAD_ARGS:-} --out "bench_uploads_${name}_h200.json") \
    > "$OUT/uploads_$name.log" 2>&1
  echo "uploads $name rc=$? (1: a part failed, see the log; 3: rows > 10 % slower than the baseline; 124/137: timed out) $((SECONDS - t)) s"
done

if (( presets )); then  # WER of every preset on the 41 real clips of clips.npz, one batch of 64
  t=$SECONDS
  real=""
  for name in $preset_real; do
    real="$real --real $name=$([ "$name" = base ] && echo "$BASE" || echo "$TINY")"
  done
  (cd benchmarks && BENCH_RESULTS_DIR="$OUT" timeout -k 10 $(cap 90 5) python3 bench_engine.py \
    --tokenizer "$INPUTS/tokenizer_multilingual.json" --audio "$INPUTS/clips.npz" $real --shapes "" --batches 64 \
    --hf-batches 64 --precisions "${PRECISIONS:-none,full_fp16,mixed_fp8,aggressive_fp8}" \
    --out bench_engine_presets_real_h200.json) 2>&1 | grep -v "seem to have been set" > "$OUT/presets.log"
  echo "presets rc=${PIPESTATUS[0]} $((SECONDS - t)) s"
  (cd benchmarks && python3 transcript_wer.py "$OUT/bench_engine_presets_real_h200.json") > "$OUT/presets_wer.txt" 2>&1
fi

echo "=== summary ($((SECONDS - START)) s in all) ==="
{
  (cd benchmarks && python3 - "$OUT"/bench_uploads_*_h200.json <<'EOF'
import json
import sys

from bench_uploads import COLUMNS, with_ratios
from common import table

for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as e:
        print(path, "unreadable:", e)
        continue
    rows = with_ratios(report["rows"])
    print(path.rsplit("/", 1)[-1], f"({len(report['recordings'])} recordings, {report['environment'].get('gpu', '')})")
    print(table(rows, COLUMNS) if rows else "(no rows)")
    for r in report.get("baseline", {}).get("rows", []):
        if r["flag"]:
            print("SLOWER than the baseline:", r)
    for e in report.get("errors", []):
        print("ERROR", e)
EOF
  )
  [ -e "$OUT/presets_wer.txt" ] && { echo "WER per preset (transcript_wer.py):"; cat "$OUT/presets_wer.txt"; }
  grep -h "^ERROR\|Traceback\|Error:" "$OUT"/uploads_*.log "$OUT/presets.log" 2>/dev/null | head -10
} 2>&1 | tee "$OUT/summary.txt"
