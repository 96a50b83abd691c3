// .npy I/O (interop/npy.hpp): round trips, files as NumPy writes them, and one clear error,
// of the right type and naming the facts, for each kind of broken or unexpected file.
#include "support.hpp"

#include <dimsum/interop/npy.hpp>

#include <xtensor/xnpy.hpp>  // an independent reader, to check what save_npy writes

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>

namespace ds = dimsum;
namespace fs = std::filesystem;

using Batch = ds::axis<"batch">;
using Seq = ds::axis<"seq">;
using Model = ds::axis<"model", 4>;

using test::temp_dir;

namespace {

// A .npy file as NumPy lays it out: the preamble of the version, the dict padded with spaces
// and a newline to a multiple of 64 bytes, then the data.
std::string npy_file(const std::string& dict, const std::string& data, int major = 1) {
    std::size_t preamble = major == 1 ? 10 : 12;
    std::string header = dict;
    while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::string bytes = "\x93NUMPY";
    bytes += static_cast<char>(major);
    bytes += '\0';
    for (std::size_t i = 0; i < preamble - 8; ++i) bytes += static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return bytes + header + data;
}

template <class T>
std::string raw(std::initializer_list<T> values) {
    std::string bytes(values.size() * sizeof(T), '\0');
    std::memcpy(bytes.data(), values.begin(), bytes.size());
    return bytes;
}

// The six float32 values [[1.5, -2, 0.25], [3, 4, -0.5]], little-endian, and a header for
// them with the descr and shape of a test's choosing.
const std::string six_floats = raw<float>({1.5f, -2.0f, 0.25f, 3.0f, 4.0f, -0.5f});
std::string header(const std::string& descr = "<f4", const std::string& shape = "(2, 3)",
                   const std::string& order = "False") {
    return "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
}

// Matches an exception whose message contains every one of the given pieces.
class message_has : public Catch::MatcherBase<std::exception> {
public:
    message_has(std::initializer_list<std::string> pieces) : pieces_(pieces) {}
    bool match(const std::exception& e) const override {
        std::string what = e.what();
        for (const auto& piece : pieces_) {
            if (what.find(piece) == std::string::npos) return false;
        }
        return true;
    }
    std::string describe() const override {
        std::string d = "has a message containing";
        for (const auto& piece : pieces_) d += " \"" + piece + "\"";
        return d;
    }

private:
    std::vector<std::string> pieces_;
};

using Rows = ds::axis<"rows">;
using Cols = ds::axis<"cols">;

auto load_rows_cols(const std::string& path) { return ds::load_npy<float, Rows, Cols>(path); }

template <class A, class B>
bool same_bytes(const A& a, const B& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}

}  // namespace

TEST_CASE("a float tensor with run-time axes round-trips through a .npy file") {
    temp_dir tmp;
    ds::tensor<float, Batch, Seq, Model> x(Batch{2}, Seq{3});
    ds::fill_uniform(x, 7);
    std::string path = tmp.path("x.npy");
    ds::save_npy(path, x);

    auto y = ds::load_npy<float, Batch, Seq, Model>(path);
    REQUIRE(y.shape() == x.shape());
    REQUIRE(same_bytes(y, x));
    // Extents given for the run-time axes, or for all axes, are checked and agree.
    REQUIRE(same_bytes(ds::load_npy<float, Batch, Seq, Model>(path, Batch{2}, Seq{3}), x));
    REQUIRE(same_bytes(ds::load_npy<float, Batch, Seq, Model>(path, Batch{2}, Seq{3}, Model{}), x));
    // The same file read by xtensor's own reader.
    test::require_close(x, xt::load_npy<float>(path), 0, 0);
}

TEST_CASE("a double tensor round-trips bit for bit, special values included") {
    temp_dir tmp;
    ds::tensor<double, Seq, ds::dim<3>> x(Seq{2});
    const double values[] = {0.1, -0.0, std::numeric_limits<double>::denorm_min(),
                             std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), -1e300};
    std::copy(std::begin(values), std::end(values), x.data());
    ds::save_npy(tmp.path("x.npy"), x);
    auto y = ds::load_npy<double, Seq, ds::dim<3>>(tmp.path("x.npy"));
    REQUIRE(y.shape() == x.shape());
    REQUIRE(same_bytes(y, x));

    // A tensor without axes is a NumPy scalar array, of shape ().
    ds::tensor<double> scalar;
    scalar.data()[0] = -2.5;
    ds::save_npy(tmp.path("scalar.npy"), scalar);
    REQUIRE(ds::load_npy<double>(tmp.path("scalar.npy")).data()[0] == -2.5);
}

