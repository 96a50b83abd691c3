// The bf16 kernels' inline assembly (bf16_gemm.hpp: amx_tiles, avx512_pairs and
// round_pairs_on_instruction) in both of the assembler dialects a user may choose: this file
// is compiled twice, with -masm=att and with -masm=intel, for a CPU with AMX and AVX512-BF16,
// and check_dialects.cmake requires the two objects to disassemble to the same instructions.
// Compiling needs no such CPU; nothing runs.
#include <dimsum/backend/cpu/bf16_gemm.hpp>

namespace cpu = dimsum::backend::cpu;

template struct cpu::tile_kernel<cpu::amx_tiles>;
template struct cpu::pair_kernel<cpu::avx512_pairs>;

void configure_and_release(cpu::amx_tiles& tiles) {
    tiles.configure();
    tiles.release();
}
