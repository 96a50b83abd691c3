// Runs Catch2's session on the command line. Catch2 v2 declares its Session class only where
// its implementation is compiled (catch_session.cpp, once for every test program), so the
// programs' mains call it through this.
#pragma once

int run_catch_session(int argc, char** argv);
