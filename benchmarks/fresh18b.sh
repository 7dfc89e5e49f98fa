#!/bin/bash
# Session 18: the second group of fresh held-out joins (seeds 13/14 en, 3 es/fr), as fresh18.sh.
set -e
python hyps14.py --model tiny.en --files messy-en-8-13,messy-en-8-14 --systems accurate,unprompted,fast,fast-b5,plain --out acc18_hyps_fresh2_tiny.json
python trace_fw.py --model tiny.en --files messy-en-8-13,messy-en-8-14 --beam 5 --threads 1 --out acc18_fw5_fresh2_tiny.json
python trace_fw.py --model tiny.en --files messy-en-8-13,messy-en-8-14 --beam 1 --threads 1 --out acc18_fw1_fresh2_tiny.json
python hyps14.py --model base --files messy-es-5-3,messy-fr-5-3 --systems accurate,unprompted,fast,fast-b5,plain --out acc18_hyps_fresh2_base.json
python trace_fw.py --model base --files messy-es-5-3,messy-fr-5-3 --beam 5 --threads 1 --out acc18_fw5_fresh2_base.json
python trace_fw.py --model base --files messy-es-5-3,messy-fr-5-3 --beam 1 --threads 1 --out acc18_fw1_fresh2_base.json
echo FRESH2_DONE
