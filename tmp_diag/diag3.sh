source benchmarks/gpu_setup.sh
export PYTHONPATH=$PWD/tmp_diag:$PYTHONPATH DBG_SYNC=0
STREAMER_AUDIO_DIR=$PWD/.carry/audio timeout 200 python3 benchmarks/bench_streaming.py --spawn \
  --model /tmp/tiny --device cuda --clients 1,1,4 --seconds 15 --out "$OUT/diag3.json" 2>&1 | grep -E "DBG|^1 |^4 " | head -60
