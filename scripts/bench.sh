#!/usr/bin/env bash
# Builds dimsum_bench optimised, runs it, and writes docs/performance.csv and the chart
# docs/performance.png; then runs the attention, decoder, product, softmax and layer_norm rows
# again beside one busy thread (--load=1, as on a shared machine) into
# docs/performance-loaded.csv. Extra arguments go to the tool, e.g. `./scripts/bench.sh --quick`.
# The environment is passed on unchanged: the tool itself chooses, for its own loading of
# OpenBLAS only, what OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE would otherwise decide.
set -euo pipefail
cd "$(dirname "$0")/.."
DIMSUM_WITH_BENCH=1 ./scripts/setup.sh
cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDIMSUM_BUILD_TOOLS=ON \
      -DDIMSUM_BUILD_TESTS=OFF -DDIMSUM_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-bench -j2 --target dimsum_bench
./build-bench/src/dimsum_bench --csv=docs/performance.csv "$@"
/usr/bin/python3 scripts/plot_performance.py docs/performance.csv docs/performance.png
./build-bench/src/dimsum_bench --csv=docs/performance-loaded.csv --filter=attention,decoder,gemm,softmax,layer_norm \
    "$@" --load=1
