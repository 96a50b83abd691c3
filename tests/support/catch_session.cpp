// Catch2's implementation, compiled once for every test program: the unit tests' main
// (main.cpp) and the programs with a main of their own (hardware_main.cpp, gpu_main.cpp,
// test_dist.cpp), which would each compile it again with CATCH_CONFIG_RUNNER.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

int run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