TEST_CASE("a strided view is saved as its elements in row-major order, and an empty axis round-trips") {
    temp_dir tmp;
    ds::tensor<float, Rows, Cols> x(Rows{4}, Cols{3});
    ds::fill_uniform(x, 3);
    // Every other row, through a view with strides of its own.
    ds::tensor_view<const float, Rows, Cols> every_other(x.data(), ds::shape<Rows, Cols>(Rows{2}, Cols{3}), {6, 1});
    REQUIRE_FALSE(every_other.is_contiguous());
    ds::save_npy(tmp.path("rows.npy"), every_other);
    auto y = load_rows_cols(tmp.path("rows.npy"));
    REQUIRE(y.shape().extents() == std::array<std::size_t, 2>{2, 3});
    for (std::size_t r = 0; r < 2; ++r) {
        for (std::size_t c = 0; c < 3; ++c) REQUIRE(y(r, c) == x(2 * r, c));
    }

    ds::tensor<float, Rows, Cols> empty(Rows{0}, Cols{5});
    ds::save_npy(tmp.path("empty.npy"), empty);
    REQUIRE(load_rows_cols(tmp.path("empty.npy")).shape() == empty.shape());
}

TEST_CASE("files as NumPy writes them load, in format versions 1.0, 2.0 and 3.0") {
    temp_dir tmp;
    // np.save of np.array([[1.5, -2, 0.25], [3, 4, -0.5]], np.float32) by NumPy 1.24, byte for
    // byte: its header has room for the first extent to grow, hence 118 bytes, not 54.
    std::string numpy_1_24 = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + header() + std::string(58, ' ') + "\n" +
                             std::string("\x00\x00\xc0\x3f\x00\x00\x00\xc0\x00\x00\x80\x3e"
                                         "\x00\x00\x40\x40\x00\x00\x80\x40\x00\x00\x00\xbf",
                                         24);
    REQUIRE(numpy_1_24.size() == 152);
    for (const std::string& file : {numpy_1_24, npy_file(header(), six_floats, 2), npy_file(header(), six_floats, 3)}) {
        auto x = load_rows_cols(tmp.write("six.npy", file));
        REQUIRE(x.shape().extents() == std::array<std::size_t, 2>{2, 3});
        REQUIRE(x(0, 0) == 1.5f);
        REQUIRE(x(0, 1) == -2.0f);
        REQUIRE(x(1, 2) == -0.5f);
    }
    // Keys in another order, double quotes, no trailing comma, a 1-tuple, Python 2's 3L.
    auto v = ds::load_npy<double, Seq>(
        tmp.write("v.npy", npy_file("{\"shape\": (3L,), 'fortran_order': False, 'descr': '<f8'}",
                                    raw<double>({0.5, -1e300, 2.0}))));
    REQUIRE(v.size() == 3);
    REQUIRE(v(1) == -1e300);
}

TEST_CASE("load_npy: a file that cannot be read") {
    temp_dir tmp;
    std::string missing = tmp.path("missing.npy");
    REQUIRE_THROWS_MATCHES(load_rows_cols(missing), ds::npy_error,
                           message_has({"dimsum: load_npy: " + missing + ": cannot read the file:", "No such file"}));
    REQUIRE_THROWS_MATCHES(load_rows_cols(tmp.dir.string()), ds::npy_error,
                           message_has({"dimsum: load_npy: " + tmp.dir.string() + ": cannot read the file:",
                                        "Is a directory"}));
}

