#pragma once
// Parameter structs: a layer's tensors declared once, with Boost.Hana, then loaded, saved and
// listed by member name.
//
//   struct block {
//       BOOST_HANA_DEFINE_STRUCT(block,
//           (ds::nn::multi_head_attention<float, Model, Heads, Head>, attention),
//           (ds::tensor<float, Model>, norm_weight));
//   };
//   ds::load(layer, "weights.safetensors");   // or an .npz, or a folder of .npy files
//   ds::save(layer, "weights.npz");
//   for (const auto& p : ds::parameters(layer)) std::cout << p << '\n';
//
// A member is a tensor, a std::optional tensor (a parameter that may be absent: a file
// without it leaves it empty) or another parameter struct, whose members are named
// `outer.inner` (`attention.w_qkv`). The format follows the path: a name ending in `.npz`
// (what numpy.savez and savez_compressed write), one ending in `.safetensors`, else a folder
// holding one `NAME.npy` per parameter.
//
// Loading is all or nothing: the layer's new values are read into a copy, which replaces the
// layer only when every parameter has loaded, so an error leaves the layer as it was (at the
// cost of holding old and new values at once while loading). Every mismatch is one error
// naming the file and the parameter: a parameter missing from the file, a name in the file
// that is no parameter (unless allowed), another element type (file_error), another shape
// (shape_error, with both shapes), a malformed or truncated file (file_error). Extents of
// run-time axes come from the file.
//
// Saving writes a temporary file beside the target and renames it over the target once
// complete, so a failed save leaves any earlier file in place (a folder is written file by
// file, each renamed when complete).
//
// Not part of <dimsum/dimsum.hpp>: include <dimsum/interop/parameters.hpp>.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <istream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <streambuf>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/define_struct.hpp>
#include <boost/hana/first.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/string.hpp>

#include "dimsum/core/checked_math.hpp"
#include "dimsum/core/file_error.hpp"
#include "dimsum/interop/npy.hpp"
#include "dimsum/interop/safetensors.hpp"
#include "dimsum/interop/zip.hpp"
#include "dimsum/nn/parameter_struct.hpp"
#include "dimsum/shape/find_axis.hpp"

namespace dimsum {

// One parameter as ds::parameters lists it.
struct parameter_info {
    std::string name;                  // with the prefixes of the structs it lies in: "attention.w_qkv"
    std::vector<std::string> axes;     // the axes' names
    std::vector<std::size_t> extents;  // their extents
    std::string element_type;          // "float32" or "float64"
    std::size_t count = 0;             // elements
};

// `attention.w_o  float32  (heads*head=128, model=128)  16384`
inline std::ostream& operator<<(std::ostream& out, const parameter_info& p) {
    out << p.name << "  " << p.element_type << "  (";
    for (std::size_t i = 0; i < p.axes.size(); ++i) out << (i ? ", " : "") << p.axes[i] << '=' << p.extents[i];
    return out << ")  " << p.count;
}

// What a checkpoint says of one array: its element type as NumPy names it ("float32"), and
// its extents in C order.
struct stored_array {
    std::string element_type;
    std::vector<std::size_t> shape;
};

// A parameter that a file holds under another name, as other libraries' checkpoints name and
// lay out their weights: the parameter whose name (after the prefix) is `parameter`, or ends
// in "." + `parameter`, is read from the name with that ending replaced by `file`.
// `transposed`: the file holds the matrix's transpose, (out, in), as torch.nn.Linear stores
// its weight, where the parameter is (in, out).
struct stored_as {
    std::string_view parameter;
    std::string_view file;
    bool transposed = false;
};

struct load_options {
    std::string prefix = "";    // prepended to every name: "encoder.layer.0." loads one layer of a model's file
    bool allow_unused = false;  // whether the file may hold names (under the prefix) that are no parameter
    // the parameters the file holds under other names: the first rule that matches a name
    // applies; a name no rule matches is read as it is (e.g. nn::hugging_face_llama_names)
    std::span<const stored_as> names = {};
};

struct save_options {
    std::string prefix = "";  // prepended to every name
};

namespace detail::parameters {

template <class T>
constexpr std::string_view element_name() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>);
    return std::is_same_v<T, float> ? "float32" : std::is_same_v<T, double> ? "float64" : "bfloat16";
}

