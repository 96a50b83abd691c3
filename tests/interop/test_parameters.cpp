// Parameter structs (interop/parameters.hpp): the same weights from a folder of .npy files,
// NumPy's .npz (stored and deflated) and a .safetensors file written by hand to the published
// layout (tests/reference/generate_parameters.py); round trips in each format; and one clear
// error for each mismatch or broken file, with the layer left as it was; and ds::checkpoint,
// which reads an array whole or a slice of it, reading only the slice's bytes.
#include "support.hpp"

#include <dimsum/interop/parameters.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

namespace ds = dimsum;
namespace fs = std::filesystem;
using test::temp_dir;

using Model = ds::axis<"model", 8>;
using Heads = ds::axis<"heads", 2>;
using Head = ds::axis<"head", 4>;
using Hidden = ds::axis<"hidden">;  // a run-time extent: the file's

struct feed_forward {
    BOOST_HANA_DEFINE_STRUCT(feed_forward,
        (ds::tensor<float, Model, Hidden>, w1),
        (std::optional<ds::tensor<float, Hidden>>, b1));
};

struct block {
    BOOST_HANA_DEFINE_STRUCT(block,
        (ds::nn::multi_head_attention<float, Model, Heads, Head>, attention),
        (feed_forward, ff),
        (ds::tensor<double, Model>, norm));
};

