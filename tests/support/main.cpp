// The unit tests' main; Catch2's implementation is compiled once, in catch_session.cpp.
#include "catch_session.hpp"

int main(int argc, char** argv) { return run_catch_session(argc, argv); }