// What a .npy header says, for load: parameters are read in C order only.
inline stored_array stored_array_of(const npy::header_info& header, std::string_view op, const std::string& where) {
    if (header.fortran_order) {
        npy::fail(op, where, "the data is in Fortran (column-major) order; parameters are read in C order");
    }
    return {npy::dtype_name(header.descr), header.shape};
}

// One checkpoint open for reading, whatever its format. find() describes an array (nullopt if
// the file has no such name); check_size() checks that the file holds exactly `bytes` bytes of
// data for it, which callers do before allocating that many, so that a header's claim costs
// nothing until the file is seen to back it; read() then fills `bytes` bytes with its data,
// checking that again; read_part() reads `size` bytes from byte `from` of the data, checking
// first that the file holds exactly `total` bytes for the array.
class reader {
public:
    explicit reader(std::string path) : path_(std::move(path)) {}
    virtual ~reader() = default;
    virtual std::vector<std::string> names() const = 0;
    virtual std::optional<stored_array> find(const std::string& name) = 0;
    virtual void check_size(const std::string& name, std::uint64_t bytes) = 0;
    virtual void read(const std::string& name, void* into, std::uint64_t bytes) = 0;
    virtual void read_part(const std::string& name, std::uint64_t total, std::uint64_t from, void* into,
                           std::uint64_t size) = 0;
    const std::string& path() const { return path_; }
    std::string where(const std::string& name) const { return path_ + ", parameter '" + name + "'"; }
    // Bytes of array data read from the file so far (a deflated member counts the compressed
    // bytes inflated to reach and read its data).
    std::uint64_t bytes_read() const { return bytes_read_; }

protected:
    std::uint64_t bytes_read_ = 0;

private:
    std::string path_;
};

inline std::string file_name(const std::string& name) { return name + ".npy"; }

// A folder of .npy files, one per parameter, named NAME.npy.
class npy_folder_reader final : public reader {
public:
    npy_folder_reader(std::string path, std::string_view op) : reader(std::move(path)), op_(op) {}

    std::vector<std::string> names() const override {
        std::vector<std::string> found;
        std::error_code ec;
        for (const auto& file : std::filesystem::directory_iterator(path(), ec)) {
            const std::string name = file.path().filename().string();
            if (name.size() > 4 && name.ends_with(".npy")) found.push_back(name.substr(0, name.size() - 4));
        }
        if (ec) throw_file_error(op_, path(), "cannot list the folder: " + ec.message());
        return found;
    }

    std::optional<stored_array> find(const std::string& name) override {
        const std::string file = (std::filesystem::path(path()) / file_name(name)).string();
        std::error_code ec;
        if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;
        open_ = npy::open_for_reading(file, op_);
        file_ = file;
        header_ = npy::read_header(open_, npy::file_size_of(file, op_), op_, file);
        return stored_array_of(header_, op_, file);
    }

    void check_size(const std::string&, std::uint64_t bytes) override { npy::check_data_size(header_, bytes, op_, file_); }

    void read(const std::string& name, void* into, std::uint64_t bytes) override { read_part(name, bytes, 0, into, bytes); }

    void read_part(const std::string& name, std::uint64_t total, std::uint64_t from, void* into, std::uint64_t size) override {
        check_size(name, total);
        if (size == 0) return;
        open_.seekg(static_cast<std::streamoff>(header_.data_offset + from));
        npy::read_exact(open_, static_cast<char*>(into), size, op_, file_, "data");
        bytes_read_ += size;
    }

private:
    std::string_view op_;
    std::ifstream open_;
    std::string file_;
    npy::header_info header_;
};

// A member's bytes as a std::streambuf, for npy::read_header: each read takes exactly the
// bytes asked for, up to the member's size, so that reading the header reads (inflates)
// nothing of the data but what a match of the header's last symbols runs into.
class member_buffer final : public std::streambuf {
public:
    member_buffer(zip::member_stream& stream, std::uint64_t size) : stream_(stream), size_(size) {}

protected:
    std::streamsize xsgetn(char* into, std::streamsize n) override {
        std::streamsize done = 0;
        if (n > 0 && gptr() < egptr()) {  // the byte underflow() holds
            *into = *gptr();
            gbump(1);
            done = 1;
        }
        const auto more = static_cast<std::streamsize>(std::min<std::uint64_t>(n - done, size_ - stream_.position()));
        stream_.read(into + done, static_cast<std::uint64_t>(more));
        return done + more;
    }

