// What a hostile checkpoint can cost (interop/parameters.hpp, zip.hpp): memory bounded by the
// destination plus a constant, whatever sizes the file claims. A 1.5 MB .npz whose member
// inflates to 1 GiB (made here, never committed), a .safetensors header and an .npy header
// that claim far more than their files hold: each is a clear error, and the peak resident
// memory grows by less than 64 MiB meanwhile. And the streaming inflate itself: codes of every
// length, stored blocks across its window, matches that reach 32 KiB back, a member read in
// odd pieces, skipped, or sliced, against the bytes it should give.
#include "support.hpp"

#include <dimsum/interop/parameters.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace ds = dimsum;
namespace fs = std::filesystem;
namespace zip = ds::detail::zip;
using test::temp_dir;

namespace {

// A deflate stream (RFC 1951) written by hand, least significant bit first: the streams
// these tests need, which zlib would not write.
class deflate_writer {
public:
    // value's n low bits, as the stream's next bits
    void bits(std::uint32_t value, int n) {
        for (int i = 0; i < n; ++i) bit(value >> i & 1);
    }
    // a Huffman code: most significant bit first
    void code(std::uint32_t value, int length) {
        for (int i = length; i-- > 0;) bit(value >> i & 1);
    }

    // Stored blocks (65535 bytes at most each), the last marked final if `last`.
    void stored(std::string_view bytes, bool last) {
        do {
            const std::size_t n = std::min<std::size_t>(bytes.size(), 65535);
            bits(last && n == bytes.size(), 1);
            bits(0, 2);
            if (count_) bit_align();
            for (std::uint32_t v : {std::uint32_t(n), std::uint32_t(~n & 0xffff)}) {
                out_ += static_cast<char>(v & 0xff);
                out_ += static_cast<char>(v >> 8);
            }
            out_.append(bytes.substr(0, n));
            bytes.remove_prefix(n);
        } while (!bytes.empty());
    }

    // A dynamic block's header for these code lengths (literal/length, then distance): the
    // code-length code gives each length 0 to 15 four bits, and each length is written alone.
    void dynamic_header(const std::vector<int>& literal_lengths, const std::vector<int>& distance_lengths, bool last) {
        bits(last, 1);
        bits(2, 2);
        bits(static_cast<std::uint32_t>(literal_lengths.size() - 257), 5);
        bits(static_cast<std::uint32_t>(distance_lengths.size() - 1), 5);
        bits(19 - 4, 4);
        static constexpr int order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
        for (int symbol : order) bits(symbol < 16 ? 4 : 0, 3);
        for (const auto* lengths : {&literal_lengths, &distance_lengths}) {
            for (int length : *lengths) code(static_cast<std::uint32_t>(length), 4);  // symbols 0-15: code = symbol
        }
    }

    std::string finish() {
        if (count_) bit_align();
        return std::move(out_);
    }

private:
    void bit(unsigned b) {
        pending_ |= (b & 1) << count_;
        if (++count_ == 8) bit_align();
    }
    void bit_align() {
        out_ += static_cast<char>(pending_);
        pending_ = 0;
        count_ = 0;
    }

    std::string out_;
    unsigned pending_ = 0;
    int count_ = 0;
};

// The canonical codes (RFC 1951, 3.2.2) of a set of code lengths.
std::vector<std::uint32_t> canonical_codes(const std::vector<int>& lengths) {
    std::vector<std::uint32_t> count(16), next(16), codes(lengths.size());
    for (int l : lengths) ++count[static_cast<std::size_t>(l)];
    count[0] = 0;
    for (std::size_t l = 1; l < 16; ++l) next[l] = (next[l - 1] + count[l - 1]) << 1;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
        if (lengths[s]) codes[s] = next[static_cast<std::size_t>(lengths[s])]++;
    }
    return codes;
}

void put(std::string& s, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) s += static_cast<char>(value >> (8 * i) & 0xff);
}

