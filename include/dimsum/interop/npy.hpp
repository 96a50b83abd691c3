#pragma once
// .npy files (NumPy's array format) in and out of tensors.
//
//   auto x = dimsum::load_npy<float, Batch, Seq, Model>("x.npy");            // extents from the file
//   auto y = dimsum::load_npy<float, Batch, Seq, Model>("x.npy", Batch{2}, Seq{16});  // and checked
//   dimsum::save_npy("y.npy", y);
//
// load_npy validates the whole file itself (preamble, header, dtype, order, sizes) before it
// reads the data, because xtensor's reader trusts the header and reads past a truncated
// file: any broken file is one npy_error, any file of another shape one shape_error, never
// undefined behaviour. save_npy writes the format itself and checks every write, the flush
// and the close, so that a full disk or a file that takes no data is an npy_error that says
// which.
//
// Not part of <dimsum/dimsum.hpp>, which stays light: include <dimsum/interop/npy.hpp>.

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>


#include "dimsum/core/file_error.hpp"
#include "dimsum/core/next_index.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum {

// A file that cannot be read or written, or is not a well-formed .npy file of the element
// type asked for. (A well-formed file of another shape is a shape_error.)
class npy_error : public file_error {
public:
    using file_error::file_error;
};

namespace detail::npy {

// What a .npy header says, and where the data starts.
struct header_info {
    std::string descr;
    bool fortran_order = false;
    std::vector<std::size_t> shape;
    std::uint64_t data_offset = 0;  // bytes of preamble and header
    std::uint64_t file_size = 0;
};

// A header is a Python dict literal of three short entries; anything far longer is not one.
inline constexpr std::uint64_t max_header_length = 1 << 20;

[[noreturn, gnu::cold, gnu::noinline]] inline void fail(std::string_view op, const std::string& path,
                                                        std::string_view what) {
    std::string text = "dimsum: ";
    text.append(op).append(": ").append(path).append(": ").append(what);
    throw npy_error(text);
}

// The dtype string that holds T as it lies in memory, which is how the data is read and
// written: '<f4' for float, '<i8' for int64_t on a little-endian machine.
template <class T>
std::string native_descr() {
    std::string d(1, std::endian::native == std::endian::little ? '<' : '>');
    return d + (std::is_integral_v<T> ? 'i' : 'f') + std::to_string(sizeof(T));
}

// Text from a file, for a message: control and non-ASCII bytes as \xNN, at most `shown`
// characters, then "...".
inline std::string escaped(std::string_view text, std::size_t shown = 120) {
    std::string out;
    for (std::size_t i = 0; i < text.size() && i < shown; ++i) {
        auto c = static_cast<unsigned char>(text[i]);
        if (c >= 0x20 && c < 0x7f) {
            out += static_cast<char>(c);
        } else {
            constexpr char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
        }
    }
    return out + (text.size() > shown ? "..." : "");
}

// `'<f8' (float64)`, `'>f4' (big-endian float32)`, `'<i8' (int64)`: the dtype as the file
// spells it and, for common ones, as NumPy names it.
inline std::string describe_descr(const std::string& d) {
    // appended, not `"'" + escaped(...)`: g++ 12 warns (-Wrestrict) about its own inlined
    // string concatenation there
    std::string out(1, '\'');
    out.append(escaped(d, 40)).push_back('\'');
    if (d.size() < 3 || std::string_view("<>|=").find(d[0]) == std::string_view::npos) return out;
    std::string_view digits(d.data() + 2, d.size() - 2);
    if (digits.size() > 2 || digits.find_first_not_of("0123456789") != std::string_view::npos) return out;
    std::size_t bits = std::stoul(std::string(digits)) * 8;
    std::string name;
    switch (d[1]) {
        case 'f': name = "float"; break;
        case 'i': name = "int"; break;
        case 'u': name = "uint"; break;
        case 'c': name = "complex"; break;
        case 'b': return out + " (bool)";
        default: return out;
    }
    return out + " (" + (d[0] == '>' ? "big-endian " : "") + name + std::to_string(bits) + ")";
}

// The dtype as NumPy names it when it is one dimsum tensors hold in this machine's byte
// order ('<f4' is "float32"); otherwise as describe_descr writes it.
inline std::string dtype_name(const std::string& d) {
    if (d == native_descr<float>()) return "float32";
    if (d == native_descr<double>()) return "float64";
    if (d == native_descr<std::int32_t>()) return "int32";
    if (d == native_descr<std::int64_t>()) return "int64";
    return describe_descr(d);
}

// `(2, 16, 128)`, `(5,)`, `()`: a shape as NumPy prints it.
inline std::string describe_shape(const std::vector<std::size_t>& s) {
    std::string out = "(";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + (s.size() == 1 ? ",)" : ")");
}

// The header text for a message: control bytes escaped, the padding dropped, long ones cut.
inline std::string quote_header(std::string_view h) {
    while (!h.empty() && (h.back() == ' ' || h.back() == '\n')) h.remove_suffix(1);
    std::string out(1, '"');
    out.append(escaped(h)).push_back('"');
    return out;
}

// The subset of Python literals a .npy header uses, the way numpy.lib.format reads it: a
// dict with exactly the keys 'descr' (a string), 'fortran_order' (True or False) and
// 'shape' (a tuple of non-negative integers), then only whitespace.
class header_parser {
public:
    header_parser(std::string_view text, std::string_view op, const std::string& path)
        : text_(text), op_(op), path_(path) {}