    int_type underflow() override {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        if (stream_.position() == size_) return traits_type::eof();
        stream_.read(&byte_, 1);
        setg(&byte_, &byte_, &byte_ + 1);
        return traits_type::to_int_type(byte_);
    }

private:
    zip::member_stream& stream_;
    std::uint64_t size_;
    char byte_ = 0;
};

// An .npz: a ZIP archive of NAME.npy members, stored or deflated, each read as a stream in
// constant memory. find() reads (inflates) a member's .npy header only; check_size() and
// read() check the header's size against the directory's before reading (inflating) any of
// the data, which read() then reads straight into the tensor, and checks the CRC-32 and the
// size of the whole member (a stream that inflates to more than the directory says stops
// there). read_part() reads (inflates) the data up to the end of its part only, and leaves
// the CRC, which covers the whole member, unchecked.
class npz_reader final : public reader {
public:
    npz_reader(std::string path, std::string_view op) : reader(path), op_(op), archive_(std::move(path), op) {}

    std::vector<std::string> names() const override {
        std::vector<std::string> found;
        for (const auto& m : archive_.members()) {
            found.push_back(m.name.ends_with(".npy") ? m.name.substr(0, m.name.size() - 4) : m.name);
        }
        return found;
    }

    std::optional<stored_array> find(const std::string& name) override {
        const auto& members = archive_.members();
        auto it = std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.name == file_name(name); });
        if (it == members.end()) return std::nullopt;
        // The member described last is still at hand: described again, its header is not read
        // again. A tensor-parallel load asks for one member several times.
        if (described_ == &*it) return stored_array_of(header_, op_, where_);
        described_ = nullptr;
        member_ = &*it;
        where_ = archive_.where(*it);
        stream_.emplace(archive_, *it);
        member_buffer buffer(*stream_, it->size);
        std::istream in(&buffer);
        in.exceptions(std::ios::badbit);  // the stream's own file_error, not a short read
        header_ = npy::read_header(in, it->size, op_, where_);
        counted_ = stream_->compressed_read();
        stored_array described = stored_array_of(header_, op_, where_);
        described_ = member_;
        return described;
    }

    void check_size(const std::string&, std::uint64_t bytes) override { npy::check_data_size(header_, bytes, op_, where_); }

    void read(const std::string& name, void* into, std::uint64_t bytes) override {
        check_size(name, bytes);
        on_stream([&] {
            to_data(0);
            stream_->read(into, bytes);
            stream_->finish();
        });
    }

    void read_part(const std::string& name, std::uint64_t total, std::uint64_t from, void* into, std::uint64_t size) override {
        check_size(name, total);
        if (size == total) return read(name, into, size);  // the whole array: its CRC is checked
        if (size == 0) return;
        on_stream([&] {
            to_data(from);
            stream_->read(into, size);
        });
    }

private:
    // Runs f on the member's stream, counting the bytes it reads; a stream that failed is
    // dropped, and opened again if the member is read again.
    template <class F>
    void on_stream(F&& f) {
        try {
            f();
        } catch (...) {
            stream_.reset();
            throw;
        }
        bytes_read_ += stream_->compressed_read() - counted_;
        counted_ = stream_->compressed_read();
    }

    // Puts the stream at byte `from` of the data: ahead by skipping, back by opening it again
    // (a member read a second time).
    void to_data(std::uint64_t from) {
        const std::uint64_t at = header_.data_offset + from;
        if (!stream_ || stream_->position() > at) {
            stream_.reset();
            stream_.emplace(archive_, *member_);
            counted_ = 0;
        }
        stream_->skip(at - stream_->position());
    }

    std::string_view op_;
    zip::reader archive_;
    const zip::member* member_ = nullptr;
    const zip::member* described_ = nullptr;  // member_, once find() has read its header
    std::string where_;
    npy::header_info header_;
    std::optional<zip::member_stream> stream_;  // member_'s
    std::uint64_t counted_ = 0;                 // of its compressed_read(), what bytes_read_ has counted
};

