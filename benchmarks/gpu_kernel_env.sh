# Sourced by the GPU kernel scripts that run on random inputs (nothing staged): the source tree on
# PYTHONPATH, results into benchmarks/results, and the machine's facts at the top of the log.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 BENCH_RESULTS_DIR=$PWD/benchmarks/results
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader 2>/dev/null
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
git log --oneline -1 2>/dev/null