// A ZIP archive of one member, its directory saying what it is told to (sizes under 4 GiB).
std::string zip_of(const std::string& name, bool deflated, const std::string& data, std::uint64_t size, std::uint32_t crc) {
    auto fields = [&](std::uint32_t signature, bool central) {
        std::string s;
        put(s, signature, 4);
        if (central) put(s, 20, 2);
        put(s, 20, 2);
        put(s, 0, 2);
        put(s, deflated ? 8 : 0, 2);
        put(s, 0, 4);  // time and date
        put(s, crc, 4);
        put(s, data.size(), 4);
        put(s, size, 4);
        put(s, name.size(), 2);
        put(s, 0, 2);
        if (central) {
            put(s, 0, 6);  // comment length, disk, internal attributes
            put(s, 0, 4);  // external attributes
            put(s, 0, 4);  // offset of the local header
        }
        return s + name;
    };
    std::string file = fields(0x04034b50, false) + data;
    const std::string directory = fields(0x02014b50, true);
    const std::uint64_t directory_offset = file.size();
    file += directory;
    put(file, 0x06054b50, 4);
    put(file, 0, 4);
    put(file, 1, 2);
    put(file, 1, 2);
    put(file, directory.size(), 4);
    put(file, directory_offset, 4);
    put(file, 0, 2);
    return file;
}

// A member of `content`, deflated in fixed blocks of literals only (each byte 8 or 9 bits).
std::string deflated_literals(std::string_view content) {
    std::vector<int> lengths(288);
    for (std::size_t s = 0; s < 288; ++s) lengths[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8;
    const std::vector<std::uint32_t> codes = canonical_codes(lengths);
    deflate_writer w;
    w.bits(1, 1);
    w.bits(1, 2);
    for (unsigned char c : content) w.code(codes[c], lengths[c]);
    w.code(codes[256], lengths[256]);
    return w.finish();
}

std::string npz_of(const std::string& name, bool deflated, const std::string& content) {
    return zip_of(name, deflated, deflated ? deflated_literals(content) : content, content.size(),
                  zip::crc32(0, content.data(), content.size()));
}

// The .npy header of a float32 array of this shape: what numpy.save writes.
std::string npy_head(const std::vector<std::size_t>& shape) { return ds::detail::npy::file_head("<f4", shape); }

// A value from /proc/self/status, in bytes ("VmHWM:   1234 kB").
std::uint64_t status_bytes(const std::string& key) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.starts_with(key + ":")) return std::stoull(line.substr(key.size() + 1)) * 1024;
    }
    FAIL("no " << key << " in /proc/self/status");
    return 0;
}

// How much the peak resident memory grows while f runs, which must throw a file_error
// (returned). Linux resets the peak (VmHWM) when "5" is written to /proc/self/clear_refs;
// where it cannot be, f runs in a child process whose peak wait4 gives (its start: this
// process's resident memory, shared at the fork).
template <class F>
std::pair<std::uint64_t, std::string> peak_growth_and_error(F&& f) {
    auto error_of = [&] {
        try {
            f();
        } catch (const ds::file_error& e) {
            return std::string(e.what());
        }
        return std::string("no file_error");
    };
    const std::uint64_t before = status_bytes("VmRSS");
    if (std::ofstream("/proc/self/clear_refs") << "5") {
        const std::string error = error_of();
        return {status_bytes("VmHWM") - before, error};
    }
    int pipe_ends[2];
    REQUIRE(pipe(pipe_ends) == 0);
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {  // says the error, or exits 1 on any other outcome (a failed REQUIRE in f)
        try {
            const std::string error = error_of();
            (void)!write(pipe_ends[1], error.data(), error.size());
        } catch (...) {
            _exit(1);
        }
        _exit(0);
    }
    close(pipe_ends[1]);
    std::string error;
    char buffer[4096];
    for (ssize_t n; (n = read(pipe_ends[0], buffer, sizeof buffer)) > 0;) error.append(buffer, static_cast<std::size_t>(n));
    close(pipe_ends[0]);
    int status = 0;
    rusage usage{};
    REQUIRE(wait4(child, &status, 0, &usage) == child);
    REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    const auto peak = static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
    return {peak > before ? peak - before : 0, error};
}

constexpr std::uint64_t mib = 1 << 20, gib = 1 << 30;

// The bomb: `w.npy`, a (16, 16) float32 header then 1 GiB of zeros, deflated the way zlib
// would (a literal zero, then matches of 258 bytes one back, three bits each): 1.5 MB.
// Its directory says `size`.
std::string bomb(std::uint64_t size, std::uint32_t crc) {
    const std::string head = npy_head({16, 16});
    REQUIRE(head.size() == 128);
    deflate_writer w;
    w.stored(head, false);
    // literal 0: 1 bit; length 258 (285): 2; length 3 (257) and the end (256): 3; distance 1: 1
    std::vector<int> literal_lengths(286);
    literal_lengths[0] = 1;
    literal_lengths[285] = 2;
    literal_lengths[257] = literal_lengths[256] = 3;
    const std::vector<int> distance_lengths{1};
    const auto codes = canonical_codes(literal_lengths);
    w.dynamic_header(literal_lengths, distance_lengths, true);
    w.code(codes[0], 1);
    std::uint64_t zeros = 1;
    for (; gib - zeros >= 258; zeros += 258) {
        w.code(codes[285], 2);
        w.code(0, 1);
    }
    REQUIRE(gib - zeros == 3);
    w.code(codes[257], 3);
    w.code(0, 1);
    w.code(codes[256], 3);
    return zip_of("w.npy", true, w.finish(), size, crc);
}