// The element type a .safetensors dtype holds, as NumPy names it.
inline std::string numpy_name(const std::string& dtype) {
    static const std::map<std::string, std::string, std::less<>> names = {
        {"F64", "float64"}, {"F32", "float32"}, {"F16", "float16"}, {"BF16", "bfloat16"}, {"I64", "int64"},
        {"I32", "int32"},   {"I16", "int16"},   {"I8", "int8"},     {"U64", "uint64"},    {"U32", "uint32"},
        {"U16", "uint16"},  {"U8", "uint8"},    {"BOOL", "bool"},   {"F8_E4M3", "float8_e4m3"},
        {"F8_E5M2", "float8_e5m2"}};
    auto it = names.find(dtype);
    return it == names.end() ? dtype : it->second;
}

class safetensors_reader final : public reader {
public:
    safetensors_reader(std::string path, std::string_view op) : reader(std::move(path)), op_(op) {
        const std::uint64_t size = npy::file_size_of(this->path(), op);
        in_ = npy::open_for_reading(this->path(), op);
        if (size < 8) throw_file_error(op, this->path(), "truncated: less than the 8 bytes of a .safetensors header length");
        unsigned char length_bytes[8];
        npy::read_exact(in_, reinterpret_cast<char*>(length_bytes), 8, op, this->path(), "header length");
        const std::uint64_t length = zip::little_endian(length_bytes, 8);
        if (length > safetensors::max_header_length) {
            throw_file_error(op, this->path(), "not a .safetensors file: its header length " + std::to_string(length) +
                                                   " is more than the format's 100 MB");
        }
        if (length > size - 8) {
            throw_file_error(op, this->path(), "truncated: the header should end at byte " + std::to_string(8 + length) +
                                                   " but the file has " + std::to_string(size));
        }
        std::string header(length, '\0');
        npy::read_exact(in_, header.data(), length, op, this->path(), "header");
        entries_ = safetensors::header_parser(header, op, this->path()).parse();
        data_start_ = 8 + length;
        safetensors::check_layout(entries_, size - data_start_, op, this->path());
    }

    std::vector<std::string> names() const override {
        std::vector<std::string> found;
        for (const auto& e : entries_) found.push_back(e.name);
        return found;
    }

    std::optional<stored_array> find(const std::string& name) override {
        auto it = std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.name == name; });
        if (it == entries_.end()) return std::nullopt;
        found_ = &*it;
        return stored_array{numpy_name(it->dtype), it->shape};
    }

    void check_size(const std::string& name, std::uint64_t bytes) override {
        if (found_->end - found_->begin != bytes) {
            throw_file_error(op_, where(name), "the file holds " + std::to_string(found_->end - found_->begin) +
                                                   " bytes, the tensor " + std::to_string(bytes));
        }
    }

    void read(const std::string& name, void* into, std::uint64_t bytes) override { read_part(name, bytes, 0, into, bytes); }

    void read_part(const std::string& name, std::uint64_t total, std::uint64_t from, void* into,
                   std::uint64_t size) override {
        check_size(name, total);
        if (size == 0) return;
        in_.seekg(static_cast<std::streamoff>(data_start_ + found_->begin + from));
        npy::read_exact(in_, static_cast<char*>(into), size, op_, where(name), "data");
        bytes_read_ += size;
    }

private:
    std::string_view op_;
    std::ifstream in_;
    std::vector<safetensors::entry> entries_;
    const safetensors::entry* found_ = nullptr;
    std::uint64_t data_start_ = 0;
};

enum class format { npy_folder, npz, safetensors };

// The format a path names: by its extension, else a folder (one that exists, for reading).
inline format format_of(const std::filesystem::path& path, std::string_view op, bool reading) {
    if (path.extension() == ".npz") return format::npz;
    if (path.extension() == ".safetensors") return format::safetensors;
    std::error_code ec;
    if (!reading || std::filesystem::is_directory(path, ec)) return format::npy_folder;
    throw_file_error(op, path.string(),
                     std::filesystem::exists(path, ec)
                         ? "neither a folder of .npy files nor a file named .npz or .safetensors"
                         : "no such file or folder");
}

inline std::unique_ptr<reader> open(const std::filesystem::path& path, std::string_view op) {
    switch (format_of(path, op, true)) {
        case format::npy_folder: return std::make_unique<npy_folder_reader>(path.string(), op);
        case format::npz: return std::make_unique<npz_reader>(path.string(), op);
        case format::safetensors: return std::make_unique<safetensors_reader>(path.string(), op);
    }
    return nullptr;
}