TEST_CASE("load_npy: a file that is not a .npy file, or is cut short") {
    temp_dir tmp;
    auto error = [&](const std::string& bytes) {
        return test::error_of([&] { load_rows_cols(tmp.write("f.npy", bytes)); });
    };
    std::string prefix = "dimsum: load_npy: " + tmp.path("f.npy") + ": ";
    REQUIRE_THROWS_AS(load_rows_cols(tmp.write("f.npy", "")), ds::npy_error);
    REQUIRE(error("") == prefix + "the file is empty, not a .npy file");
    REQUIRE_THROWS_AS(load_rows_cols(tmp.write("f.npy", "1.5,-2,0.25\n")), ds::npy_error);
    REQUIRE(error("1.5,-2,0.25\n") == prefix + "not a .npy file: it does not start with \"\\x93NUMPY\"");
    REQUIRE(error("PK\x03\x04") == prefix + "not a .npy file: it does not start with \"\\x93NUMPY\"");

    std::string whole = npy_file(header(), six_floats);
    REQUIRE_THROWS_AS(load_rows_cols(tmp.write("f.npy", whole.substr(0, 4))), ds::npy_error);
    REQUIRE(error(whole.substr(0, 4)) == prefix + "truncated: 4 bytes, less than the .npy preamble");
    REQUIRE(error(whole.substr(0, 9)) == prefix + "truncated: 9 bytes, less than the .npy preamble");
    REQUIRE(error(whole.substr(0, 40)) == prefix + "truncated: the header should end at byte 128 but the file has 40");
    REQUIRE_THROWS_AS(load_rows_cols(tmp.write("f.npy", whole.substr(0, whole.size() - 1))), ds::npy_error);
    REQUIRE(error(whole.substr(0, whole.size() - 1)) ==
            prefix + "truncated: the header's shape (2, 3) of '<f4' (float32) needs 24 bytes of data, the file holds 23");
    REQUIRE(error(whole.substr(0, 128)) ==
            prefix + "truncated: the header's shape (2, 3) of '<f4' (float32) needs 24 bytes of data, the file holds 0");
    REQUIRE_THROWS_AS(load_rows_cols(tmp.write("f.npy", whole + whole)), ds::npy_error);
    REQUIRE(error(whole + whole) == prefix +
                                        "152 bytes follow the data (the header's shape (2, 3) of '<f4' (float32) needs 24 "
                                        "bytes of data): more than one array in the file?");

    std::string version_4 = whole;
    version_4[6] = 4;
    REQUIRE_THROWS_MATCHES(load_rows_cols(tmp.write("f.npy", version_4)), ds::npy_error,
                           message_has({prefix, "unsupported .npy format version 4.0"}));
    std::string huge_header = npy_file(header(), six_floats, 2);
    huge_header[11] = 0x40;  // a length field of 1 GiB and more
    REQUIRE_THROWS_MATCHES(load_rows_cols(tmp.write("f.npy", huge_header)), ds::npy_error,
                           message_has({prefix, "malformed header: its length field says 1073741940 bytes"}));
}

TEST_CASE("load_npy: a malformed header") {
    temp_dir tmp;
    std::string prefix = "dimsum: load_npy: " + tmp.path("f.npy") + ": malformed header: ";
    auto requires_malformed = [&](const std::string& dict, const std::string& what) {
        INFO(dict);
        REQUIRE_THROWS_MATCHES(load_rows_cols(tmp.write("f.npy", npy_file(dict, six_floats))), ds::npy_error,
                               message_has({prefix + what}));
    };
    requires_malformed("", "expected '{' at character 54 of \"\"");
    requires_malformed("{'descr': '<f4', 'fortran_order': False}", "the header has no 'shape'");
    requires_malformed("{'descr': '<f4', 'shape': (2, 3)}", "the header has no 'fortran_order'");
    requires_malformed("{'fortran_order': False, 'shape': (2, 3)}", "the header has no 'descr'");
    requires_malformed("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}",
                       "unexpected key 'extra' in the header \"{'descr'");
    requires_malformed("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}",
                       "'descr' appears twice");
    requires_malformed("{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3)}",
                       "expected ':' after 'descr' at character 9 of \"{'descr' '<f4',");
    requires_malformed("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}", "expected ',' or '}' at character 17");
    requires_malformed(header("<f4", "(2, 3)", "false"), "expected True or False for 'fortran_order'");
    requires_malformed(header("<f4", "[2, 3]"), "expected a tuple for 'shape'");
    requires_malformed(header("<f4", "(2, -3)"), "expected a non-negative integer in 'shape'");
    requires_malformed(header("<f4", "(2 3)"), "expected ',' or ')' in 'shape'");
    requires_malformed(header("<f4", "(6)"), "expected a tuple for 'shape' (one extent is written `(n,)`");
    requires_malformed(header("<f4", "(2, 99999999999999999999)"), "an extent in 'shape' is too large");
    requires_malformed(header() + " x", "expected only whitespace after '}'");
    requires_malformed(header("<f4", "(4294967296, 4294967296)"), "the shape (4294967296, 4294967296) overflows");
    requires_malformed(header("<f4", "(0, 4294967296, 4294967296)"), "the shape (0, 4294967296, 4294967296) overflows");
    // Control bytes in a message are escaped.
    requires_malformed(header() + std::string("\x01", 1), "expected only whitespace after '}' at character 59 of "
                                                          "\"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\\x01\"");
    REQUIRE_THROWS_MATCHES(load_rows_cols(tmp.write("f.npy", npy_file(std::string("{\x01}", 3), six_floats))),
                           ds::npy_error, message_has({"of \"{\\x01}\""}));
    REQUIRE_THROWS_MATCHES(
        load_rows_cols(tmp.write("f.npy", npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
                                                   six_floats))),
        ds::npy_error, message_has({"the file holds a structured array"}));
}

