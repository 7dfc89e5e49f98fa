#!/bin/bash
# Sessions 18 and 20 (issue #12): fresh held-out joins' hypotheses and faster-whisper traces, one process at a
# time, one thread. Run from benchmarks/ with OMP_NUM_THREADS=1 PYTHONPATH=<tree>:<tree>/benchmarks.
#   bash fresh18.sh                                                             # group 1
#   bash fresh18.sh messy-en-8-13,messy-en-8-14 messy-es-5-3,messy-fr-5-3 fresh2   # group 2
#   PREFIX=acc20 bash fresh18.sh messy-en-8-17,messy-en-8-18 messy-es-5-5,messy-fr-5-5 fresh4   # session 20
set -e
EN=${1:-messy-en-8-11,messy-en-8-12} BASE=${2:-messy-es-5-2,messy-fr-5-2} TAG=${3:-fresh} P=${PREFIX:-acc18}
for pair in "tiny.en $EN tiny" "base $BASE base"; do
  set -- $pair
  python hyps14.py --model $1 --files $2 --systems accurate,unprompted,fast,fast-b5,plain --out ${P}_hyps_${TAG}_$3.json
  python trace_fw.py --model $1 --files $2 --beam 5 --threads 1 --out ${P}_fw5_${TAG}_$3.json
  python trace_fw.py --model $1 --files $2 --beam 1 --threads 1 --out ${P}_fw1_${TAG}_$3.json
done
echo "${TAG}_DONE"