template <class T>
void check_element_type(const reader& file, const std::string& name, const stored_array& stored, std::string_view op) {
    if (stored.element_type != element_name<T>()) {
        throw_file_error(op, file.where(name), "the file holds " + stored.element_type + " values, the tensor " +
                                                   std::string(element_name<T>()));
    }
}

// Each value of a float tensor rounded to the nearest bf16: a float32 array read into bf16.
template <axis_type... Axes>
tensor<bf16, Axes...> rounded_to_bf16(const tensor<float, Axes...>& wide) {
    tensor<bf16, Axes...> rounded(wide.shape());
    for (std::size_t i = 0; i < wide.size(); ++i) rounded.data()[i] = bf16(wide.data()[i]);
    return rounded;
}

// The bytes of data an array of this shape holds, or a file_error if that overflows: such a
// header is broken.
inline std::uint64_t data_bytes(const std::vector<std::size_t>& shape, std::size_t item_size, std::string_view op,
                                const std::string& where) {
    std::uint64_t bytes = item_size;
    for (std::size_t extent : shape) {
        if (__builtin_mul_overflow(bytes, extent, &bytes)) {
            throw_file_error(op, where, "the shape " + npy::describe_shape(shape) + " overflows the size");
        }
    }
    return bytes;
}

// Where the file holds the parameter called `name` (the prefix and the struct path included):
// its name there, and whether as its transpose.
struct source {
    std::string name;
    bool transposed = false;
};
inline source source_of(const std::string& name, const load_options& options) {
    const std::string_view relative = std::string_view(name).substr(options.prefix.size());
    for (const stored_as& rule : options.names) {
        const bool whole = relative == rule.parameter;
        const bool ending = relative.size() > rule.parameter.size() && relative.ends_with(rule.parameter) &&
                            relative[relative.size() - rule.parameter.size() - 1] == '.';
        if (whole || ending) return {name.substr(0, name.size() - rule.parameter.size()) + std::string(rule.file), rule.transposed};
    }
    return {name, false};
}

template <class T, axis_type In, axis_type Out>
void load_transposed(reader& file, const std::string& name, const stored_array& stored, tensor<T, In, Out>& t,
                     std::string_view op);

// Loads one tensor: its element type checked against the file, the file seen to hold the data
// its shape needs (before any is allocated), the shape checked against the tensor's, then the
// data.
// A bf16 tensor loads bfloat16 values as they are, or float32 ones rounded to nearest even
// (NumPy has no bfloat16: .npy and .npz files hold bf16 parameters as float32).
template <class T, axis_type... Axes>
void load_tensor(reader& file, const std::string& name, const stored_array& stored, tensor<T, Axes...>& t,
                 std::string_view op, bool transposed = false) {
    if (transposed) {
        if constexpr (sizeof...(Axes) == 2) {
            load_transposed(file, name, stored, t, op);
            return;
        } else {
            throw_file_error(op, file.where(name), "only a matrix can be stored transposed, not a tensor of " +
                                                       std::to_string(sizeof...(Axes)) + " axes");
        }
    }
    if constexpr (std::is_same_v<T, bf16>) {
        if (stored.element_type == "float32") {
            tensor<float, Axes...> wide;
            load_tensor(file, name, stored, wide, op);
            t = rounded_to_bf16(wide);
            return;
        }
    }
    check_element_type<T>(file, name, stored, op);
    file.check_size(name, data_bytes(stored.shape, sizeof(T), op, file.where(name)));
    auto fresh = npy::tensor_for<T, Axes...>(stored.shape, shape<Axes...>::axes, op, file.where(name));
    file.read(name, fresh.data(), fresh.size() * sizeof(T));
    t = std::move(fresh);
}

// A matrix (in, out) that the file holds as (out, in): read as such, then transposed.
template <class T, axis_type In, axis_type Out>
void load_transposed(reader& file, const std::string& name, const stored_array& stored, tensor<T, In, Out>& t,
                     std::string_view op) {
    tensor<T, Out, In> stored_matrix;
    load_tensor(file, name, stored, stored_matrix, op);
    const std::size_t rows = stored_matrix.extent(1), columns = stored_matrix.extent(0);
    tensor<T, In, Out> matrix(In{rows}, Out{columns});
    for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < columns; ++j) matrix.data()[i * columns + j] = stored_matrix.data()[j * rows + i];
    }
    t = std::move(matrix);
}