TEST_CASE("load_npy: a dtype other than the tensor's element type, or Fortran order") {
    temp_dir tmp;
    std::string path = tmp.path("f.npy");
    auto write = [&](const std::string& dict, const std::string& data) { return tmp.write("f.npy", npy_file(dict, data)); };

    write(header("<f8"), raw<double>({1, 2, 3, 4, 5, 6}));
    REQUIRE_THROWS_AS(load_rows_cols(path), ds::npy_error);
    REQUIRE(test::error_of([&] { load_rows_cols(path); }) ==
            "dimsum: load_npy: " + path + ": the file holds '<f8' (float64) values; a tensor of float loads '<f4' "
            "(float32) only");
    write(header("<f4"), six_floats);
    REQUIRE_THROWS_MATCHES((ds::load_npy<double, Rows, Cols>(path)), ds::npy_error,
                           message_has({path, "'<f4' (float32) values; a tensor of double loads '<f8' (float64) only"}));
    write(header("<i8"), raw<long long>({1, 2, 3, 4, 5, 6}));
    REQUIRE_THROWS_MATCHES(load_rows_cols(path), ds::npy_error, message_has({path, "'<i8' (int64)", "'<f4' (float32)"}));
    write(header(">f4"), six_floats);
    REQUIRE_THROWS_MATCHES(load_rows_cols(path), ds::npy_error, message_has({"'>f4' (big-endian float32)"}));
    write(header("|b1"), std::string(6, '\1'));
    REQUIRE_THROWS_MATCHES(load_rows_cols(path), ds::npy_error, message_has({"'|b1' (bool)"}));
    write(header("<U3"), std::string(72, '\0'));
    REQUIRE_THROWS_MATCHES(load_rows_cols(path), ds::npy_error, message_has({"the file holds '<U3' values"}));

    write(header("<f4", "(2, 3)", "True"), six_floats);
    REQUIRE_THROWS_AS(load_rows_cols(path), ds::npy_error);
    REQUIRE(test::error_of([&] { load_rows_cols(path); }) ==
            "dimsum: load_npy: " + path + ": the data is in Fortran (column-major) order; load_npy reads C "
            "(row-major) order only: save np.ascontiguousarray(a)");
}