namespace {

const fs::path reference = fs::path(DIMSUM_TEST_DATA) / "parameters";

std::string bytes_of(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class T, class... A>
bool same_bits(const ds::tensor<T, A...>& a, const ds::tensor<T, A...>& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Every parameter of two blocks, bit for bit (NaN payloads and -0 included).
bool same_bits(const block& a, const block& b) {
    auto optional_same = [](const auto& x, const auto& y) { return bool(x) == bool(y) && (!x || same_bits(*x, *y)); };
    return optional_same(a.attention.w_qkv, b.attention.w_qkv) && optional_same(a.attention.b_qkv, b.attention.b_qkv) &&
           same_bits(a.attention.w_o, b.attention.w_o) && same_bits(a.ff.w1, b.ff.w1) &&
           optional_same(a.ff.b1, b.ff.b1) && same_bits(a.norm, b.norm) && !a.attention.w_q && !b.attention.w_q;
}

// The block as the reference folder's .npy files hold it, read with load_npy.
block expected_block() {
    auto file = [](const char* name) { return (reference / "block" / (std::string(name) + ".npy")).string(); };
    block b;
    b.attention.w_qkv = ds::load_npy<float, Model, ds::axis<"qkv", 24>>(file("attention.w_qkv"));
    b.attention.b_qkv = ds::load_npy<float, ds::axis<"qkv", 24>>(file("attention.b_qkv"));
    b.attention.w_o = ds::load_npy<float, ds::axis<"heads*head", 8>, Model>(file("attention.w_o"));
    b.ff.w1 = ds::load_npy<float, Model, Hidden>(file("ff.w1"));
    b.ff.b1 = ds::load_npy<float, Hidden>(file("ff.b1"));
    b.norm = ds::load_npy<double, Model>(file("norm"));
    return b;
}

// A block whose every value differs from the reference one: what a failed load must leave.
block other_block() {
    block b;
    b.attention.w_qkv.emplace();
    ds::fill_uniform(*b.attention.w_qkv, 7);
    ds::fill_uniform(b.attention.w_o, 8);
    b.ff.w1 = ds::tensor<float, Model, Hidden>(Model{}, Hidden{3});
    ds::fill_uniform(b.ff.w1, 9);
    ds::fill_uniform(b.norm, 10);
    return b;
}

std::string listed(const block& b) {
    std::ostringstream out;
    for (const auto& p : ds::parameters(b)) out << p << '\n';
    return out.str();
}

// The error a load throws, after checking that it left the layer as it was.
template <class Exception = ds::file_error>
std::string load_error(const fs::path& path, const ds::load_options& options = {}) {
    block layer = other_block();
    const block before = layer;
    std::string message;
    try {
        ds::load(layer, path, options);
    } catch (const Exception& e) {
        message = e.what();
    }
    REQUIRE(same_bits(layer, before));
    return message;
}

// A .safetensors file: the length, the JSON header as given, then the data.
std::string safetensors_file(const std::string& json, const std::string& data) {
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>((json.size() >> (8 * i)) & 0xff);
    return bytes + json + data;
}

}  // namespace

TEST_CASE("ds::parameters lists each parameter with its axes, extents, element type and count") {
    block b = expected_block();
    REQUIRE(listed(b) ==
            "attention.w_qkv  float32  (model=8, qkv=24)  192\n"
            "attention.b_qkv  float32  (qkv=24)  24\n"
            "attention.w_o  float32  (heads*head=8, model=8)  64\n"
            "ff.w1  float32  (model=8, hidden=5)  40\n"
            "ff.b1  float32  (hidden=5)  5\n"
            "norm  float64  (model=8)  8\n");
    b.ff.b1.reset();  // an empty optional parameter is not listed
    const auto list = ds::parameters(b, "encoder.");
    REQUIRE(list.size() == 5);
    REQUIRE(list[3].name == "encoder.ff.w1");
    REQUIRE(list[3].axes == std::vector<std::string>{"model", "hidden"});
    REQUIRE(list[3].extents == std::vector<std::size_t>{8, 5});
    REQUIRE(list[4].element_type == "float64");
    REQUIRE(list[4].count == 8);
}

TEST_CASE("the same weights load from .npy files, numpy.savez, numpy.savez_compressed and .safetensors") {
    const block want = expected_block();
    for (const char* file : {"block", "block.npz", "block_compressed.npz", "block.safetensors"}) {
        INFO(file);
        block got = other_block();
        ds::load(got, reference / file);
        REQUIRE(same_bits(got, want));
    }
}

TEST_CASE("save then load gives the same bits in every format, and saving twice the same bytes") {
    temp_dir tmp;
    block b = expected_block();
    b.norm(0) = std::numeric_limits<double>::quiet_NaN();
    b.norm(1) = -std::numeric_limits<double>::infinity();
    b.norm(2) = -0.0;
    b.ff.w1(0, 4) = std::numeric_limits<float>::denorm_min();
    b.attention.b_qkv.reset();  // absent parameters are not written, and load empty
    for (const char* name : {"folder", "w.npz", "w.safetensors"}) {
        INFO(name);
        const fs::path path = tmp.path(name);
        ds::save(b, path);
        block got = expected_block();  // its b_qkv is set: the file empties it
        ds::load(got, path);
        REQUIRE(same_bits(got, b));
        if (fs::is_regular_file(path)) {
            const std::string first = bytes_of(path);
            ds::save(got, path);  // over the earlier file
            REQUIRE(bytes_of(path) == first);
        }
    }
    REQUIRE_FALSE(fs::exists(tmp.path("w.npz.partial")));
}

TEST_CASE("a prefix names a layer inside a larger file") {
    temp_dir tmp;
    const block b = expected_block();
    ds::save(b, tmp.path("model.safetensors"), {.prefix = "encoder.layer.0."});
    block got = other_block();
    REQUIRE(load_error(tmp.path("model.safetensors")) ==
            "dimsum: load: " + tmp.path("model.safetensors") + ": the file has no parameter 'attention.w_o'");
    ds::load(got, tmp.path("model.safetensors"), {.prefix = "encoder.layer.0."});
    REQUIRE(same_bits(got, b));

    // One part of a checkpoint: names outside the prefix are not its concern.
    ds::save(b, tmp.path("all.npz"));
    feed_forward ff;
    ds::load(ff, tmp.path("all.npz"), {.prefix = "ff."});
    REQUIRE(same_bits(ff.w1, b.ff.w1));
    REQUIRE(same_bits(*ff.b1, *b.ff.b1));
}

TEST_CASE("each mismatch is one error naming the file and the parameter, and the layer keeps its values") {
    temp_dir tmp;
    const fs::path folder = tmp.path("weights");
    auto fresh_folder = [&] {
        fs::remove_all(folder);
        fs::copy(reference / "block", folder);
        return folder.string();
    };
    SECTION("a parameter the file lacks") {
        fs::remove(fresh_folder() + "/ff.w1.npy");
        REQUIRE(load_error(folder) == "dimsum: load: " + folder.string() + ": the file has no parameter 'ff.w1'");
    }
    SECTION("a name in the file that is no parameter, unless allowed") {
        fs::copy_file(fresh_folder() + "/norm.npy", folder / "norm_old.npy");
        REQUIRE(load_error(folder) == "dimsum: load: " + folder.string() +
                                          ": 'norm_old' in the file is no parameter of the layer "
                                          "(load_options{.allow_unused = true} ignores such names)");
        block b;
        ds::load(b, folder, {.allow_unused = true});
        REQUIRE(same_bits(b, expected_block()));
    }
    SECTION("another element type") {
        ds::tensor<float, Model> single;
        ds::save_npy(fresh_folder() + "/norm.npy", single);
        REQUIRE(load_error(folder) == "dimsum: load: " + folder.string() +
                                          ", parameter 'norm': the file holds float32 values, the tensor float64");
    }
    SECTION("another shape: both shapes named") {
        ds::tensor<float, ds::dim<6>, ds::dim<8>> narrow;
        ds::save_npy(fresh_folder() + "/attention.w_o.npy", narrow);
        REQUIRE(load_error<ds::shape_error>(folder) ==
                "dimsum: load: " + folder.string() +
                    ", parameter 'attention.w_o': axis heads*head is 8 in the tensor but 6 in the file "
                    "(the file's shape (6, 8), the tensor's (heads*head=8, model=8))");
    }
    SECTION("a malformed .npy in the folder") {
        fresh_folder();
        tmp.write("weights/ff.b1.npy", bytes_of(folder / "ff.b1.npy").substr(0, 100));
        REQUIRE(load_error(folder).find("ff.b1.npy: truncated") != std::string::npos);
    }
    SECTION("a path that is no checkpoint") {
        REQUIRE(load_error(tmp.path("none")) == "dimsum: load: " + tmp.path("none") + ": no such file or folder");
        tmp.write("notes.txt", "hello");
        REQUIRE(load_error(tmp.path("notes.txt")) ==
                "dimsum: load: " + tmp.path("notes.txt") +
                    ": neither a folder of .npy files nor a file named .npz or .safetensors");
    }
    SECTION("bfloat16 in a .safetensors file") {
        tmp.write("bf16.safetensors",
                  safetensors_file(R"({"norm":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]}})", std::string(16, '\0')));
        REQUIRE(load_error(tmp.path("bf16.safetensors")) ==
                "dimsum: load: " + tmp.path("bf16.safetensors") +
                    ": the file has no parameter 'attention.w_o'");
        struct norm_only {
            BOOST_HANA_DEFINE_STRUCT(norm_only, (ds::tensor<float, Model>, norm));
        } n;
        REQUIRE(test::error_of([&] { ds::load(n, tmp.path("bf16.safetensors")); }) ==
                "dimsum: load: " + tmp.path("bf16.safetensors") +
                    ", parameter 'norm': the file holds bfloat16 values, the tensor float32");
    }
}

TEST_CASE("a broken .npz is a file_error, never a crash, and the layer keeps its values") {
    temp_dir tmp;
    for (const char* name : {"block.npz", "block_compressed.npz"}) {
        INFO(name);
        const std::string good = bytes_of(reference / name);
        // cut anywhere: every length short of the whole is an error
        for (std::size_t length = 0; length < good.size(); length += 13) {
            INFO("cut to " << length << " bytes");
            REQUIRE_FALSE(load_error(tmp.write("cut.npz", good.substr(0, length))).empty());
        }
        // any byte of the members changed: the CRC, the deflate stream or a header says so
        for (std::size_t at = 0; at < good.size() / 2; at += 7) {
            std::string bad = good;
            bad[at] = static_cast<char>(bad[at] ^ 0x5a);
            INFO("byte " << at << " changed");
            block b = other_block();
            try {
                ds::load(b, tmp.write("bad.npz", bad));
                // a changed byte that no check sees can only be one the format does not use
                // (a time stamp, an attribute): the values must then be right
                REQUIRE(same_bits(b, expected_block()));
            } catch (const ds::file_error&) {
            } catch (const ds::shape_error&) {
            }
        }
    }
    const std::string stored = bytes_of(reference / "block.npz");
    std::string flipped = stored;
    flipped[stored.find("attention.w_qkv.npy") + 19 + 150] ^= 1;  // inside the first member's data
    REQUIRE(load_error(tmp.write("crc.npz", flipped)) ==
            "dimsum: load: " + tmp.path("crc.npz") +
                ", member 'attention.w_qkv.npy': its CRC-32 does not match its data (a corrupt archive)");
    REQUIRE(load_error(tmp.write("short.npz", stored.substr(0, 10))) ==
            "dimsum: load: " + tmp.path("short.npz") + ": not a ZIP archive (.npz): too short to hold its directory");
}

TEST_CASE("a .safetensors header that lies is a file_error naming what") {
    temp_dir tmp;
    auto error = [&](const std::string& json, const std::string& data) {
        const std::string path = tmp.write("w.safetensors", safetensors_file(json, data));
        return load_error(path).substr(std::string("dimsum: load: ").size() + path.size() + 2);
    };
    const std::string eight(32, '\0');
    const std::string norm = R"("norm":{"dtype":"F64","shape":[4],"data_offsets":[0,32]})";
    REQUIRE(error("{" + norm + "}", eight.substr(0, 31)) ==
            "the header lies: the tensors take 32 bytes of data, the file holds 31 (truncated?)");
    REQUIRE(error("{" + norm + "}", eight + "x") == "the header lies: the tensors take 32 bytes of data, the file holds 33");
    REQUIRE(error(R"({"norm":{"dtype":"F64","shape":[4],"data_offsets":[0,24]}})", eight.substr(0, 24)) ==
            "the header lies: 'norm' takes bytes [0, 24) but its shape and dtype need 32");
    REQUIRE(error("{" + norm + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})", eight) ==
            "the header lies: 'b' overlaps another tensor");
    REQUIRE(error(R"({"norm":{"dtype":"F64","shape":[4],"data_offsets":[8,40]}})", eight + std::string(8, '\0')) ==
            "the header lies: a gap of unused bytes before 'norm'");
    REQUIRE(error(R"({"norm":{"dtype":"Q7","shape":[4],"data_offsets":[0,32]}})", eight) ==
            "'norm' has the unknown dtype 'Q7'");
    REQUIRE(error(R"({"norm":{"dtype":"F64","shape":[99999999999999999999],"data_offsets":[0,32]}})", eight) ==
            "malformed .safetensors header: an integer too large at byte 51");
    REQUIRE(error(R"({"norm":{"dtype":"F64","shape":[4]}})", "") ==
            "malformed .safetensors header: 'norm' lacks data_offsets");
    REQUIRE(error("{" + norm + "," + norm + "}", eight) == "malformed .safetensors header: the name 'norm' appears twice");
    REQUIRE(error("{" + norm, eight) == "malformed .safetensors header: expected '}' at byte 57 of the header");
    REQUIRE(error("[]", "") == "malformed .safetensors header: expected '{' at byte 0 of the header");
    REQUIRE(error(R"({"a\q":1})", "") == "malformed .safetensors header: an unknown escape '\\q' in a string");
    REQUIRE(error(R"({"__metadata__":)" + std::string(100, '[') + std::string(100, ']') + "}", "") ==
            "malformed .safetensors header: values nested more than 64 deep");

    std::string huge(8, '\xff');
    REQUIRE(load_error(tmp.write("huge.safetensors", huge)).ends_with(
        ": not a .safetensors file: its header length 18446744073709551615 is more than the format's 100 MB"));
    REQUIRE(load_error(tmp.write("tiny.safetensors", "abc")).ends_with(
        ": truncated: less than the 8 bytes of a .safetensors header length"));
}

TEST_CASE("a save that cannot write leaves no partial file and says why") {
    temp_dir tmp;
    const block b = expected_block();
    const std::string target = tmp.path("missing_folder/w.npz");
    REQUIRE(test::error_of([&] { ds::save(b, target); }) ==
            "dimsum: save: " + target + ": cannot open a file for writing in its folder");
    REQUIRE_FALSE(fs::exists(target + ".partial"));
}

TEST_CASE("a checkpoint reads a slice along any axis from every format, and only its bytes where stored") {
    const block want = expected_block();
    using Local = ds::axis<"local">;
    for (const char* file : {"block", "block.npz", "block_compressed.npz", "block.safetensors"}) {
        INFO(file);
        ds::checkpoint in(reference / file);
        REQUIRE(in.contains("ff.w1"));
        REQUIRE_FALSE(in.contains("ff.w2"));
        const auto info = in.find("attention.w_qkv");
        REQUIRE(info->element_type == "float32");
        REQUIRE(info->shape == std::vector<std::size_t>{8, 24});

        ds::tensor<float, Model, Local> columns;  // columns [9, 13) of (8, 24): eight runs of four
        in.read_slice<Local>("attention.w_qkv", 9, 4, columns);
        REQUIRE(columns.extent(1) == 4);
        for (std::size_t i = 0; i < 8; ++i) {
            for (std::size_t j = 0; j < 4; ++j) REQUIRE(columns(i, j) == (*want.attention.w_qkv)(i, 9 + j));
        }
        const bool compressed = std::string(file) == "block_compressed.npz";
        const std::uint64_t after_columns = in.bytes_read();
        if (!compressed) REQUIRE(after_columns == 8 * 4 * sizeof(float));

        ds::tensor<float, Local, Model> rows;  // rows [2, 5) of w_o (8, 8): one run
        in.read_slice<Local>("attention.w_o", 2, 3, rows);
        for (std::size_t i = 0; i < 3; ++i) {
            for (std::size_t j = 0; j < 8; ++j) REQUIRE(rows(i, j) == want.attention.w_o(2 + i, j));
        }
        if (!compressed) REQUIRE(in.bytes_read() - after_columns == 3 * 8 * sizeof(float));

        ds::tensor<double, Local> all;  // a slice of the whole extent is the array
        in.read_slice<Local>("norm", 0, 8, all);
        ds::tensor<double, Model> whole;
        in.read("norm", whole);
        for (std::size_t i = 0; i < 8; ++i) REQUIRE((all(i) == whole(i) || (std::isnan(all(i)) && std::isnan(whole(i)))));
        REQUIRE(same_bits(whole, want.norm));

        ds::tensor<float, Model, Local> none;  // an empty slice is a tensor of extent 0
        in.read_slice<Local>("ff.w1", 5, 0, none);
        REQUIRE(none.size() == 0);
    }
}

TEST_CASE("a slice of the middle axis of a 3-D array is its runs, one per outer index") {
    temp_dir tmp;
    using A = ds::axis<"a", 3>;
    using B = ds::axis<"b", 7>;
    using C = ds::axis<"c", 5>;
    using Part = ds::axis<"part">;
    ds::tensor<float, A, B, C> cube;
    ds::fill_uniform(cube, 3);
    fs::create_directory(tmp.path("folder"));
    ds::save_npy(tmp.path("folder/cube.npy"), cube.view());
    ds::checkpoint in(tmp.path("folder"));
    ds::tensor<float, A, Part, C> part;
    in.read_slice<Part>("cube", 2, 4, part);
    REQUIRE(in.bytes_read() == 3 * 4 * 5 * sizeof(float));
    for (std::size_t a = 0; a < 3; ++a) {
        for (std::size_t b = 0; b < 4; ++b) {
            for (std::size_t c = 0; c < 5; ++c) REQUIRE(part(a, b, c) == cube(a, 2 + b, c));
        }
    }
}

TEST_CASE("a checkpoint's errors name the file and the parameter, and leave the target as it was") {
    ds::checkpoint in(reference / "block.safetensors");
    const std::string where = (reference / "block.safetensors").string() + ", parameter ";
    using Local = ds::axis<"local">;
    ds::tensor<float, Model, Local> t(Model{}, Local{2});
    ds::fill_uniform(t, 5);
    const ds::tensor<float, Model, Local> before = t;
    auto error = [&](auto&& f) {
        const std::string message = test::error_of(f);
        REQUIRE(same_bits(t, before));
        return message;
    };
    REQUIRE(error([&] { in.read_slice<Local>("ff.w2", 0, 1, t); }) ==
            "dimsum: load: " + (reference / "block.safetensors").string() + ": the file has no parameter 'ff.w2'");
    REQUIRE(error([&] { in.read_slice<Local>("ff.w1", 3, 3, t); }) ==
            "dimsum: load: " + where + "'ff.w1': positions [3, 6) of axis 1 lie outside its extent 5");
    REQUIRE(error([&] { in.read_slice<Local>("ff.w1", 6, 0, t); }) ==
            "dimsum: load: " + where + "'ff.w1': positions [6, 6) of axis 1 lie outside its extent 5");
    REQUIRE(error([&] { in.read_slice<Local>("norm", 0, 1, t); }) ==
            "dimsum: load: " + where + "'norm': the file holds float64 values, the tensor float32");
    REQUIRE(error([&] { in.read_slice<Local>("attention.b_qkv", 0, 1, t); }) ==
            "dimsum: load: " + where + "'attention.b_qkv': the file's array has 1 axes, the tensor 2 "
            "(the file's shape (24,), the tensor's (model=8, local=?))");
    ds::tensor<float, ds::axis<"model", 4>, Local> narrow(ds::axis<"model", 4>{}, Local{2});
    REQUIRE(test::error_of([&] { in.read_slice<Local>("ff.w1", 0, 1, narrow); }) ==
            "dimsum: load: " + where + "'ff.w1': axis model is 4 in the tensor but 8 in the file "
            "(the file's shape (8, 1), the tensor's (model=4, local=?))");
}