    void parse(header_info& info) {
        bool seen_descr = false, seen_order = false, seen_shape = false;
        expect('{', "'{'");
        while (!eat('}')) {
            std::string key = string_literal("a key in quotes");
            expect(':', "':' after '" + key + "'");
            if (key == "descr") {
                once(seen_descr, key);
                skip_space();
                if (peek() == '[') {
                    fail(op_, path_, "the file holds a structured array (its descr is a list of fields); "
                                     "only plain float32 or float64 arrays load");
                }
                info.descr = string_literal("the dtype string");
            } else if (key == "fortran_order") {
                once(seen_order, key);
                info.fortran_order = boolean();
            } else if (key == "shape") {
                once(seen_shape, key);
                info.shape = tuple_of_sizes();
            } else {
                malformed("unexpected key '" + escaped(key, 40) + "' in the header " + quote_header(text_));
            }
            if (!eat(',')) {
                expect('}', "',' or '}'");
                break;
            }
        }
        skip_space();
        if (pos_ != text_.size()) malformed_at("only whitespace after '}'");
        if (!seen_descr) malformed("the header has no 'descr': " + quote_header(text_));
        if (!seen_order) malformed("the header has no 'fortran_order': " + quote_header(text_));
        if (!seen_shape) malformed("the header has no 'shape': " + quote_header(text_));
    }

private:
    [[noreturn]] void malformed(const std::string& what) const { fail(op_, path_, "malformed header: " + what); }
    [[noreturn]] void malformed_at(const std::string& expected) const {
        malformed("expected " + expected + " at character " + std::to_string(pos_) + " of " + quote_header(text_));
    }

    void once(bool& seen, const std::string& key) const {
        if (seen) malformed("'" + escaped(key, 40) + "' appears twice in " + quote_header(text_));
        seen = true;
    }
    void skip_space() {
        while (pos_ < text_.size() && std::string_view(" \t\r\n").find(text_[pos_]) != std::string_view::npos) ++pos_;
    }
    char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
    bool eat(char c) {
        skip_space();
        if (peek() != c) return false;
        ++pos_;
        return true;
    }
    void expect(char c, const std::string& what) {
        if (!eat(c)) malformed_at(what);
    }

    std::string string_literal(const std::string& what) {
        skip_space();
        char quote = peek();
        if (quote != '\'' && quote != '"') malformed_at(what);
        std::size_t end = text_.find(quote, pos_ + 1);
        if (end == std::string_view::npos) malformed_at(what + ", closed");
        std::string s(text_.substr(pos_ + 1, end - pos_ - 1));
        pos_ = end + 1;
        return s;
    }

