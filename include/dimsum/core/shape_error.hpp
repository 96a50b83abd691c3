#pragma once
// The error thrown when extents known only at run time do not fit an operation, and the
// source location it reports: where the user's code built the failing operation.

#include <optional>
#include <stdexcept>
#include <string>

#include "dimsum/core/message.hpp"

namespace dimsum {

// A file and line in the user's code, as std::source_location gives them (which clang 14 with
// libstdc++ 12 lacks; __builtin_FILE and __builtin_LINE work in both compilers): the last parameter of each named function that can throw a shape_error
// is `call_site caller = call_site::current()`, whose default is the caller's file and line.
class call_site {
public:
    static constexpr call_site current(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) noexcept {
        return call_site(file, line);
    }
    // No location: what dimsum's operators pass on to the named functions they call.
    static constexpr call_site unknown() noexcept { return call_site(nullptr, 0); }

    constexpr const char* file_name() const noexcept { return file_; }
    constexpr unsigned line() const noexcept { return line_; }

private:
    constexpr call_site(const char* file, unsigned line) noexcept : file_(file), line_(line) {}
    const char* file_;
    unsigned line_;
};

namespace detail {

// The call being built on this thread: the source location of the outermost named dimsum
// function (matmul, slice, where, ...) now running, i.e. the user's line and not one inside
// dimsum's own helpers. A named function takes `call_site caller = call_site::current()` as
// its last parameter and opens an operation_site with it. Operators (a + b) cannot take a
// location: their errors name one only when they are built inside a named call.
class operation_site {
public:
    explicit operation_site(const call_site& where) noexcept : outer_(current()) {
        if (!outer_ && where.file_name()) current() = &where;
    }
    ~operation_site() { current() = outer_; }
    operation_site(const operation_site&) = delete;
    operation_site& operator=(const operation_site&) = delete;

    static const call_site*& current() noexcept {
        thread_local const call_site* site = nullptr;
        return site;
    }

private:
    const call_site* outer_;
};

}  // namespace detail

class shape_error : public std::invalid_argument {
public:
    explicit shape_error(const std::string& what) : shape_error(what, detail::operation_site::current()) {}
    explicit shape_error(const char* what) : shape_error(std::string(what)) {}
    explicit shape_error(const message& m) : shape_error(m.str()) {}

    // Where the failing operation was built: the file and line of the user's call of a named
    // function (see detail::operation_site); empty for an operator outside any named call.
    const std::optional<call_site>& site() const noexcept { return site_; }

private:
    shape_error(const std::string& what, const call_site* site)
        : std::invalid_argument(site ? what + " (at " + site->file_name() + ":" + std::to_string(site->line()) + ")" : what) {
        if (site) site_ = *site;
    }
    std::optional<call_site> site_;
};

namespace detail {

// Errors are thrown from out-of-line, cold functions: the checks inlined into every formula
// stay a comparison and a call, which keeps formulas quick to compile and run.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_shape_error(const message& m) { throw shape_error(m); }

}  // namespace detail
}  // namespace dimsum
