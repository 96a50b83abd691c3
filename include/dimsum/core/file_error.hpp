#pragma once
// The error thrown for a file that cannot be read or written, or is not well formed: a
// truncated .npy, a corrupt .npz, a .safetensors header that lies. (A well-formed file whose
// array has another shape than the tensor asked for is a shape_error.)

#include <stdexcept>
#include <string>
#include <string_view>

namespace dimsum {

class file_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

namespace detail {

// "dimsum: OP: WHERE: WHAT", where WHERE names the file (and the member or parameter in it).
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_file_error(std::string_view op, std::string_view where,
                                                                    std::string_view what) {
    std::string text = "dimsum: ";
    text.append(op).append(": ").append(where).append(": ").append(what);
    throw file_error(text);
}

}  // namespace detail
}  // namespace dimsum
