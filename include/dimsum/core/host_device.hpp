#pragma once
// DIMSUM_HD marks a function that nvcc compiles for the GPU as well as for the host (the
// scalar bodies of core/functors.hpp, the CUDA backend's device functions); other compilers
// see nothing.

#ifdef __CUDACC__
#define DIMSUM_HD __host__ __device__
#else
#define DIMSUM_HD
#endif
