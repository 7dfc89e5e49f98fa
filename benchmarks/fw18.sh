#!/bin/bash
# Session 18: faster-whisper sequential (5 beams / greedy) where no trace was cached, one process at a time.
set -e
python trace_fw.py --model tiny.en --files messy-en-8-5,messy-en-8-6,messy-en-8-7,messy-en-8-8 --beam 5 --threads 1 --out acc18_fw5_held_tiny.json
python trace_fw.py --model tiny.en --files messy-en-8-5,messy-en-8-6,messy-en-8-7,messy-en-8-8,messy-en-8-9,messy-en-8-10 --beam 1 --threads 1 --out acc18_fw1_held_tiny.json
python trace_fw.py --model tiny.en --files messy-en-8-3,messy-en-8-4 --beam 1 --threads 1 --out acc18_fw1_dev_tiny.json
python trace_fw.py --model base --files messy-es-5-1,messy-fr-5-1 --beam 1 --threads 1 --out acc18_fw1_dev_base.json
echo FW_DONE
