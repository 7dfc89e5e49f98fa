#!/bin/bash
# Session 18 (issue #12): the fresh held-out joins' hypotheses, one process at a time, one thread.
# Run from benchmarks/ with OMP_NUM_THREADS=1 PYTHONPATH=<tree>:<tree>/benchmarks.
set -e
python hyps14.py --model tiny.en --files messy-en-8-11,messy-en-8-12 --systems accurate,unprompted,fast,fast-b5,plain --out acc18_hyps_fresh_tiny.json
python trace_fw.py --model tiny.en --files messy-en-8-11,messy-en-8-12 --beam 5 --threads 1 --out acc18_fw5_fresh_tiny.json
python trace_fw.py --model tiny.en --files messy-en-8-11,messy-en-8-12 --beam 1 --threads 1 --out acc18_fw1_fresh_tiny.json
python hyps14.py --model base --files messy-es-5-2,messy-fr-5-2 --systems accurate,unprompted,fast,fast-b5,plain --out acc18_hyps_fresh_base.json
python trace_fw.py --model base --files messy-es-5-2,messy-fr-5-2 --beam 5 --threads 1 --out acc18_fw5_fresh_base.json
python trace_fw.py --model base --files messy-es-5-2,messy-fr-5-2 --beam 1 --threads 1 --out acc18_fw1_fresh_base.json
echo FRESH_DONE
