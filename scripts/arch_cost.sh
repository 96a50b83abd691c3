#!/usr/bin/env bash
# What a consumer loses without -march: src/arch_cost.cpp built with dimsum::dimsum's
# instruction set and with none, run in turns (ROUNDS, 3 by default) on the threads
# OMP_NUM_THREADS allows; prints each time and the ratio of the best times.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDIMSUM_BUILD_TOOLS=ON \
      -DDIMSUM_BUILD_TESTS=OFF -DDIMSUM_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-bench -j2 --target dimsum_arch_cost dimsum_arch_cost_no_march
best_with=1e300 best_without=1e300
for _ in $(seq "${ROUNDS:-3}"); do
    read -r with isa_with < <(./build-bench/src/dimsum_arch_cost)
    read -r without isa_without < <(./build-bench/src/dimsum_arch_cost_no_march)
    echo "BERT-base block, batch 4 x seq 128: ${with} ms (${isa_with}), ${without} ms without -march (${isa_without})"
    best_with=$(awk -v a="$best_with" -v b="$with" 'BEGIN { print (b < a ? b : a) }')
    best_without=$(awk -v a="$best_without" -v b="$without" 'BEGIN { print (b < a ? b : a) }')
done
awk -v a="$best_with" -v b="$best_without" 'BEGIN { printf "best: %.2f ms against %.2f ms: %.2fx slower without -march\n", a, b, b / a }'
