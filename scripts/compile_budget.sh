#!/usr/bin/env bash
# The compile-time budget of issue 2, measured: how long examples/multi_head.cpp takes at
# -O2, how long dimsum's headers and each dependency's headers take alone, and what g++
# prints for a shape mistake in the example. Figures, not a test: record them in
# docs/performance.md. Run from anywhere; uses $CXX (default g++).
set -euo pipefail
cd "$(dirname "$0")/.."
cxx=${CXX:-g++}
flags=(-std=c++20 -O2 -march=native -fopenmp -Iinclude -Iexamples)
runs=${RUNS:-5}
extra=()
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# Best and median wall time of $runs compilations of one source.
time_compile() {
    local times=()
    for _ in $(seq "$runs"); do
        local start end
        start=$(date +%s.%N)
        "$cxx" "${flags[@]}" "${extra[@]}" -c "$1" -o "$scratch/out.o" || { echo "does not compile"; return 1; }
        end=$(date +%s.%N)
        times+=("$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')")
    done
    printf '%s\n' "${times[@]}" | sort -n | awk '{ t[NR] = $1 } END { printf "best %.2f s, median %.2f s\n", t[1], t[int((NR + 1) / 2)] }'
}

header_cost() {
    printf '#include <%s>\nint main() {}\n' "$1" > "$scratch/header.cpp"
    printf '  %-28s ' "$1"
    time_compile "$scratch/header.cpp"
}

echo "$("$cxx" --version | head -1), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "flags: ${flags[*]}"
echo
echo "examples/multi_head.cpp:      $(time_compile examples/multi_head.cpp)"
echo "examples/single_head.cpp:     $(time_compile examples/single_head.cpp)"
extra=(-DDIMSUM_PRECOMPILED_KERNELS)
echo "examples/multi_head.cpp, with the kernels from dimsum::kernels: $(time_compile examples/multi_head.cpp)"
extra=(-mtune=generic -march=x86-64)
echo "examples/multi_head.cpp, -march=x86-64 instead of native: $(time_compile examples/multi_head.cpp)"
extra=()
echo
echo "headers alone (an empty main):"
printf '#include <iostream>\nint main() {}\n' > "$scratch/iostream.cpp"
header_cost iostream
header_cost dimsum/dimsum.hpp
extra=(-DDIMSUM_PRECOMPILED_KERNELS)
printf '  %-28s ' "(with dimsum::kernels)"
printf '#include <dimsum/dimsum.hpp>\nint main() {}\n' > "$scratch/header.cpp"
time_compile "$scratch/header.cpp"
extra=()
header_cost xsimd/xsimd.hpp
header_cost boost/hana.hpp
header_cost xtensor/xtensor.hpp
header_cost xtensor/xarray.hpp
header_cost xtensor/xnpy.hpp
echo
echo "a shape mistake in the example (tests/compile_fail/multi_head_mistake.cpp):"
set +e
"$cxx" -std=c++20 -fsyntax-only -Iinclude -Iexamples -DDIMSUM_KO tests/compile_fail/multi_head_mistake.cpp > "$scratch/errors.txt" 2>&1
set -e
echo "  $(wc -l < "$scratch/errors.txt") lines of output; the first error line:"
grep -m1 'error:' "$scratch/errors.txt" | sed 's/^/  /'