// A file written in full under a temporary name, then renamed over the target: an error on
// the way removes the temporary and leaves the target as it was.
class output_file {
public:
    output_file(std::filesystem::path target, std::string_view op)
        : target_(std::move(target)), temporary_(target_.string() + ".partial"), op_(op) {
        file_ = std::fopen(temporary_.c_str(), "wb");
        if (!file_) throw_file_error(op_, target_.string(), "cannot open a file for writing in its folder");
    }
    output_file(const output_file&) = delete;
    output_file& operator=(const output_file&) = delete;
    ~output_file() {
        if (file_) std::fclose(file_);
        if (!committed_) std::remove(temporary_.c_str());
    }

    void write(const void* data, std::size_t size) {
        constexpr std::size_t chunk = std::size_t(1) << 30;
        for (std::size_t done = 0; done < size; done += chunk) {
            const std::size_t n = std::min(chunk, size - done);
            if (std::fwrite(static_cast<const char*>(data) + done, 1, n, file_) != n) {
                throw_file_error(op_, target_.string(), "cannot write the file (is the disk full?)");
            }
        }
    }

    void commit() {
        const bool flushed = std::fflush(file_) == 0;
        const bool closed = std::fclose(file_) == 0;
        file_ = nullptr;
        if (!flushed || !closed) throw_file_error(op_, target_.string(), "cannot write the file (is the disk full?)");
        std::error_code ec;
        std::filesystem::rename(temporary_, target_, ec);
        if (ec) throw_file_error(op_, target_.string(), "cannot replace the file: " + ec.message());
        committed_ = true;
    }

private:
    std::filesystem::path target_;
    std::string temporary_;
    std::string_view op_;
    std::FILE* file_ = nullptr;
    bool committed_ = false;
};

// What save writes of one parameter.
struct saved_array {
    std::string name;
    std::size_t item_size;
    std::string npy_descr, safetensors_dtype;
    std::vector<std::size_t> shape;
    const void* data;
    std::size_t bytes;
};

}  // namespace detail::parameters

// The parameters of a layer, in the order of declaration: name, axes, extents, element type
// and count. An empty std::optional parameter is not listed.
template <class Layer>
std::vector<parameter_info> parameters(const Layer& layer, const std::string& prefix = "") {
    std::vector<parameter_info> list;
    auto add = [&]<class T, axis_type... Axes>(const std::string& name, const tensor<T, Axes...>& t) {
        parameter_info p{name, {}, {}, std::string(detail::parameters::element_name<T>()), t.size()};
        for (std::size_t i = 0; i < sizeof...(Axes); ++i) {
            const axis_desc& a = shape<Axes...>::axes[i];
            p.axes.push_back(a.is_named() ? std::string(a.name) : std::to_string(i));
            p.extents.push_back(t.shape().extent(i));
        }
        list.push_back(std::move(p));
    };
    detail::parameters::for_each_present(layer, prefix, add);
    return list;
}

// Loads every parameter of `layer` from a folder of .npy files, an .npz or a .safetensors
// file, all or nothing (see the top of this file).
template <class Layer>
void load(Layer& layer, const std::filesystem::path& path, const load_options& options = {}) {
    constexpr std::string_view op = "load";
    auto file = detail::parameters::open(path, op);
    Layer staged = layer;
    std::set<std::string> used;
    auto load_member = [&]<class M>(const std::string& parameter, M& member) {
        const auto [name, transposed] = detail::parameters::source_of(parameter, options);
        std::optional<stored_array> stored = file->find(name);
        if constexpr (detail::parameters::is_optional<M>) {
            if (!stored) {
                member.reset();
                return;
            }
            if (!member) member.emplace();
            detail::parameters::load_tensor(*file, name, *stored, *member, op, transposed);
        } else {
            if (!stored) {
                detail::throw_file_error(op, file->path(), "the file has no parameter '" + name + "'" +
                                                               (name == parameter ? "" : " (the layer's '" + parameter + "')"));
            }
            detail::parameters::load_tensor(*file, name, *stored, member, op, transposed);
        }
        used.insert(name);
    };
    detail::parameters::for_each(staged, options.prefix, load_member);
    if (!options.allow_unused) {
        for (const std::string& name : file->names()) {
            if (name.starts_with(options.prefix) && !used.contains(name)) {
                detail::throw_file_error(op, file->path(), "'" + name + "' in the file is no parameter of the layer "
                                                   "(load_options{.allow_unused = true} ignores such names)");
            }
        }
    }
    layer = std::move(staged);
}