    bool boolean() {
        skip_space();
        for (bool value : {true, false}) {
            std::string_view word = value ? "True" : "False";
            if (text_.substr(pos_, word.size()) == word) {
                pos_ += word.size();
                return value;
            }
        }
        malformed_at("True or False for 'fortran_order'");
    }

    std::vector<std::size_t> tuple_of_sizes() {
        std::vector<std::size_t> sizes;
        expect('(', "a tuple for 'shape'");
        const std::size_t open = pos_;
        bool comma = false;  // `(6)` is the number 6 in Python, not a tuple: one extent needs `(6,)`
        while (!eat(')')) {
            skip_space();
            if (peek() < '0' || peek() > '9') malformed_at("a non-negative integer in 'shape'");
            std::size_t n = 0;
            for (; peek() >= '0' && peek() <= '9'; ++pos_) {
                if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, std::size_t(peek() - '0'), &n)) {
                    malformed("an extent in 'shape' is too large: " + quote_header(text_));
                }
            }
            if (peek() == 'L') ++pos_;  // Python 2's long integers, in files it wrote
            sizes.push_back(n);
            comma = eat(',');
            if (!comma) {
                expect(')', "',' or ')' in 'shape'");
                break;
            }
        }
        if (sizes.size() == 1 && !comma) {
            pos_ = open;
            malformed_at("a tuple for 'shape' (one extent is written `(n,)`; `(n)` is a number)");
        }
        return sizes;
    }

    std::string_view text_;
    std::size_t pos_ = 0;
    std::string_view op_;
    const std::string& path_;
};

// Reads exactly n bytes, or fails: the file may have changed since its size was taken.
inline void read_exact(std::istream& in, char* into, std::uint64_t n, std::string_view op, const std::string& path,
                       std::string_view what) {
    in.read(into, static_cast<std::streamsize>(n));
    if (static_cast<std::uint64_t>(in.gcount()) != n) {
        fail(op, path, "read error in the " + std::string(what) + " (the file changed while being read?)");
    }
}

inline std::uint64_t file_size_of(const std::string& path, std::string_view op) {
    std::error_code ec;
    std::uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) fail(op, path, "cannot read the file: " + ec.message());
    return size;
}

inline std::ifstream open_for_reading(const std::string& path, std::string_view op) {
    errno = 0;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        int e = errno;
        fail(op, path, "cannot open the file: " + (e ? std::generic_category().message(e) : std::string("unknown error")));
    }
    return in;
}

// Reads and validates the preamble and the header, leaving `in` at the first byte of data.
inline header_info read_header(std::istream& in, std::uint64_t file_size, std::string_view op,
                               const std::string& path) {
    constexpr std::string_view magic = "\x93NUMPY";
    header_info info;
    info.file_size = file_size;
    if (file_size == 0) fail(op, path, "the file is empty, not a .npy file");

    // The magic string, as much of it as the file holds: a short file that starts like one
    // is a truncated .npy file, anything else is not a .npy file at all.
    char preamble[12]{};
    std::uint64_t head = std::min<std::uint64_t>(file_size, 8);
    read_exact(in, preamble, head, op, path, "preamble");
    if (std::string_view(preamble, std::min<std::uint64_t>(head, magic.size())) !=
        magic.substr(0, std::min<std::uint64_t>(head, magic.size()))) {
        fail(op, path, "not a .npy file: it does not start with \"\\x93NUMPY\"");
    }
    if (head < 8) {
        fail(op, path, "truncated: " + std::to_string(file_size) + " bytes, less than the .npy preamble");
    }

    // Version 1.0 has a 2-byte header length; 2.0 (headers over 64 KiB) and 3.0 (UTF-8
    // headers) a 4-byte one. Both little-endian.
    auto major = static_cast<unsigned char>(preamble[6]), minor = static_cast<unsigned char>(preamble[7]);
    if (!(minor == 0 && major >= 1 && major <= 3)) {
        fail(op, path, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                           " (1.0, 2.0 and 3.0 are known)");
    }
    std::uint64_t length_bytes = major == 1 ? 2 : 4;
    if (file_size < 8 + length_bytes) {
        fail(op, path, "truncated: " + std::to_string(file_size) + " bytes, less than the .npy preamble");
    }
    read_exact(in, preamble + 8, length_bytes, op, path, "preamble");
    std::uint64_t header_length = 0;
    for (std::uint64_t i = length_bytes; i-- > 0;) {
        header_length = header_length << 8 | static_cast<unsigned char>(preamble[8 + i]);
    }
    info.data_offset = 8 + length_bytes + header_length;
    if (header_length > max_header_length) {
        fail(op, path, "malformed header: its length field says " + std::to_string(header_length) +
                           " bytes, more than the " + std::to_string(max_header_length) + " a header may have");
    }
    if (info.data_offset > file_size) {
        fail(op, path, "truncated: the header should end at byte " + std::to_string(info.data_offset) +
                           " but the file has " + std::to_string(file_size));
    }

    std::string header(header_length, '\0');
    read_exact(in, header.data(), header_length, op, path, "header");
    header_parser(header, op, path).parse(info);
    return info;
}

