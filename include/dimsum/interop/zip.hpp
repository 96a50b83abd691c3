#pragma once
// The part of the ZIP format that NumPy's .npz files use, read and written by hand so that
// dimsum needs no compression library: members stored (numpy.savez) or deflated
// (numpy.savez_compressed), ZIP64 sizes and offsets (NumPy asks for them on every member),
// one disk, no encryption. Everything read is checked against the file's size and the CRC-32
// of each member, so a truncated or corrupt archive is a file_error, never a read past the
// end. Written archives store their members uncompressed, as numpy.savez does.
//
// References: PKWARE's APPNOTE.TXT (the ZIP format) and RFC 1951 (deflate).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dimsum/core/file_error.hpp"

namespace dimsum::detail::zip {

// CRC-32 (ISO-HDLC, the one ZIP and zlib use), one table lookup per byte.
inline constexpr std::array<std::uint32_t, 256> crc_table = [] {
    std::array<std::uint32_t, 256> table{};
    for (std::uint32_t n = 0; n < 256; ++n) {
        std::uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        table[n] = c;
    }
    return table;
}();

// Continues a CRC over more bytes: crc32(crc32(0, a), b) is the CRC of a then b.
inline std::uint32_t crc32(std::uint32_t crc, const void* data, std::size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    crc = ~crc;
    for (std::size_t i = 0; i < size; ++i) crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

// Decodes a raw deflate stream (RFC 1951) into `out`, which must end up exactly full: the
// archive's directory says how large the member is. Any malformed stream, and any that would
// write past `out` or end short of it, is a file_error; `where` names the member.
class inflater {
public:
    inflater(std::span<const unsigned char> in, std::span<unsigned char> out, std::string_view op,
             std::string_view where)
        : in_(in), out_(out), op_(op), where_(where) {}

    void run() {
        bool last = false;
        while (!last) {
            last = bits(1);
            switch (bits(2)) {
                case 0: stored_block(); break;
                case 1: fixed_block(); break;
                case 2: dynamic_block(); break;
                default: corrupt("a block of the reserved type 3");
            }
        }
        if (written_ != out_.size()) {
            corrupt("it decompresses to " + std::to_string(written_) + " bytes, the directory says " +
                    std::to_string(out_.size()));
        }
    }

private:
    // A canonical Huffman code: how many codes have each length, and the symbols ordered by code.
    struct code {
        std::array<std::uint16_t, 16> count{};
        std::array<std::uint16_t, 288> symbol{};
    };

    [[noreturn]] void corrupt(const std::string& what) const {
        throw_file_error(op_, where_, "corrupt deflate data: " + what);
    }

    unsigned bits(int n) {
        while (bit_count_ < n) {
            if (read_ == in_.size()) corrupt("the stream ends early");
            bit_buffer_ |= std::uint32_t(in_[read_++]) << bit_count_;
            bit_count_ += 8;
        }
        unsigned value = bit_buffer_ & ((1u << n) - 1);
        bit_buffer_ >>= n;
        bit_count_ -= n;
        return value;
    }

    void stored_block() {
        bit_buffer_ = 0;  // the rest of the current byte is padding
        bit_count_ = 0;
        if (in_.size() - read_ < 4) corrupt("the stream ends early");
        unsigned length = in_[read_] | in_[read_ + 1] << 8;
        unsigned complement = in_[read_ + 2] | in_[read_ + 3] << 8;
        read_ += 4;
        if (length != (~complement & 0xffff)) corrupt("a stored block's length fails its check");
        if (in_.size() - read_ < length) corrupt("the stream ends early");
        if (out_.size() - written_ < length) overflow();
        std::copy_n(in_.data() + read_, length, out_.data() + written_);
        read_ += length;
        written_ += length;
    }

    [[noreturn]] void overflow() const {
        corrupt("it decompresses to more than the " + std::to_string(out_.size()) + " bytes the directory says");
    }

    // Builds a code from the length of each symbol's code (0: unused). An over-subscribed set
    // of lengths is no code; an incomplete one is allowed (a stream may use one distance
    // code), and reading a code it lacks is an error in decode().
    void build(code& c, const std::uint8_t* lengths, std::size_t n) {
        c.count.fill(0);
        for (std::size_t s = 0; s < n; ++s) ++c.count[lengths[s]];
        int left = 1;
        for (int len = 1; len < 16; ++len) {
            left = 2 * left - c.count[len];
            if (left < 0) corrupt("a Huffman code is over-subscribed");
        }
        std::array<std::uint16_t, 16> offset{};
        for (int len = 1; len < 15; ++len) offset[len + 1] = offset[len] + c.count[len];
        for (std::size_t s = 0; s < n; ++s) {
            if (lengths[s]) c.symbol[offset[lengths[s]]++] = static_cast<std::uint16_t>(s);
        }
    }

    // One symbol, a bit at a time: codes are read most significant bit first.
    unsigned decode(const code& c) {
        int value = 0, first = 0, index = 0;
        for (int len = 1; len < 16; ++len) {
            value |= static_cast<int>(bits(1));
            int count = c.count[len];
            if (value - first < count) return c.symbol[index + value - first];
            index += count;
            first = (first + count) << 1;
            value <<= 1;
        }
        corrupt("a code that the block's Huffman table does not have");
    }

    void symbols(const code& literals, const code& distances) {
        static constexpr std::array<std::uint16_t, 29> length_base{3,  4,  5,  6,  7,  8,  9,  10,  11,  13,
                                                                   15, 17, 19, 23, 27, 31, 35, 43,  51,  59,
                                                                   67, 83, 99, 115, 131, 163, 195, 227, 258};
        static constexpr std::array<std::uint8_t, 29> length_extra{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                                                   2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
        static constexpr std::array<std::uint16_t, 30> distance_base{
            1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
            193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
        static constexpr std::array<std::uint8_t, 30> distance_extra{0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                                                     6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
        for (;;) {
            unsigned symbol = decode(literals);
            if (symbol < 256) {
                if (written_ == out_.size()) overflow();
                out_[written_++] = static_cast<unsigned char>(symbol);
                continue;
            }
            if (symbol == 256) return;
            symbol -= 257;
            if (symbol >= length_base.size()) corrupt("a length symbol out of range");
            std::size_t length = length_base[symbol] + bits(length_extra[symbol]);
            unsigned d = decode(distances);
            if (d >= distance_base.size()) corrupt("a distance symbol out of range");
            std::size_t distance = distance_base[d] + bits(distance_extra[d]);
            if (distance > written_) corrupt("a distance reaches back before the start of the data");
            if (out_.size() - written_ < length) overflow();
            for (std::size_t i = 0; i < length; ++i, ++written_) out_[written_] = out_[written_ - distance];
        }
    }

    void fixed_block() {
        std::array<std::uint8_t, 288 + 30> lengths{};
        std::fill_n(lengths.begin(), 144, 8);
        std::fill_n(lengths.begin() + 144, 112, 9);
        std::fill_n(lengths.begin() + 256, 24, 7);
        std::fill_n(lengths.begin() + 280, 8, 8);
        std::fill_n(lengths.begin() + 288, 30, 5);
        code literals, distances;
        build(literals, lengths.data(), 288);
        build(distances, lengths.data() + 288, 30);
        symbols(literals, distances);
    }

    void dynamic_block() {
        static constexpr std::array<std::uint8_t, 19> order{16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
        const unsigned literal_count = bits(5) + 257, distance_count = bits(5) + 1, length_count = bits(4) + 4;
        if (literal_count > 286 || distance_count > 30) corrupt("a block declares too many codes");
        std::array<std::uint8_t, 19> length_lengths{};
        for (unsigned i = 0; i < length_count; ++i) length_lengths[order[i]] = static_cast<std::uint8_t>(bits(3));
        code lengths_code;
        build(lengths_code, length_lengths.data(), 19);

        std::array<std::uint8_t, 286 + 30> lengths{};
        for (unsigned i = 0; i < literal_count + distance_count;) {
            unsigned symbol = decode(lengths_code);
            if (symbol < 16) {
                lengths[i++] = static_cast<std::uint8_t>(symbol);
                continue;
            }
            std::uint8_t repeated = 0;
            unsigned times = 0;
            if (symbol == 16) {
                if (i == 0) corrupt("a repeated code length with none before it");
                repeated = lengths[i - 1];
                times = 3 + bits(2);
            } else if (symbol == 17) {
                times = 3 + bits(3);
            } else {
                times = 11 + bits(7);
            }
            if (i + times > literal_count + distance_count) corrupt("code lengths run past their count");
            std::fill_n(lengths.begin() + i, times, repeated);
            i += times;
        }
        if (lengths[256] == 0) corrupt("a block with no end-of-block code");
        code literals, distances;
        build(literals, lengths.data(), literal_count);
        build(distances, lengths.data() + literal_count, distance_count);
        symbols(literals, distances);
    }

    std::span<const unsigned char> in_;
    std::span<unsigned char> out_;
    std::string_view op_, where_;
    std::size_t read_ = 0, written_ = 0;
    std::uint32_t bit_buffer_ = 0;
    int bit_count_ = 0;
};

// Little-endian integers at a byte offset of a buffer the caller has checked is long enough.
inline std::uint64_t little_endian(const unsigned char* p, int bytes) {
    std::uint64_t v = 0;
    for (int i = bytes; i-- > 0;) v = v << 8 | p[i];
    return v;
}

enum class method : std::uint16_t { stored = 0, deflated = 8 };

// One member, as the central directory describes it.
struct member {
    std::string name;
    method how = method::stored;
    std::uint32_t crc = 0;
    std::uint64_t compressed_size = 0, size = 0, header_offset = 0;
};

// A ZIP archive open for reading: its central directory, checked, and its members' bytes on
// demand.
class reader {
public:
    reader(std::string path, std::string_view op) : path_(std::move(path)), op_(op) {
        in_.open(path_, std::ios::binary);
        if (!in_) fail("cannot open the file");
        in_.seekg(0, std::ios::end);
        file_size_ = static_cast<std::uint64_t>(in_.tellg());
        read_directory();
    }

    const std::vector<member>& members() const { return members_; }
    const std::string& path() const { return path_; }

    // Where a member's data starts: after its local header, which must agree with the directory.
    std::uint64_t data_offset(const member& m) {
        unsigned char local[30];
        if (m.header_offset > directory_offset_ || directory_offset_ - m.header_offset < 30) {
            fail_member(m, "its local header lies outside the archive");
        }
        read_at(m.header_offset, local, 30);
        if (little_endian(local, 4) != 0x04034b50) fail_member(m, "no local header where the directory says");
        std::uint64_t name_length = little_endian(local + 26, 2), extra_length = little_endian(local + 28, 2);
        std::uint64_t start = m.header_offset + 30 + name_length + extra_length;
        if (start > directory_offset_ || directory_offset_ - start < m.compressed_size) {
            fail_member(m, "its data runs into the central directory (a truncated or corrupt archive)");
        }
        std::string local_name(name_length, '\0');
        read_at(m.header_offset + 30, local_name.data(), name_length);
        if (local_name != m.name) fail_member(m, "the local header names another member");
        return start;
    }

    // Reads `size` bytes of a stored member's data, from byte `from` of it.
    void read_stored(const member& m, std::uint64_t data_start, std::uint64_t from, void* into, std::uint64_t size) {
        if (from > m.size || m.size - from < size) fail_member(m, "read past the member's end");
        read_at(data_start + from, into, size);
    }

    // A whole member, decompressed if need be, its CRC checked.
    std::vector<unsigned char> read(const member& m) {
        const std::uint64_t start = data_offset(m);
        std::vector<unsigned char> data;
        if (m.how == method::stored) {
            data.resize(m.size);
            read_at(start, data.data(), m.size);
        } else {
            // deflate expands at most 1032-fold: a larger size is a lie, not an allocation
            if (m.size / 1032 > m.compressed_size) fail_member(m, "its size is more than deflate can expand its data to");
            std::vector<unsigned char> packed(m.compressed_size);
            read_at(start, packed.data(), packed.size());
            data.resize(m.size);
            inflater(packed, data, op_, where(m)).run();
        }
        check_crc(m, crc32(0, data.data(), data.size()));
        return data;
    }

    void check_crc(const member& m, std::uint32_t crc) const {
        if (crc != m.crc) fail_member(m, "its CRC-32 does not match its data (a corrupt archive)");
    }

    std::string where(const member& m) const { return path_ + ", member '" + m.name + "'"; }

private:
    [[noreturn]] void fail(std::string_view what) const { throw_file_error(op_, path_, what); }
    [[noreturn]] void fail_member(const member& m, std::string_view what) const { throw_file_error(op_, where(m), what); }

    void read_at(std::uint64_t offset, void* into, std::uint64_t size) {
        if (offset > file_size_ || file_size_ - offset < size) fail("truncated: a read past the end of the file");
        in_.seekg(static_cast<std::streamoff>(offset));
        in_.read(static_cast<char*>(into), static_cast<std::streamsize>(size));
        if (static_cast<std::uint64_t>(in_.gcount()) != size) fail("read error (the file changed while being read?)");
    }

    // The end-of-central-directory record is the last thing in the file but for a comment of
    // up to 64 KiB: searched for from the end.
    void read_directory() {
        constexpr std::uint64_t record = 22, max_comment = 0xffff;
        if (file_size_ < record) fail("not a ZIP archive (.npz): too short to hold its directory");
        const std::uint64_t tail_size = std::min(file_size_, record + max_comment);
        std::vector<unsigned char> tail(tail_size);
        read_at(file_size_ - tail_size, tail.data(), tail_size);
        std::uint64_t at = tail_size - record + 1;
        do {
            if (at-- == 0) fail("not a ZIP archive (.npz): no end-of-central-directory record");
        } while (little_endian(&tail[at], 4) != 0x06054b50);
        const unsigned char* end = &tail[at];
        const std::uint64_t end_offset = file_size_ - tail_size + at;
        if (little_endian(end + 4, 2) != 0 || little_endian(end + 6, 2) != 0) fail("a multi-disk ZIP archive");
        std::uint64_t count = little_endian(end + 10, 2);
        std::uint64_t directory_size = little_endian(end + 12, 4);
        directory_offset_ = little_endian(end + 16, 4);
        if (count == 0xffff || directory_size == 0xffffffff || directory_offset_ == 0xffffffff) {
            // ZIP64: a locator just before the record points at the 64-bit record.
            if (end_offset < 20) fail("a ZIP64 archive without its locator");
            unsigned char locator[20], record64[56];
            read_at(end_offset - 20, locator, 20);
            if (little_endian(locator, 4) != 0x07064b50) fail("a ZIP64 archive without its locator");
            const std::uint64_t record64_offset = little_endian(locator + 8, 8);
            read_at(record64_offset, record64, 56);
            if (little_endian(record64, 4) != 0x06064b50) fail("the ZIP64 locator points at no ZIP64 record");
            count = little_endian(record64 + 32, 8);
            directory_size = little_endian(record64 + 40, 8);
            directory_offset_ = little_endian(record64 + 48, 8);
        }
        if (directory_offset_ > end_offset || end_offset - directory_offset_ < directory_size) {
            fail("truncated or corrupt: the central directory lies outside the file");
        }
        // Each entry takes at least 46 bytes: a count beyond that is a lie, not an allocation.
        if (count > directory_size / 46) fail("corrupt: the directory counts more members than it can hold");
        std::vector<unsigned char> directory(directory_size);
        read_at(directory_offset_, directory.data(), directory_size);
        std::uint64_t pos = 0;
        for (std::uint64_t i = 0; i < count; ++i) pos = read_entry(directory, pos);
    }

    std::uint64_t read_entry(const std::vector<unsigned char>& directory, std::uint64_t pos) {
        if (directory.size() - pos < 46 || little_endian(&directory[pos], 4) != 0x02014b50) {
            fail("corrupt: a central directory entry is missing or malformed");
        }
        const unsigned char* e = &directory[pos];
        const std::uint64_t name_length = little_endian(e + 28, 2), extra_length = little_endian(e + 30, 2),
                            comment_length = little_endian(e + 32, 2);
        if (directory.size() - pos - 46 < name_length + extra_length + comment_length) {
            fail("corrupt: a central directory entry runs past the directory");
        }
        member m;
        m.name.assign(reinterpret_cast<const char*>(e + 46), name_length);
        const auto flags = little_endian(e + 8, 2), how = little_endian(e + 10, 2);
        if (flags & 1) fail_member(m, "encrypted members are not supported");
        if (how != 0 && how != 8) {
            fail_member(m, "compression method " + std::to_string(how) +
                               "; .npz members are stored (0) or deflated (8)");
        }
        m.how = static_cast<method>(how);
        m.crc = static_cast<std::uint32_t>(little_endian(e + 16, 4));
        m.compressed_size = little_endian(e + 20, 4);
        m.size = little_endian(e + 24, 4);
        m.header_offset = little_endian(e + 42, 4);
        if (little_endian(e + 34, 2) != 0) fail_member(m, "it lies on another disk");
        // ZIP64 extra field: the 64-bit values of the fields that hold 0xffffffff, in order.
        const unsigned char* extra = e + 46 + name_length;
        for (std::uint64_t x = 0; x + 4 <= extra_length;) {
            const std::uint64_t id = little_endian(extra + x, 2), length = little_endian(extra + x + 2, 2);
            if (extra_length - x - 4 < length) fail_member(m, "a malformed extra field");
            if (id == 1) {
                std::uint64_t at = x + 4;
                for (std::uint64_t* field : {&m.size, &m.compressed_size, &m.header_offset}) {
                    if (*field != 0xffffffff) continue;
                    if (x + 4 + length - at < 8) fail_member(m, "a ZIP64 field too short for its sizes");
                    *field = little_endian(extra + at, 8);
                    at += 8;
                }
            }
            x += 4 + length;
        }
        if (m.how == method::stored && m.compressed_size != m.size) {
            fail_member(m, "a stored member whose two sizes differ");
        }
        members_.push_back(std::move(m));
        return pos + 46 + name_length + extra_length + comment_length;
    }

    std::string path_;
    std::string_view op_;
    std::ifstream in_;
    std::uint64_t file_size_ = 0, directory_offset_ = 0;
    std::vector<member> members_;
};

// Writes an archive of stored members, each given as pieces of bytes (a .npy header, then the
// data), to a sink (`sink.write(data, size)`, which checks its writes). Sizes and offsets must
// stay below 4 GiB (no ZIP64 on writing): beyond, a file_error.
template <class Sink>
class writer {
public:
    writer(Sink& sink, std::string path, std::string_view op) : sink_(sink), path_(std::move(path)), op_(op) {}

    void add(const std::string& name, std::span<const std::span<const unsigned char>> pieces) {
        std::uint64_t size = 0;
        std::uint32_t crc = 0;
        for (auto piece : pieces) {
            size += piece.size();
            crc = crc32(crc, piece.data(), piece.size());
        }
        if (size >= 0xffffffff || offset_ + 30 + name.size() + size >= 0xffffffff || entries_.size() == 0xffff) {
            throw_file_error(op_, path_, "more than 4 GiB or 65535 members: .npz files this large need ZIP64, "
                                         "which dimsum does not write; save as .safetensors");
        }
        entry e{name, crc, static_cast<std::uint32_t>(size), static_cast<std::uint32_t>(offset_)};
        std::string header = fixed_fields(0x04034b50, e, false) + name;
        write(header.data(), header.size());
        for (auto piece : pieces) write(piece.data(), piece.size());
        entries_.push_back(std::move(e));
    }

    void finish() {
        const std::uint64_t directory_offset = offset_;
        for (const entry& e : entries_) {
            std::string record = fixed_fields(0x02014b50, e, true) + e.name;
            write(record.data(), record.size());
        }
        const std::uint64_t directory_size = offset_ - directory_offset;
        if (offset_ >= 0xffffffff) throw_file_error(op_, path_, "the archive would pass 4 GiB; save as .safetensors");
        std::string end;
        put(end, 0x06054b50, 4);
        put(end, 0, 4);  // this disk, the directory's disk
        put(end, entries_.size(), 2);
        put(end, entries_.size(), 2);
        put(end, directory_size, 4);
        put(end, directory_offset, 4);
        put(end, 0, 2);  // no comment
        write(end.data(), end.size());
    }

private:
    struct entry {
        std::string name;
        std::uint32_t crc, size, offset;
    };

    static void put(std::string& s, std::uint64_t value, int bytes) {
        for (int i = 0; i < bytes; ++i) s += static_cast<char>((value >> (8 * i)) & 0xff);
    }

    // The fields a local header (30 bytes) and a central directory entry (46) share, in their order.
    static std::string fixed_fields(std::uint32_t signature, const entry& e, bool central) {
        std::string s;
        put(s, signature, 4);
        if (central) put(s, 20, 2);  // made by: MS-DOS attributes, version 2.0
        put(s, 20, 2);               // needed to extract: 2.0
        put(s, 0, 2);                // flags
        put(s, 0, 2);                // stored
        put(s, 0, 2);                // time: 00:00:00
        put(s, 0x21, 2);             // date: 1980-01-01, a fixed time so that saving twice gives the same bytes
        put(s, e.crc, 4);
        put(s, e.size, 4);  // compressed
        put(s, e.size, 4);
        put(s, e.name.size(), 2);
        put(s, 0, 2);  // extra field
        if (central) {
            put(s, 0, 2);  // comment
            put(s, 0, 2);  // disk
            put(s, 0, 2);  // internal attributes
            put(s, 0, 4);  // external attributes
            put(s, e.offset, 4);
        }
        return s;
    }

    void write(const void* data, std::size_t size) {
        sink_.write(data, size);
        offset_ += size;
    }

    Sink& sink_;
    std::string path_;
    std::string_view op_;
    std::uint64_t offset_ = 0;
    std::vector<entry> entries_;
};

}  // namespace dimsum::detail::zip