// zlib.crc32 of the bomb's member: its header, then 1 GiB of zeros (computed with Python).
constexpr std::uint32_t bomb_crc = 0x4cefc02f;

}  // namespace

TEST_CASE("a 1.5 MB .npz member that inflates to 1 GiB: its header is checked before its data inflates") {
    temp_dir tmp;
    const std::string path = tmp.write("bomb.npz", bomb(gib + 128, bomb_crc));
    REQUIRE(fs::file_size(path) < 2 * mib);
    using A = ds::axis<"a">;
    using B = ds::axis<"b">;
    const auto [growth, error] = peak_growth_and_error([&] {
        ds::checkpoint in(path);
        const auto info = in.find("w");
        REQUIRE(info->shape == std::vector<std::size_t>{16, 16});
        ds::tensor<float, A, B> t;
        in.read("w", t);
    });
    REQUIRE(error == "dimsum: load: " + path +
                         ", member 'w.npy': 1073740800 bytes follow the data (the header's shape (16, 16) of '<f4' "
                         "(float32) needs 1024 bytes of data): more than one array in the file?");
    REQUIRE(growth < 64 * mib);

    // a slice sees the same
    ds::checkpoint in(path);
    ds::tensor<float, A, B> part;
    REQUIRE(test::error_of([&] { in.read_slice<A>("w", 0, 1, part); }) == error);
}

TEST_CASE("a member whose deflate stream runs past the directory's size stops there") {
    temp_dir tmp;
    // the directory says what the header promises, 128 + 1024 bytes; the stream gives 1 GiB more
    const std::string path = tmp.write("bomb.npz", bomb(128 + 1024, bomb_crc));
    const auto [growth, error] = peak_growth_and_error([&] {
        ds::checkpoint in(path);
        ds::tensor<float, ds::axis<"a", 16>, ds::axis<"b", 16>> t;
        in.read("w", t);
    });
    REQUIRE(error == "dimsum: load: " + path +
                         ", member 'w.npy': corrupt deflate data: it decompresses to more than the 1152 bytes the "
                         "directory says");
    REQUIRE(growth < 64 * mib);
}

TEST_CASE("a .safetensors or .npy header that claims far more than its file holds costs nothing") {
    temp_dir tmp;
    using A = ds::axis<"a">;
    using B = ds::axis<"b">;
    const std::string data(1024, '\0');

    // 64 Ki x 64 Ki float32: 16 GiB claimed, 1 KiB held
    std::string json = R"({"w":{"dtype":"F32","shape":[65536,65536],"data_offsets":[0,17179869184]}})";
    std::string safetensors;
    put(safetensors, json.size(), 8);
    const std::string lying = tmp.write("w.safetensors", safetensors + json + data);
    auto [growth, error] = peak_growth_and_error([&] { ds::checkpoint in(lying); });
    REQUIRE(error == "dimsum: load: " + lying +
                         ": the header lies: the tensors take 17179869184 bytes of data, the file holds 1024 (truncated?)");
    REQUIRE(growth < 64 * mib);

    // a header length of 99 MB in a 1 KiB file
    std::string long_header;
    put(long_header, 99'000'000, 8);
    const std::string cut = tmp.write("cut.safetensors", long_header + data);
    std::tie(growth, error) = peak_growth_and_error([&] { ds::checkpoint in(cut); });
    REQUIRE(error == "dimsum: load: " + cut + ": truncated: the header should end at byte 99000008 but the file has 1032");
    REQUIRE(growth < 64 * mib);

    // an .npy header of the same shape, in a folder and in a stored and a deflated .npz member
    fs::create_directory(tmp.path("folder"));
    const std::string npy = npy_head({65536, 65536}) + data;
    tmp.write("folder/w.npy", npy);
    const std::string stored = tmp.write("stored.npz", npz_of("w.npy", false, npy));
    const std::string deflated = tmp.write("deflated.npz", npz_of("w.npy", true, npy));
    const std::string truncated = ": truncated: the header's shape (65536, 65536) of '<f4' (float32) needs 17179869184 bytes "
                                  "of data, the file holds 1024";
    const std::pair<std::string, std::string> files[] = {{tmp.path("folder"), tmp.path("folder") + "/w.npy"},
                                                         {stored, stored + ", member 'w.npy'"},
                                                         {deflated, deflated + ", member 'w.npy'"}};
    for (const auto& [path, where] : files) {
        INFO(where);
        std::tie(growth, error) = peak_growth_and_error([&] {
            ds::checkpoint in(path);
            ds::tensor<float, A, B> t;
            in.read("w", t);
        });
        REQUIRE(error == "dimsum: load: " + where + truncated);
        REQUIRE(growth < 64 * mib);
        std::tie(growth, error) = peak_growth_and_error([&] {
            ds::checkpoint in(path);
            ds::tensor<float, A, B> t;
            in.read_slice<B>("w", 0, 16384, t);  // 4 GiB of it
        });
        REQUIRE(error == "dimsum: load: " + where + truncated);
        REQUIRE(growth < 64 * mib);
    }
}