// The element count of a shape, or npy_error if its bytes or a tensor's strides (ptrdiff_t)
// would overflow: such a header is broken. Zero extents count as 1 here, since strides are
// computed over the other extents even when the array is empty.
inline std::uint64_t count_of(const header_info& info, std::uint64_t item_size, std::string_view op,
                              const std::string& path) {
    std::uint64_t bytes = item_size, count = 1;
    for (std::size_t extent : info.shape) {
        if (__builtin_mul_overflow(bytes, extent == 0 ? 1 : extent, &bytes) || bytes > PTRDIFF_MAX) {
            fail(op, path, "malformed header: the shape " + describe_shape(info.shape) + " overflows the size");
        }
        count *= extent;
    }
    return count;
}

// The file holds exactly the data its header promises: no less (truncated) and no more.
inline void check_data_size(const header_info& info, std::uint64_t data_bytes, std::string_view op,
                            const std::string& path) {
    std::uint64_t present = info.file_size - info.data_offset;
    std::string promised = "the header's shape " + describe_shape(info.shape) + " of " + describe_descr(info.descr) +
                           " needs " + std::to_string(data_bytes) + " bytes of data";
    if (present < data_bytes) {
        fail(op, path, "truncated: " + promised + ", the file holds " + std::to_string(present));
    }
    if (present > data_bytes) {
        fail(op, path, std::to_string(present - data_bytes) + " bytes follow the data (" + promised +
                           "): more than one array in the file?");
    }
}

// A contiguous copy of a strided view, for writing, its values as To (bf16 widened to float,
// exactly, for a file: NumPy has no bf16).
template <class To, class T, class... A>
tensor<To, A...> contiguous_copy(const tensor_view<T, A...>& v) {
    tensor<To, A...> copy(v.shape());
    std::array<std::size_t, sizeof...(A)> index{};
    auto extents = v.shape().extents();
    for (std::size_t i = 0; i < copy.size(); ++i) {
        copy.data()[i] = static_cast<To>(v.data()[v.offset(index)]);
        next_index(index.data(), extents.data(), extents.size());
    }
    return copy;
}

