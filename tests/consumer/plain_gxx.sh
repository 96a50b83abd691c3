#!/bin/sh
# A program built without CMake, by the one compiler line README.md gives ("Without CMake"),
# run by ctest as consumer.plain_gxx: tests/consumer/main.cpp built beside a link named
# dimsum to the source tree, then run (it checks a result and the kernels' instruction set).
#   plain_gxx.sh SOURCE_DIR WORK_DIR
set -eu
source_dir=$1
work_dir=$2
rm -rf "$work_dir"
mkdir -p "$work_dir"
cd "$work_dir"
ln -s "$source_dir" dimsum
{ echo '#define EXPECTED_ISA "wide"'; cat dimsum/tests/consumer/main.cpp; } > your_program.cpp
g++ -std=c++20 -O2 -march=native -fopenmp -I dimsum/include your_program.cpp -o your_program
./your_program
