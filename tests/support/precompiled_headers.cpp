// Nothing of its own: CMake compiles the unit tests' precompiled headers (support.hpp: dimsum,
// Catch2 and xtensor) with this file, and every unit test on the compiled kernels reuses them.
