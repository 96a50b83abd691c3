// The CPU kernels and the executor that plans and calls them, and the reference backend's
// planning and loops, compiled once for float and double: the dimsum::kernels library. A
// program that defines DIMSUM_PRECOMPILED_KERNELS (linking dimsum::kernels does) sees only
// their declarations (backend/cpu/kernels.hpp, backend/reference/evaluator.hpp), and its
// formulas compile without xsimd, the planner or the executors. The instruction set is the
// one this file was compiled for.
#include "dimsum/backend/cpu/executor.hpp"
#include "dimsum/backend/reference/interpreter.hpp"
#include "dimsum/core/bf16.hpp"

namespace dimsum::backend::cpu {

#define DIMSUM_KERNELS_FOR(T)                                                                                      \
    template void detail::plan_and_run<T>(detail::state<T>&, const evaluation::layout&, evaluation::element_type,  \
                                          void*, const evaluation::planner_options&,                               \
                                          std::span<const evaluation::strided<T>>);                                \
    template void gemm<T>(const gemm_problem<T>&, const gemm_epilogue&);                                           \
    template void attention<T>(const attention_problem<T>&);                                                       \
    template void attention_gradient<T>(const attention_gradient_problem<T>&);                                     \
    template void run_fused<T>(const fused_program<T>&, const strided<T>&, bool, const box*,              \
                               const rounded_memory<T>&);                                                          \
    template void prepare_fused<T>(const fused_program<T>&);                                                       \
    template void softmax<T>(const source_array<T>&, const strided<T>&, std::size_t, const rounded_memory<T>&);    \
    template void layer_norm<T>(const source_array<T>&, const strided<T>&, std::size_t, T, const rounded_memory<T>&); \
    template void layer_norm_gradient<T>(const source_array<T>&, const source_array<T>&, const strided<T>&, std::size_t, T,   \
                                         const rounded_memory<T>&);                                                \
    template void reduce<fn::sum, T>(const source_array<T>&, const strided<T>&, std::size_t, const rounded_memory<T>&); \
    template void reduce<fn::max, T>(const source_array<T>&, const strided<T>&, std::size_t, const rounded_memory<T>&); \
    template void reduce<fn::mean, T>(const source_array<T>&, const strided<T>&, std::size_t, const rounded_memory<T>&); \
    template void gather<T>(const strided<const T>&, std::size_t, const evaluation::integers&, const strided<T>&); \
    template void scatter_add<T>(const strided<const T>&, std::size_t, const evaluation::integers&, const strided<T>&); \
    template block_table<T> every_block<T>();                                                                     \
    template void adamw_update<T>(T*, const T*, T*, T*, std::size_t, std::size_t, const adamw_step<T>&);

template const char* instruction_set<void>();
template std::size_t packed_elements<float>(std::size_t, std::size_t);
template std::size_t packed_elements<double>(std::size_t, std::size_t);
template packed_operand<float> pack_operand<float, float>(const matrix<const float>&, float*);
template packed_operand<float> pack_operand<float, bf16>(const matrix<const bf16>&, float*);
template packed_operand<double> pack_operand<double, double>(const matrix<const double>&, double*);
template std::size_t pair_elements<void>(std::size_t, std::size_t);
template std::size_t pack_pairs<void>(const matrix<const bf16>&, bf16*, bf16_path);
DIMSUM_KERNELS_FOR(float)
DIMSUM_KERNELS_FOR(double)

#undef DIMSUM_KERNELS_FOR

}  // namespace dimsum::backend::cpu

// The reference backend's planning and loops (it shares no kernel with the CPU backend).
namespace dimsum::backend::reference {
template void plan_and_interpret<float>(evaluation::program&, const std::vector<evaluation::binding>&,
                                        const strided<float>&, const evaluation::planner_options&,
                                        std::span<const strided<float>>);
template void plan_and_interpret<double>(evaluation::program&, const std::vector<evaluation::binding>&,
                                         const strided<double>&, const evaluation::planner_options&,
                                         std::span<const strided<double>>);
}  // namespace dimsum::backend::reference
