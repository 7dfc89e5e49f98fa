# Sourced by the GPU scripts: the call's time budget. Needs START (=$SECONDS at the start) and
# BUDGET (seconds for the whole call) set before it is sourced.
left() { echo $(( BUDGET - (SECONDS - START) )); }
cap() {  # cap WANT RESERVE: WANT seconds, or what is left after RESERVE for the later stages
  local l=$(( $(left) - $2 )); (( l < $1 )) && echo $(( l > 10 ? l : 10 )) || echo $1
}
