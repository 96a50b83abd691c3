#!/usr/bin/env bash
# Builds the unit tests and examples with AddressSanitizer and UBSan and runs them: any
# out-of-bounds access, leak or undefined behaviour fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Debug -DDIMSUM_SANITIZE=ON >/dev/null
cmake --build build-sanitize -j2
# The compile-fail, consumer and docs checks build nothing sanitised: the main run has them.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-sanitize --output-on-failure -j2 -E '^(compile_fail|consumer|docs)\.'