TEST_CASE("load_npy: a well-formed file of another rank or extents is a shape_error") {
    temp_dir tmp;
    std::string path = tmp.write("f.npy", npy_file(header("<f4", "(2, 3)"), six_floats));

    REQUIRE_THROWS_AS((ds::load_npy<float, Batch, Seq, Model>(path)), ds::shape_error);
    REQUIRE(test::error_of([&] { ds::load_npy<float, Batch, Seq, Model>(path); }) ==
            "dimsum: load_npy: " + path + ": the file's array has 2 axes, the tensor 3 (the file's shape (2, 3), "
            "the tensor's (batch=?, seq=?, model=4))");

    REQUIRE_THROWS_AS((ds::load_npy<float, Seq, Model>(path)), ds::shape_error);
    REQUIRE(test::error_of([&] { ds::load_npy<float, Seq, Model>(path); }) ==
            "dimsum: load_npy: " + path + ": axis model is 4 in the tensor but 3 in the file (the file's shape "
            "(2, 3), the tensor's (seq=?, model=4))");

    // An extent the caller gives for a run-time axis is checked the same way.
    REQUIRE_THROWS_AS((ds::load_npy<float, Rows, Cols>(path, Rows{2}, Cols{4})), ds::shape_error);
    REQUIRE(test::error_of([&] { ds::load_npy<float, Rows, Cols>(path, Rows{2}, Cols{4}); }) ==
            "dimsum: load_npy: " + path + ": axis cols is 4 in the tensor but 3 in the file (the file's shape "
            "(2, 3), the tensor's (rows=2, cols=4))");
    // Unnamed axes are named by position.
    REQUIRE_THROWS_MATCHES((ds::load_npy<float, ds::dim<2>, ds::dim<4>>(path)), ds::shape_error,
                           message_has({"axis 1 is 4 in the tensor but 3 in the file"}));
    REQUIRE(ds::load_npy<float, ds::dim<2>, ds::dim<3>>(path)(1, 0) == 3.0f);
}

TEST_CASE("save_npy: a file that cannot be written") {
    temp_dir tmp;
    ds::tensor<float, Rows, Cols> x(Rows{2}, Cols{3});
    std::string path = tmp.path("no/such/dir/x.npy");
    REQUIRE_THROWS_MATCHES(ds::save_npy(path, x), ds::npy_error,
                           message_has({"dimsum: save_npy: " + path + ": cannot open the file for writing: ",
                                        "No such file or directory"}));
}

TEST_CASE("load_npy: control bytes in the dtype string are escaped in the message") {
    temp_dir tmp;
    std::string path = tmp.write("f.npy", npy_file(header(std::string("<f\x1b[2J\n", 7)), six_floats));
    try {
        load_rows_cols(path);
        FAIL("a dtype of control bytes was accepted");
    } catch (const ds::npy_error& e) {
        std::string what = e.what();
        INFO(what);
        REQUIRE(what.find("'<f\\x1b[2J\\x0a'") != std::string::npos);
        REQUIRE(std::none_of(what.begin(), what.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }));
    }
}

TEST_CASE("save_npy: a device that takes no data, or a file that cannot be written, says what failed") {
    ds::tensor<float, Rows, Cols> x(Rows{2}, Cols{3});
    if (std::filesystem::exists("/dev/full")) {
        REQUIRE_THROWS_MATCHES(ds::save_npy("/dev/full", x), ds::npy_error,
                               message_has({"dimsum: save_npy: /dev/full: cannot write the ", "No space left on device"}));
    }
    if (std::filesystem::exists("/proc/version")) {
        REQUIRE_THROWS_MATCHES(ds::save_npy("/proc/version", x), ds::npy_error,
                               message_has({"dimsum: save_npy: /proc/version: cannot "}));
        try {
            ds::save_npy("/proc/version", x);
        } catch (const ds::npy_error& e) {
            REQUIRE(std::string(e.what()).find("read") == std::string::npos);  // a write failed, not a read
        }
    }
}

TEST_CASE("save_npy writes what numpy.save writes: a header padded to 64 bytes, read back exactly") {
    temp_dir tmp;
    ds::tensor<double, Rows, Cols> x(Rows{3}, Cols{5});
    ds::fill_uniform(x, 7);
    std::string path = tmp.path("x.npy");
    ds::save_npy(path, x);
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(bytes.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
    std::size_t header_length = static_cast<unsigned char>(bytes[8]) + 256u * static_cast<unsigned char>(bytes[9]);
    REQUIRE((10 + header_length) % 64 == 0);
    REQUIRE(bytes.substr(10, header_length).find("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 5), }") == 0);
    REQUIRE(bytes.size() == 10 + header_length + x.size() * sizeof(double));
    auto back = ds::load_npy<double, Rows, Cols>(path);
    REQUIRE(same_bytes(back, x));
}
