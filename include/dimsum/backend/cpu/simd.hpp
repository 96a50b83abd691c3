#pragma once
// The SIMD vocabulary of the CPU kernels: xsimd batches of the widest instruction set the
// compiler was told it may use (-march), chosen by xsimd at compile time.

#include <xsimd/xsimd.hpp>

namespace dimsum::backend::cpu {

template <class T>
using simd = xsimd::batch<T>;

}  // namespace dimsum::backend::cpu

// g++ 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsics (they start from a
// deliberately undefined register) wherever xsimd inlines them; code between these two
// markers does not pass those false reports on to the user's build.
#if defined(__GNUC__) && !defined(__clang__)
#define DIMSUM_SIMD_CODE_BEGIN                                       \
    _Pragma("GCC diagnostic push")                                   \
    _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")      \
    _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define DIMSUM_SIMD_CODE_END _Pragma("GCC diagnostic pop")
#else
#define DIMSUM_SIMD_CODE_BEGIN
#define DIMSUM_SIMD_CODE_END
#endif