// An uninitialised tensor of the shape a file holds, where that fits what the caller expects
// of each axis (its static extent, one given, or `dynamic`); a shape_error naming both shapes
// where not. `where` names the file (and the parameter in it).
template <class T, axis_type... Axes>
tensor<T, Axes...> tensor_for(const std::vector<std::size_t>& file_shape,
                              const std::array<axis_desc, sizeof...(Axes)>& expected, std::string_view op,
                              const std::string& where) {
    constexpr std::size_t rank = sizeof...(Axes);
    auto mismatch = [&](const std::string& what) {
        message m;
        m << shape_ref{expected.data(), nullptr, rank};
        throw shape_error("dimsum: " + std::string(op) + ": " + where + ": " + what + " (the file's shape " +
                          describe_shape(file_shape) + ", the tensor's " + m.str() + ")");
    };
    if (file_shape.size() != rank) {
        mismatch("the file's array has " + std::to_string(file_shape.size()) + " axes, the tensor " +
                 std::to_string(rank));
    }
    std::array<std::size_t, rank> all{};
    for (std::size_t i = 0; i < rank; ++i) {
        all[i] = file_shape[i];
        if (expected[i].is_static() && all[i] != expected[i].extent) {
            std::string axis = expected[i].is_named() ? std::string(expected[i].name) : std::to_string(i);
            mismatch("axis " + axis + " is " + std::to_string(expected[i].extent) + " in the tensor but " +
                     std::to_string(all[i]) + " in the file");
        }
    }
    return tensor<T, Axes...>(shape<Axes...>::from_extents(all, op));
}

}  // namespace detail::npy

// Loads a .npy file into a tensor with the given axes. Static extents are checked against
// the file; dynamic ones come from it or, where given as for the tensor constructor (one
// value per dynamic axis, or one per axis), are checked too. The file must hold T exactly
// ('<f4' for float, '<f8' for double, '<i4' and '<i8' for int32_t and int64_t), in C order: a conversion would hide a mistake.
// NumPy has no bfloat16: a bf16 tensor loads a '<f4' file, each value rounded to the nearest
// bf16 (ties to even). Throws npy_error for a file that cannot be read or is not such a .npy file, shape_error
// for a file of another rank or extents.
template <class T, axis_type... Axes, axis_type... Given>
tensor<T, Axes...> load_npy(const std::string& path, Given... extents) {
    static_assert(tensor_element<T>, "dimsum: load_npy: the element type must be float, double, bf16, int32_t or int64_t");
    using Stored = std::conditional_t<std::is_same_v<T, bf16>, float, T>;  // what the file holds
    using shape_type = shape<Axes...>;
    constexpr std::size_t rank = shape_type::rank;
    constexpr std::string_view op = "load_npy";

    // What the caller expects of each axis: its static extent, the one given, or `dynamic`.
    std::array<axis_desc, rank> expected = shape_type::axes;
    if constexpr (sizeof...(Given) > 0) {
        shape_type given(extents...);  // which axes may be given is checked at compile time
        for (std::size_t i = 0; i < rank; ++i) expected[i].extent = given.extent(i);
    }

    std::uint64_t file_size = detail::npy::file_size_of(path, op);
    std::ifstream in = detail::npy::open_for_reading(path, op);
    detail::npy::header_info info = detail::npy::read_header(in, file_size, op, path);

    // The file itself first, then whether it is the tensor asked for.
    std::string want = detail::npy::native_descr<Stored>();
    if (info.descr != want) {
        detail::npy::fail(op, path, "the file holds " + detail::npy::describe_descr(info.descr) +
                                        " values; a tensor of " + std::string(detail::type_name<T>()) + " loads " +
                                        detail::npy::describe_descr(want) + " only");
    }
    if (info.fortran_order) {
        detail::npy::fail(op, path, "the data is in Fortran (column-major) order; load_npy reads C (row-major) "
                                    "order only: save np.ascontiguousarray(a)");
    }
    std::uint64_t count = detail::npy::count_of(info, sizeof(Stored), op, path);
    detail::npy::check_data_size(info, count * sizeof(Stored), op, path);
    auto t = detail::npy::tensor_for<T, Axes...>(info.shape, expected, op, path);
    if constexpr (std::is_same_v<T, bf16>) {  // in chunks, rounded
        std::vector<float> chunk(std::min<std::uint64_t>(count, 1 << 16));
        for (std::uint64_t done = 0; done < count; done += chunk.size()) {
            const std::size_t n = std::min<std::uint64_t>(chunk.size(), count - done);
            detail::npy::read_exact(in, reinterpret_cast<char*>(chunk.data()), n * sizeof(float), op, path, "data");
            for (std::size_t i = 0; i < n; ++i) t.data()[done + i] = bf16(chunk[i]);
        }
    } else if (count != 0) {
        detail::npy::read_exact(in, reinterpret_cast<char*>(t.data()), count * sizeof(T), op, path, "data");
    }
    return t;
}

