#!/usr/bin/env bash
# Installs what is missing, builds the examples and runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target single_head multi_head explain backends bert_layer train_gpt
./build/examples/single_head
./build/examples/multi_head
./build/examples/explain
./build/examples/backends
./build/examples/bert_layer
# a small transformer trained from scratch until it reverses held-out sequences (seconds)
./build/examples/train_gpt --save build/examples/train_gpt.npz | tail -n 4
./build/examples/train_gpt --generate build/examples/train_gpt.npz