// Saves every parameter of `layer` as a folder of .npy files, an .npz (stored, as numpy.savez
// writes it) or a .safetensors file, chosen by the path's extension.
template <class Layer>
void save(const Layer& layer, const std::filesystem::path& path, const save_options& options = {}) {
    constexpr std::string_view op = "save";
    using detail::parameters::saved_array;
    const detail::parameters::format format = detail::parameters::format_of(path, op, false);
    std::vector<saved_array> arrays;
    std::vector<std::vector<float>> widened;  // bf16 parameters for .npz and .npy, which have no bfloat16
                                              // (moving a vector keeps its data where it is)
    auto add = [&]<class T, axis_type... Axes>(const std::string& name, const tensor<T, Axes...>& t) {
        auto extents = t.shape().extents();
        std::vector<std::size_t> shape(extents.begin(), extents.end());
        if constexpr (std::is_same_v<T, bf16>) {
            if (format != detail::parameters::format::safetensors) {
                std::vector<float>& wide = widened.emplace_back(t.size());
                for (std::size_t i = 0; i < t.size(); ++i) wide[i] = static_cast<float>(t.data()[i]);
                arrays.push_back(saved_array{name, 4, detail::npy::native_descr<float>(), "F32", std::move(shape),
                                             wide.data(), wide.size() * sizeof(float)});
                return;
            }
        }
        arrays.push_back(saved_array{name, sizeof(T), std::is_same_v<T, bf16> ? "" : detail::npy::native_descr<T>(),
                                     std::is_same_v<T, bf16> ? "BF16" : sizeof(T) == 4 ? "F32" : "F64", std::move(shape),
                                     t.data(), t.size() * sizeof(T)});
    };
    detail::parameters::for_each_present(layer, options.prefix, add);

    switch (format) {
        case detail::parameters::format::npy_folder: {
            std::error_code ec;
            std::filesystem::create_directories(path, ec);
            if (ec) detail::throw_file_error(op, path.string(), "cannot create the folder: " + ec.message());
            for (const saved_array& a : arrays) {
                detail::parameters::output_file out(path / detail::parameters::file_name(a.name), op);
                const std::string head = detail::npy::file_head(a.npy_descr, a.shape);
                out.write(head.data(), head.size());
                out.write(a.data, a.bytes);
                out.commit();
            }
            break;
        }
        case detail::parameters::format::npz: {
            detail::parameters::output_file out(path, op);
            detail::zip::writer archive(out, path.string(), op);
            for (const saved_array& a : arrays) {
                const std::string head = detail::npy::file_head(a.npy_descr, a.shape);
                const std::span<const unsigned char> pieces[] = {
                    {reinterpret_cast<const unsigned char*>(head.data()), head.size()},
                    {static_cast<const unsigned char*>(a.data), a.bytes}};
                archive.add(detail::parameters::file_name(a.name), pieces);
            }
            archive.finish();
            out.commit();
            break;
        }
        case detail::parameters::format::safetensors: {
            std::vector<detail::safetensors::entry> entries;
            for (const saved_array& a : arrays) entries.push_back({a.name, a.safetensors_dtype, a.shape, 0, 0});
            const std::string head = detail::safetensors::file_head(entries);
            detail::parameters::output_file out(path, op);
            out.write(head.data(), head.size());
            for (const saved_array& a : arrays) out.write(a.data, a.bytes);
            out.commit();
            break;
        }
    }
}

// A checkpoint (any format load reads) opened once, its arrays read one at a time, whole or in
// part: how each rank of a tensor-parallel layer reads only its own slice of a full model.
//
//   ds::checkpoint file("model.safetensors");
//   ds::tensor<float, Model, Local> w;                      // Local: a run-time extent
//   file.read_slice<Local>("attention.w_q", 256, 128, w);  // columns [256, 384) of (model, 768)
//
// A slice along an axis reads only its bytes from a .safetensors file, a folder of .npy files
// or a stored .npz member; a deflated .npz member is inflated from its start up to the end of
// the slice (no further). A member's CRC covers all of it, and so goes unchecked for a part
// (a slice of the whole extent is read whole, and checked). Errors are load's: a missing name or
// another element type (file_error), another shape or a slice past the array's end
// (shape_error), each naming the file and the parameter. `into` is replaced only on success.
class checkpoint {
public:
    explicit checkpoint(const std::filesystem::path& path) : file_(detail::parameters::open(path, op)) {}

