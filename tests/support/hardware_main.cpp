// The main of bf16_instructions_on_this_cpu: the tests of the bf16 products and of attention
// of bf16 on the instructions themselves (AMX, AVX512-BF16) where this process may use them;
// where it may use neither, ctest's skip code (77), with the reasons.
#include "catch_session.hpp"

#include <dimsum/backend/cpu/bf16_paths.hpp>

#include <cstdio>

int main(int argc, char** argv) {
    namespace cpu = dimsum::backend::cpu;
    bool any = false;
    for (const cpu::bf16_path path : {cpu::bf16_path::amx, cpu::bf16_path::avx512_bf16}) {
        const cpu::bf16_path_support support = cpu::support_of(path);
        std::printf("%s: %s\n", cpu::name(path).data(), support.usable ? "runs here: tested" : support.reason.c_str());
        any = any || support.usable;
    }
    if (!any) {
        std::printf("neither runs here: skipped\n");
        return 77;
    }
    return run_catch_session(argc, argv);
}