namespace detail::npy {

// The preamble and header of a .npy file (version 1.0, or 2.0 for a header past 64 KiB), padded
// with spaces to a multiple of 64 bytes, as numpy.save writes them.
inline std::string file_head(const std::string& descr, const std::vector<std::size_t>& shape) {
    std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + describe_shape(shape) + ", }";
    const bool wide = dict.size() + 1 + 10 > 65535;
    const std::size_t preamble = wide ? 12 : 10;
    const std::size_t total = (preamble + dict.size() + 1 + 63) / 64 * 64;
    dict.append(total - preamble - dict.size() - 1, ' ');
    dict += '\n';
    std::string head = "\x93NUMPY";
    head += static_cast<char>(wide ? 2 : 1);
    head += '\0';
    std::uint64_t length = dict.size();
    for (std::size_t i = 0; i < (wide ? 4u : 2u); ++i) head += static_cast<char>((length >> (8 * i)) & 0xff);
    return head + dict;
}

// Writes head then data to path, checking every write, the flush and the close: a full disk or
// a file that takes no data (/dev/full, /proc) is an npy_error that says what failed.
inline void write_file(const std::string& path, std::string_view op, const std::string& head, const char* data,
                       std::uint64_t bytes) {
    auto reason = [](int e) { return e ? std::generic_category().message(e) : std::string("unknown error"); };
    errno = 0;
    std::FILE* file = std::fopen(path.c_str(), "wb");
    if (!file) fail(op, path, "cannot open the file for writing: " + reason(errno));
    auto give_up = [&](const std::string& what) {
        const int e = errno;
        std::fclose(file);
        fail(op, path, "cannot write the " + what + ": " + reason(e));
    };
    errno = 0;
    if (std::fwrite(head.data(), 1, head.size(), file) != head.size()) give_up("header");
    constexpr std::uint64_t chunk = std::uint64_t(1) << 30;  // fwrite's count is a size_t; stay modest
    for (std::uint64_t done = 0; done < bytes; done += chunk) {
        const std::size_t n = static_cast<std::size_t>(std::min(chunk, bytes - done));
        if (std::fwrite(data + done, 1, n, file) != n) give_up("data");
    }
    if (std::fflush(file) != 0) give_up("file (flushing it)");
    errno = 0;
    if (std::fclose(file) != 0) fail(op, path, "cannot write the file (closing it): " + reason(errno));
}

}  // namespace detail::npy

// Writes a view as a .npy file ('<f4', '<f8', '<i4' or '<i8', C order); a strided view is copied first.
// bf16 values are written as the float32 values they are, exactly ('<f4': NumPy has no bf16).
// Throws npy_error if the file cannot be written in full, saying which step failed.
template <class T, axis_type... Axes>
void save_npy(const std::string& path, const tensor_view<T, Axes...>& v) {
    using value_type = std::remove_const_t<T>;
    static_assert(tensor_element<value_type>, "dimsum: save_npy: the element type must be float, double, bf16, int32_t or int64_t");
    if constexpr (std::is_same_v<value_type, bf16>) {
        save_npy(path, detail::npy::contiguous_copy<float>(v).view());
        return;
    } else if (!v.is_contiguous()) {
        auto copy = detail::npy::contiguous_copy<value_type>(v);
        save_npy(path, copy.view());
        return;
    }
    std::array<std::size_t, sizeof...(Axes)> extents = v.shape().extents();
    const std::string head =
        detail::npy::file_head(detail::npy::native_descr<value_type>(), std::vector<std::size_t>(extents.begin(), extents.end()));
    detail::npy::write_file(path, "save_npy", head, reinterpret_cast<const char*>(v.data()), v.size() * sizeof(value_type));
}

template <class T, axis_type... Axes>
void save_npy(const std::string& path, const tensor<T, Axes...>& t) {
    save_npy(path, t.view());
}

}  // namespace dimsum
