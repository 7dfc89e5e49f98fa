export PYTHONPATH=$PWD
N=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $N"; [ -z "$N" ] && { ls /usr/local/cuda*/bin | head -50; exit 1; }
for t in 32x2 16x5; do
timeout 200 $N --kernel-name regex:absorbed_mma --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy --section InstructionStats python3 benchmarks/ncu_absorbed.py --rows 128 --tile $t > $OUT/ncu_$t.txt 2>&1
echo "rc $?"; grep -v "^ *-*$" $OUT/ncu_$t.txt | grep -E "Duration|Throughput|Stall|Issue|Pipe|Bank|Warp Cycles|Eligible|Active|Shared|L1|DRAM|Executed Ipc|ERR|rror" | head -60
done
