# Sourced by the GPU scripts: the call's time budget, and gpu_facts. Needs START (=$SECONDS at the start) and
# BUDGET (seconds for the whole call) set before its functions run (`gpu_begin` sets both).
left() { echo $(( BUDGET - (SECONDS - START) )); }
cap() {  # cap WANT RESERVE: WANT seconds, or what is left after RESERVE for the later stages
  local l=$(( $(left) - $2 ))
  if (( l < $1 / 2 )); then  # said on stderr, so a starved stage is not mistaken for a slow one
    echo "budget: a stage wants ${1} s and gets $(( l > 10 ? l : 10 )) (BUDGET_S=${BUDGET}, ${2} s kept for later stages): raise BUDGET_S or skip a stage" >&2
  fi
  (( l < $1 )) && echo $(( l > 10 ? l : 10 )) || echo $1
}
gpu_facts() {  # the card, driver, clocks and versions into the log; sets name (the card's) and card (h100, h200)
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  card=$(echo "$name" | grep -o 'H[0-9]00' | tr 'H' 'h')
}
gpu_begin() {  # gpu_begin DEFAULT_BUDGET_S: START, BUDGET (BUDGET_S or the default), the environment, the card
  START=$SECONDS
  BUDGET=${BUDGET_S:-$1}
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 INPUTS=$PWD/.carry/inputs
  gpu_facts
}
gpu_tests() {  # gpu_tests WANT_S PYTEST_ARGS...: CUDA tests (unless SKIP_TESTS) into $OUT/cuda_tests.log; fails if one did
  [ -n "${SKIP_TESTS:-}" ] && return 0
  local t=$SECONDS want=$1
  shift
  timeout $(cap $want 420) python3 -m pytest -q -p no:cacheprovider --tb=short -x "$@" 2>&1 | tail -8 | tee "$OUT/cuda_tests.log"
  echo "tests $((SECONDS - t)) s"
  ! grep -q " failed\|error" "$OUT/cuda_tests.log"
}