namespace {

// A deflate stream that uses what a decoder can get wrong, and the bytes it decodes to:
// stored blocks longer than the decoder's window; a dynamic block whose codes take every
// length from 1 to 15 bits (the longest past the decoder's table), with matches of short
// distances, overlapping their own output, and of the farthest (32 KiB back); a fixed block
// of long matches across the window's ends.
std::pair<std::string, std::string> awkward_stream() {
    std::mt19937 random(46);
    std::string want;
    deflate_writer w;

    std::string noise(200'000, '\0');
    for (char& c : noise) c = static_cast<char>(random());
    w.stored(noise, false);
    want += noise;

    // literals 0-12: 1 to 13 bits; length 3 (257): 14; literal 13 and the end: 15
    std::vector<int> literal_lengths(286);
    for (int s = 0; s <= 12; ++s) literal_lengths[static_cast<std::size_t>(s)] = s + 1;
    literal_lengths[257] = 14;
    literal_lengths[13] = literal_lengths[256] = 15;
    // distance 1 (symbol 0): 1 bit; 5-6 (4): 2; 24577-32768 (29): 2
    std::vector<int> distance_lengths(30);
    distance_lengths[0] = 1;
    distance_lengths[4] = distance_lengths[29] = 2;
    const auto literal_codes = canonical_codes(literal_lengths), distance_codes = canonical_codes(distance_lengths);
    auto literal = [&](unsigned s) {
        w.code(literal_codes[s], literal_lengths[s]);
        want += static_cast<char>(s);
    };
    auto match3 = [&](unsigned distance_symbol, std::uint32_t extra, int extra_bits, std::size_t distance) {
        w.code(literal_codes[257], literal_lengths[257]);
        w.code(distance_codes[distance_symbol], distance_lengths[distance_symbol]);
        w.bits(extra, extra_bits);
        for (int i = 0; i < 3; ++i) want += want[want.size() - distance];
    };
    w.dynamic_header(literal_lengths, distance_lengths, false);
    for (int i = 0; i < 150'000; ++i) {
        const unsigned r = random() % 100;
        if (r < 70) {
            literal(std::min(13u, static_cast<unsigned>(std::countr_zero(random() | 1u << 13))));  // 0 half the time, ...
        } else if (r < 80) {
            match3(0, 0, 0, 1);
        } else if (r < 90) {
            const std::uint32_t extra = random() & 1;
            match3(4, extra, 1, 5 + extra);
        } else {
            const std::uint32_t extra = random() & 8191;
            match3(29, extra, 13, 24577 + extra);
        }
    }
    literal(13);
    w.code(literal_codes[256], literal_lengths[256]);

    // fixed: literal 'x', then 2000 matches of 258 at distance 1, then 'y' and the end
    w.bits(1, 1);
    w.bits(1, 2);
    w.code(0x30 + 'x', 8);
    want += 'x';
    for (int i = 0; i < 2000; ++i) {
        w.code(0xc0 + (285 - 280), 8);
        w.code(0, 5);
        want.append(258, 'x');
    }
    w.code(0x30 + 'y', 8);
    want += 'y';
    w.code(0, 7);
    return {w.finish(), want};
}

}  // namespace

TEST_CASE("a deflate stream decodes a piece at a time to the bytes it holds, read in any pieces") {
    temp_dir tmp;
    const auto [stream, want] = awkward_stream();
    REQUIRE(want.size() > 8 * (zip::inflater::history + zip::inflater::piece));
    const std::uint32_t crc = zip::crc32(0, want.data(), want.size());
    const std::string path = tmp.write("a.zip", zip_of("a", true, stream, want.size(), crc));
    zip::reader archive(path, "load");

    SECTION("in pieces of odd sizes, then checked") {
        zip::member_stream in(archive, archive.members()[0]);
        std::string got(want.size(), '\0');
        std::size_t at = 0;
        for (std::size_t n : {1, 7, 4093, 65536 + 3, 32768, 1, 200'000}) {
            in.read(got.data() + at, n);
            at += n;
        }
        in.read(got.data() + at, got.size() - at);
        in.finish();
        REQUIRE(got == want);
        REQUIRE(in.compressed_read() == stream.size());
    }
    SECTION("skipping") {
        zip::member_stream in(archive, archive.members()[0]);
        std::string got(100'000, '\0');
        in.skip(190'000);
        in.read(got.data(), got.size());
        REQUIRE(got == want.substr(190'000, got.size()));
        in.skip(want.size() - in.position());
        in.finish();
    }
    SECTION("every error the stream's size can make") {
        // cut short
        const std::string cut = tmp.write("cut.zip", zip_of("a", true, stream.substr(0, stream.size() / 2), want.size(), crc));
        zip::reader short_archive(cut, "load");
        zip::member_stream in(short_archive, short_archive.members()[0]);
        REQUIRE(test::error_of([&] { in.finish(); }) ==
                "dimsum: load: " + cut + ", member 'a': corrupt deflate data: the stream ends early");
        // the directory says less, or more
        for (std::uint64_t size : {want.size() - 1, want.size() + 1}) {
            const std::string lie = tmp.write("lie.zip", zip_of("a", true, stream, size, crc));
            zip::reader lying(lie, "load");
            zip::member_stream s(lying, lying.members()[0]);
            REQUIRE(test::error_of([&] { s.finish(); }) ==
                    "dimsum: load: " + lie + ", member 'a': corrupt deflate data: it decompresses to " +
                        (size < want.size() ? "more than the " + std::to_string(size) + " bytes the directory says"
                                            : std::to_string(want.size()) + " bytes, the directory says " +
                                                  std::to_string(size)));
        }
        // another CRC
        const std::string other = tmp.write("crc.zip", zip_of("a", true, stream, want.size(), crc ^ 1));
        zip::reader other_crc(other, "load");
        zip::member_stream s(other_crc, other_crc.members()[0]);
        REQUIRE(test::error_of([&] { s.finish(); }) ==
                "dimsum: load: " + other + ", member 'a': its CRC-32 does not match its data (a corrupt archive)");
    }
}

TEST_CASE("a slice of a deflated member is the stored one's, inflated no further than its end") {
    temp_dir tmp;
    using Rows = ds::axis<"rows", 512>;
    using Columns = ds::axis<"columns", 256>;
    using Part = ds::axis<"part">;
    ds::tensor<float, Rows, Columns> w;  // (rows=512, columns=256)
    ds::fill_uniform(w, 46);
    const std::string npy = npy_head({512, 256}) + std::string(reinterpret_cast<const char*>(w.data()), w.size() * 4);
    const std::string deflated_member = deflated_literals(npy);
    const std::string stored = tmp.write("stored.npz", npz_of("w.npy", false, npy));
    const std::string deflated = tmp.write("deflated.npz", npz_of("w.npy", true, npy));
    ds::checkpoint packed(deflated), plain(stored);

    ds::tensor<float, Part, Columns> rows, plain_rows;  // rows [0, 64): an eighth of the member
    packed.read_slice<Part>("w", 0, 64, rows);
    plain.read_slice<Part>("w", 0, 64, plain_rows);
    test::require_same_bits(rows, plain_rows);
    REQUIRE(packed.bytes_read() < deflated_member.size() / 4);

    ds::tensor<float, Rows, Part> columns, plain_columns;  // columns [100, 110): a run from each row
    packed.read_slice<Part>("w", 100, 10, columns);
    plain.read_slice<Part>("w", 100, 10, plain_columns);
    test::require_same_bits(columns, plain_columns);

    packed.read_slice<Part>("w", 3, 5, rows);  // back to the start: the member opened again
    plain.read_slice<Part>("w", 3, 5, plain_rows);
    test::require_same_bits(rows, plain_rows);

    ds::tensor<float, Rows, Columns> whole;
    packed.read("w", whole);
    test::require_same_bits(whole, w);
    packed.read("w", whole);  // read twice
    test::require_same_bits(whole, w);
}
