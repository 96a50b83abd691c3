#pragma once
// The error thrown when extents known only at run time do not fit an operation.

#include <stdexcept>
#include <string>

#include "dimsum/core/message.hpp"

namespace dimsum {

class shape_error : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
    explicit shape_error(const message& m) : std::invalid_argument(m.str()) {}
};

namespace detail {

// Errors are thrown from out-of-line, cold functions: the checks inlined into every formula
// stay a comparison and a call, which keeps formulas quick to compile and run.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_shape_error(const message& m) { throw shape_error(m); }

}  // namespace detail
}  // namespace dimsum
