// Linked into the parity tests built for an instruction set below -march=native: before any
// of the test's own code can run an instruction this CPU lacks, exits with ctest's skip code.
// Compiled for the baseline x86-64, whatever the test is compiled for.
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

[[gnu::constructor(101)]] void skip_without_instruction_set() {
    __builtin_cpu_init();
    const bool supported = std::strcmp(DIMSUM_REQUIRED_ISA, "sse2") == 0 || __builtin_cpu_supports("avx2");
    std::printf("instruction set of this build: %s (%s on this CPU)\n", DIMSUM_REQUIRED_ISA,
                supported ? "present" : "absent: skipped");
    if (!supported) std::_Exit(77);
}

}  // namespace
