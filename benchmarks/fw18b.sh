#!/bin/bash
# Session 18: faster-whisper on the issue's seven files where only the issue's figures were at hand.
set -e
python trace_fw.py --model tiny.en --files messy-en-8-0,messy-en-8-1,messy-en-8-2,messy-en-15-0,6min --beam 1 --threads 1 --out acc18_fw1_issue_tiny.json
python trace_fw.py --model tiny.en --files messy-en-8-2,messy-en-15-0,6min --beam 5 --threads 1 --out acc18_fw5_issue_tiny.json
python trace_fw.py --model base --files messy-es-5-0,messy-fr-5-0 --beam 1 --threads 1 --out acc18_fw1_issue_base.json
python trace_fw.py --model base --files messy-fr-5-0 --beam 5 --threads 1 --out acc18_fw5_issue_base.json
echo FWB_DONE