    const std::string& path() const { return file_->path(); }
    std::vector<std::string> names() const { return file_->names(); }
    // An array's element type and extents, or nullopt if the file has no such name.
    std::optional<stored_array> find(const std::string& name) { return file_->find(name); }
    bool contains(const std::string& name) { return find(name).has_value(); }

    // The whole array `name`, its element type and shape checked as by load.
    template <class T, axis_type... Axes>
    void read(const std::string& name, tensor<T, Axes...>& into) {
        detail::parameters::load_tensor(*file_, name, require(name), into, op);
    }

    // The positions [first, first + count) along axis Axis of `into` (the array's axis at the same
    // position) of the array `name`; every other extent is the file's.
    template <axis_type Axis, class T, axis_type... Axes>
    void read_slice(const std::string& name, std::size_t first, std::size_t count, tensor<T, Axes...>& into) {
        using S = shape<Axes...>;
        constexpr detail::axis_lookup found = detail::find_axis<S>("checkpoint::read_slice", describe_axis<Axis>);
        static_assert(found.error.length == 0, "dimsum: checkpoint::read_slice: Axis must name one axis of the tensor");
        constexpr std::size_t k = found.position;
        const stored_array stored = require(name);
        if constexpr (std::is_same_v<T, bf16>) {  // a float32 array: its slice read as float, then rounded
            if (stored.element_type == "float32") {
                tensor<float, Axes...> wide;
                read_slice<Axis>(name, first, count, wide);
                into = detail::parameters::rounded_to_bf16(wide);
                return;
            }
        }
        detail::parameters::check_element_type<T>(*file_, name, stored, op);
        if (stored.shape.size() != S::rank) {  // another number of axes: tensor_for says so
            detail::npy::tensor_for<T, Axes...>(stored.shape, S::axes, op, file_->where(name));
        }
        const std::size_t extent = stored.shape[k];
        if (first > extent || count > extent - first) {
            throw shape_error("dimsum: " + std::string(op) + ": " + file_->where(name) + ": positions [" +
                              std::to_string(first) + ", " + std::to_string(first + count) + ") of axis " +
                              std::to_string(k) + " lie outside its extent " + std::to_string(extent));
        }
        // C order: `outer` runs, each of `count` slabs of `inner` elements, `extent` slabs apart.
        std::size_t outer = 1, inner = 1;
        for (std::size_t i = 0; i < k; ++i) outer = detail::checked_multiply(outer, stored.shape[i], op);
        for (std::size_t i = k + 1; i < S::rank; ++i) inner = detail::checked_multiply(inner, stored.shape[i], op);
        const std::uint64_t slab = detail::checked_multiply(inner, sizeof(T), op);
        const std::uint64_t total = detail::checked_multiply(detail::checked_multiply(outer, extent, op), slab, op);
        const std::uint64_t run = count * slab;
        file_->check_size(name, total);  // before allocating: the file backs the shape it claims
        std::vector<std::size_t> part_shape = stored.shape;
        part_shape[k] = count;
        auto fresh = detail::npy::tensor_for<T, Axes...>(part_shape, S::axes, op, file_->where(name));
        auto* out = reinterpret_cast<unsigned char*>(fresh.data());
        if (count == extent) {
            file_->read_part(name, total, 0, out, total);  // the whole array: one read
        } else {
            for (std::size_t o = 0; o < outer; ++o) file_->read_part(name, total, (o * extent + first) * slab, out + o * run, run);
        }
        into = std::move(fresh);
    }

    // Bytes of array data read from the file so far (a deflated .npz member counts the
    // compressed bytes inflated to reach and read its data): what a slice saves can be seen.
    std::uint64_t bytes_read() const { return file_->bytes_read(); }

private:
    static constexpr std::string_view op = "load";

    stored_array require(const std::string& name) {
        std::optional<stored_array> stored = file_->find(name);
        if (!stored) detail::throw_file_error(op, file_->path(), "the file has no parameter '" + name + "'");
        return *std::move(stored);
    }

    std::unique_ptr<detail::parameters::reader> file_;
};

}  // namespace dimsum
