#pragma once
// The part of the ZIP format that NumPy's .npz files use, read and written by hand so that
// dimsum needs no compression library: members stored (numpy.savez) or deflated
// (numpy.savez_compressed), ZIP64 sizes and offsets (NumPy asks for them on every member),
// one disk, no encryption. Everything read is checked against the file's size and the CRC-32
// of each member, so a truncated or corrupt archive is a file_error, never a read past the
// end. A member is read as a stream, in constant memory whatever sizes the archive claims.
// Written archives store their members uncompressed, as numpy.savez does.
//
// References: PKWARE's APPNOTE.TXT (the ZIP format) and RFC 1951 (deflate).

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dimsum/core/file_error.hpp"

namespace dimsum::detail::zip {

// CRC-32 (ISO-HDLC, the one ZIP and zlib use), sixteen bytes a step ("slicing by 16"):
// table k gives a byte's contribution k bytes further on, so the lookups of a step are
// independent. About 4 GB/s here, some 6% of reading a deflated member (eight bytes a step:
// 2 GB/s, 13%).
inline constexpr std::array<std::array<std::uint32_t, 256>, 16> crc_tables = [] {
    std::array<std::array<std::uint32_t, 256>, 16> tables{};
    for (std::uint32_t n = 0; n < 256; ++n) {
        std::uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        tables[0][n] = c;
    }
    for (std::size_t k = 1; k < 16; ++k) {
        for (std::size_t n = 0; n < 256; ++n) tables[k][n] = tables[k - 1][n] >> 8 ^ tables[0][tables[k - 1][n] & 0xff];
    }
    return tables;
}();

// Continues a CRC over more bytes: crc32(crc32(0, a), b) is the CRC of a then b.
inline std::uint32_t crc32(std::uint32_t crc, const void* data, std::size_t size) {
    const auto& t = crc_tables;
    const auto* p = static_cast<const unsigned char*>(data);
    crc = ~crc;
    for (; size >= 16; p += 16, size -= 16) {
        // the CRC so far enters with the first four bytes; each byte then lies 15 - i bytes from the end
        const std::uint32_t first = crc ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                           std::uint32_t(p[3]) << 24);
        crc = t[15][first & 0xff] ^ t[14][first >> 8 & 0xff] ^ t[13][first >> 16 & 0xff] ^ t[12][first >> 24];
        for (int i = 4; i < 16; ++i) crc ^= t[15 - i][p[i]];
    }
    for (; size > 0; --size) crc = t[0][(crc ^ *p++) & 0xff] ^ crc >> 8;
    return ~crc;
}

// A canonical Huffman code (RFC 1951, 3.2.2) as decoding reads it. The stream holds a code's
// bits first bit first, least significant first in each byte: `fast`, indexed by the next
// fast_bits bits of the stream, gives the symbol and length of every code of up to fast_bits
// bits at once (each code bit-reversed, repeated for every value of the bits after it). A
// longer code, or one the code lacks, has length 0 there and is decoded from the canonical
// form: how many codes have each length, and the symbols in the order of their codes.
struct huffman {
    // 10 bits: a 4 KiB table, filled in well under a microsecond per block, that holds every
    // code of a fixed block (7 to 9 bits) and nearly every symbol of data that compresses.
    static constexpr int fast_bits = 10;
    struct entry {
        std::uint16_t symbol = 0;
        std::uint8_t length = 0;  // 0: a longer code, or none
    };
    std::array<entry, 1 << fast_bits> fast;
    std::array<std::uint16_t, 16> count;
    std::array<std::uint16_t, 288> symbol;

    // From each symbol's code length (0: unused). An over-subscribed set of lengths is no code
    // (false); an incomplete one is allowed (a stream may use one distance code), and reading
    // a code it lacks is an error.
    bool build(const std::uint8_t* lengths, std::size_t n) {
        count.fill(0);
        for (std::size_t s = 0; s < n; ++s) ++count[lengths[s]];
        int left = 1;
        for (int len = 1; len < 16; ++len) {
            left = 2 * left - count[len];
            if (left < 0) return false;
        }
        std::array<std::uint16_t, 16> offset{};
        for (int len = 1; len < 15; ++len) offset[len + 1] = offset[len] + count[len];
        for (std::size_t s = 0; s < n; ++s) {
            if (lengths[s]) symbol[offset[lengths[s]]++] = static_cast<std::uint16_t>(s);
        }
        fast.fill({});
        unsigned first = 0, index = 0;  // the first code of each length, and its symbol's index
        for (int len = 1; len <= fast_bits; ++len) {
            for (unsigned i = 0; i < count[len]; ++i) {
                unsigned reversed = 0;
                for (int b = 0; b < len; ++b) reversed |= ((first + i) >> b & 1) << (len - 1 - b);
                for (unsigned at = reversed; at < fast.size(); at += 1u << len) {
                    fast[at] = {symbol[index + i], static_cast<std::uint8_t>(len)};
                }
            }
            index += count[len];
            first = (first + count[len]) << 1;
        }
        return true;
    }
};

// A raw deflate stream (RFC 1951) decoded a piece at a time, in constant memory: the
// compressed bytes come from a source in pieces, and the output goes to a window that keeps
// the last 32 KiB (as far back as a match reaches) before room for the next piece. Decoding
// stops between symbols, or inside a stored block, and resumes there: the state between
// calls is the kind of block at hand, its codes or the bytes left of a stored block, and
// whether it is the last. Any malformed stream is a file_error naming `where`; what the
// stream should decompress to is the caller's to check.
class inflater {
public:
    using source = std::function<std::span<const unsigned char>()>;  // the next piece, empty at the end

    static constexpr std::size_t history = 32 * 1024;  // the farthest a match reaches back
    static constexpr std::size_t piece = 64 * 1024;    // the most one next() gives
    static constexpr std::size_t longest_match = 258;

    inflater(source more, std::string_view op, std::string where)
        : more_(std::move(more)), op_(op), where_(std::move(where)), window_(history + piece + copy_slack) {}
    inflater(const inflater&) = delete;
    inflater& operator=(const inflater&) = delete;

    // The next bytes of the stream: at least `want` (up to `piece`) where the stream holds
    // them, a match's length more at most, fewer only at its end; none once it has ended.
    // They stay valid until the next call.
    std::span<const unsigned char> next(std::size_t want) {
        if (w_ + longest_match >= window_.size() - copy_slack) slide();
        const std::size_t start = w_;
        const std::size_t stop = start + std::clamp<std::size_t>(want, 1, window_.size() - copy_slack - longest_match - start);
        while (w_ < stop) {
            switch (state_) {
                case block::header: block_header(); break;
                case block::stored: stored(stop); break;
                case block::huffman: symbols(stop); break;
                case block::ended: return {window_.data() + start, w_ - start};
            }
        }
        return {window_.data() + start, w_ - start};
    }

    bool ended() const { return state_ == block::ended; }

    // Compressed bytes decoded so far.
    std::uint64_t consumed() const {
        return fetched_ - static_cast<std::uint64_t>(in_.end - in_.next) - static_cast<std::uint64_t>(in_.count / 8);
    }

private:
    // A match is copied eight bytes at a time, the last eight possibly past its end.
    static constexpr std::size_t copy_slack = 8;

    enum class block { header, stored, huffman, ended };

    // The stream's bits, least significant first, through a 64-bit buffer. Past the stream's
    // last byte the buffer reads zeros: `count` says how many of its bits are real, and using
    // more is the error "the stream ends early".
    struct bit_input {
        std::uint64_t buffer = 0;
        int count = 0;
        const unsigned char* next = nullptr;  // the piece at hand: [next, end)
        const unsigned char* end = nullptr;
    };

    [[noreturn, gnu::cold, gnu::noinline]] void corrupt(const std::string& what) const {
        throw_file_error(op_, where_, "corrupt deflate data: " + what);
    }

    // Tops the buffer up to 56 bits or more (all that is left at the stream's end): enough
    // for a length code, its extra bits, a distance code and its extra bits (48 at most).
    // Eight bytes are loaded at once, and those that do not fit whole leave bits above
    // `count`: the stream's next bits, which the next refill puts there again. The hot paths
    // pass `in` by reference to inlined code only, and by value elsewhere, so that it stays
    // in registers while bytes are written to the window.
    void refill(bit_input& in) {
        if (in.end - in.next >= 8) {
            std::uint64_t word;
            std::memcpy(&word, in.next, 8);
            if constexpr (std::endian::native == std::endian::big) word = __builtin_bswap64(word);
            in.buffer |= word << in.count;
            in.next += (63 - in.count) >> 3;  // whole bytes that fit
            in.count |= 56;
        } else {
            in = refill_slowly(in);
        }
    }

    [[gnu::noinline]] bit_input refill_slowly(bit_input in) {
        while (in.count <= 56) {
            if (in.next == in.end) {
                const std::span<const unsigned char> piece = more_();
                if (piece.empty()) break;
                in.next = piece.data();
                in.end = piece.data() + piece.size();
                fetched_ += piece.size();
            }
            in.buffer |= std::uint64_t(*in.next++) << in.count;
            in.count += 8;
        }
        return in;
    }

    // The next n bits (n <= 32), which refill() has put in the buffer.
    unsigned take(bit_input& in, int n) {
        if (n > in.count) corrupt("the stream ends early");
        const auto value = static_cast<unsigned>(in.buffer & ((std::uint64_t(1) << n) - 1));
        in.buffer >>= n;
        in.count -= n;
        return value;
    }

    // One symbol, its code in the buffer (refill() first).
    unsigned decode(bit_input& in, const huffman& code) {
        const huffman::entry e = code.fast[in.buffer & (code.fast.size() - 1)];
        if (e.length == 0) {
            const auto [symbol, length] = decode_long(in.buffer, in.count, code);
            take(in, length);
            return symbol;
        }
        take(in, e.length);
        return e.symbol;
    }

    // A code longer than the table's bits, a bit at a time: codes are read most significant
    // bit first. Its symbol and length.
    [[gnu::noinline]] std::pair<unsigned, int> decode_long(std::uint64_t bits, int count, const huffman& code) const {
        int value = 0, first = 0, index = 0;
        for (int len = 1; len < 16; ++len) {
            if (len > count) corrupt("the stream ends early");
            value |= static_cast<int>(bits >> (len - 1) & 1);
            const int n = code.count[len];
            if (value - first < n) return {code.symbol[index + value - first], len};
            index += n;
            first = (first + n) << 1;
            value <<= 1;
        }
        corrupt("a code that the block's Huffman table does not have");
    }

    void block_header() {
        bit_input& in = in_;
        refill(in);
        last_ = take(in, 1);
        switch (take(in, 2)) {
            case 0: {
                take(in, in.count % 8);  // the rest of the current byte is padding
                refill(in);
                const unsigned length = take(in, 16), complement = take(in, 16);
                if (length != (~complement & 0xffff)) corrupt("a stored block's length fails its check");
                stored_left_ = length;
                state_ = block::stored;
                return;
            }
            case 1:
                literals_ = &fixed_code().literals;
                distances_ = &fixed_code().distances;
                state_ = block::huffman;
                return;
            case 2: dynamic_header(); return;
            default: corrupt("a block of the reserved type 3");
        }
    }

    void end_of_block() { state_ = last_ ? block::ended : block::header; }

    // A stored block's bytes up to window position `stop`: first those already in the bit
    // buffer (a whole number of bytes after the header), then straight from the input.
    void stored(std::size_t stop) {
        bit_input& in = in_;
        while (stored_left_ > 0 && w_ < stop) {
            if (in.count >= 8) {
                window_[w_++] = static_cast<unsigned char>(take(in, 8));
                --stored_left_;
                continue;
            }
            // The buffer is spent; what refill() put above its count is bytes copied below.
            in.buffer = 0;
            if (in.next == in.end) {
                in = refill_slowly(in);
                if (in.count == 0) corrupt("the stream ends early");
                continue;
            }
            const std::size_t n = std::min({std::size_t(stored_left_), stop - w_, std::size_t(in.end - in.next)});
            std::memcpy(window_.data() + w_, in.next, n);
            in.next += n;
            w_ += n;
            stored_left_ -= static_cast<std::uint32_t>(n);
        }
        if (stored_left_ == 0) end_of_block();
    }

    // A Huffman block's symbols until its end, or until the window reaches `stop`, which
    // leaves room for one more match.
    void symbols(std::size_t stop_at) {
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
        bit_input in = in_;  // a local copy, kept in registers (see refill)
        const huffman& literals = *literals_;
        const huffman& distances = *distances_;
        unsigned char* const window = window_.data();
        unsigned char* out = window + w_;
        unsigned char* const stop = window + stop_at;
        while (out < stop) {
            refill(in);
            unsigned symbol = decode(in, literals);
            if (symbol < 256) {
                *out++ = static_cast<unsigned char>(symbol);
                continue;
            }
            if (symbol == 256) {
                end_of_block();
                break;
            }
            symbol -= 257;
            if (symbol >= length_base.size()) corrupt("a length symbol out of range");
            const std::size_t length = length_base[symbol] + take(in, length_extra[symbol]);
            const unsigned d = decode(in, distances);
            if (d >= distance_base.size()) corrupt("a distance symbol out of range");
            const std::size_t distance = distance_base[d] + take(in, distance_extra[d]);
            // Once the window has slid it holds `history` bytes before `out`, as far as any
            // distance reaches; before, it holds the whole output.
            if (distance > std::size_t(out - window)) corrupt("a distance reaches back before the start of the data");
            const unsigned char* from = out - distance;
            if (distance >= 8) {  // each eight bytes copied lie before the eight written
                for (std::size_t i = 0; i < length; i += 8) std::memcpy(out + i, from + i, 8);
            } else if (distance == 1) {
                std::memset(out, *from, length);
            } else {
                for (std::size_t i = 0; i < length; ++i) out[i] = from[i];
            }
            out += length;
        }
        w_ = static_cast<std::size_t>(out - window);
        in_ = in;
    }

    struct fixed_codes {
        huffman literals, distances;
    };

    // The codes of a fixed block (RFC 1951, 3.2.6), built once.
    static const fixed_codes& fixed_code() {
        static const fixed_codes codes = [] {
            std::array<std::uint8_t, 288 + 30> lengths{};
            std::fill_n(lengths.begin(), 144, 8);
            std::fill_n(lengths.begin() + 144, 112, 9);
            std::fill_n(lengths.begin() + 256, 24, 7);
            std::fill_n(lengths.begin() + 280, 8, 8);
            std::fill_n(lengths.begin() + 288, 30, 5);
            fixed_codes c;
            c.literals.build(lengths.data(), 288);
            c.distances.build(lengths.data() + 288, 30);
            return c;
        }();
        return codes;
    }

    void dynamic_header() {
        static constexpr std::array<std::uint8_t, 19> order{16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
        bit_input& in = in_;
        refill(in);
        const unsigned literal_count = take(in, 5) + 257, distance_count = take(in, 5) + 1, length_count = take(in, 4) + 4;
        if (literal_count > 286 || distance_count > 30) corrupt("a block declares too many codes");
        std::array<std::uint8_t, 19> length_lengths{};
        for (unsigned i = 0; i < length_count; ++i) {
            refill(in);
            length_lengths[order[i]] = static_cast<std::uint8_t>(take(in, 3));
        }
        huffman lengths_code;
        if (!lengths_code.build(length_lengths.data(), 19)) corrupt("a Huffman code is over-subscribed");

        std::array<std::uint8_t, 286 + 30> lengths{};
        for (unsigned i = 0; i < literal_count + distance_count;) {
            refill(in);
            const unsigned symbol = decode(in, lengths_code);
            if (symbol < 16) {
                lengths[i++] = static_cast<std::uint8_t>(symbol);
                continue;
            }
            std::uint8_t repeated = 0;
            unsigned times = 0;
            if (symbol == 16) {
                if (i == 0) corrupt("a repeated code length with none before it");
                repeated = lengths[i - 1];
                times = 3 + take(in, 2);
            } else if (symbol == 17) {
                times = 3 + take(in, 3);
            } else {
                times = 11 + take(in, 7);
            }
            if (i + times > literal_count + distance_count) corrupt("code lengths run past their count");
            std::fill_n(lengths.begin() + i, times, repeated);
            i += times;
        }
        if (lengths[256] == 0) corrupt("a block with no end-of-block code");
        if (!literal_code_.build(lengths.data(), literal_count) ||
            !distance_code_.build(lengths.data() + literal_count, distance_count)) {
            corrupt("a Huffman code is over-subscribed");
        }
        literals_ = &literal_code_;
        distances_ = &distance_code_;
        state_ = block::huffman;
    }

    // Keeps the last `history` bytes, at the window's start.
    void slide() {
        std::memmove(window_.data(), window_.data() + w_ - history, history);
        w_ = history;
    }

    source more_;
    std::string_view op_;
    std::string where_;
    bit_input in_;
    std::uint64_t fetched_ = 0;  // compressed bytes taken from the source
    std::vector<unsigned char> window_;
    std::size_t w_ = 0;  // the window's bytes so far
    block state_ = block::header;
    bool last_ = false;  // the block at hand is the stream's last
    std::uint32_t stored_left_ = 0;
    const huffman* literals_ = nullptr;
    const huffman* distances_ = nullptr;
    huffman literal_code_, distance_code_;  // a dynamic block's
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

// A ZIP archive open for reading: its central directory, checked; a member's bytes are read
// through a member_stream.
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

    std::string where(const member& m) const { return path_ + ", member '" + m.name + "'"; }

private:
    friend class member_stream;

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

// One member's bytes in order, whatever its size, in constant memory: a stored member's
// straight from the file, a deflated one's inflated a piece at a time. A CRC-32 runs over
// every byte produced; finish() checks it and the size against the directory. A deflate
// stream that produces more than the directory's size is an error as soon as it does, after
// one piece at most: a small file never inflates to more than it says.
class member_stream {
public:
    member_stream(reader& archive, const member& m) : archive_(archive), member_(m), start_(archive.data_offset(m)) {
        if (m.how == method::stored) return;
        // deflate expands at most 1032-fold: a larger size is a lie, however the stream goes
        if (m.size / 1032 > m.compressed_size) fail("its size is more than deflate can expand its data to");
        input_.resize(std::min<std::uint64_t>(m.compressed_size, input_piece));
        inflater_.emplace([this] { return next_input(); }, archive_.op_, archive_.where(m));
    }
    member_stream(const member_stream&) = delete;
    member_stream& operator=(const member_stream&) = delete;

    // The next n bytes of the member.
    void read(void* into, std::uint64_t n) {
        if (n > member_.size - position_) fail("read past the member's end");
        auto* out = static_cast<unsigned char*>(into);
        if (!inflater_) {
            archive_.read_at(start_ + position_, out, n);
            crc_ = crc32(crc_, out, n);
            position_ += n;
            compressed_read_ += n;
            return;
        }
        while (n > 0) {
            if (pending_.empty()) inflate(n);
            const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, pending_.size()));
            std::memcpy(out, pending_.data(), k);
            pending_ = pending_.subspan(k);
            out += k;
            n -= k;
            position_ += k;
        }
    }

    // Passes over the next n bytes: a stored member's are not read (and the CRC goes
    // unchecked), a deflated one's are inflated.
    void skip(std::uint64_t n) {
        if (n > member_.size - position_) fail("read past the member's end");
        if (!inflater_) {
            crc_whole_ = crc_whole_ && n == 0;
            position_ += n;
            return;
        }
        while (n > 0) {
            if (pending_.empty()) inflate(n);
            const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, pending_.size()));
            pending_ = pending_.subspan(k);
            n -= k;
            position_ += k;
        }
    }

    // Bytes of the member read or skipped so far.
    std::uint64_t position() const { return position_; }

    // Bytes taken from the file so far: a stored member's read, a deflated one's decoded.
    std::uint64_t compressed_read() const { return inflater_ ? inflater_->consumed() : compressed_read_; }

    // The rest of the member, read (a stored one's only where its CRC can still be checked)
    // a piece at a time; then its size and CRC-32 checked against the directory.
    void finish() {
        if (!inflater_) {
            if (!crc_whole_) return;
            std::vector<unsigned char> rest(static_cast<std::size_t>(std::min<std::uint64_t>(member_.size - position_, input_piece)));
            while (position_ < member_.size) read(rest.data(), std::min<std::uint64_t>(rest.size(), member_.size - position_));
        } else {
            position_ += pending_.size();
            pending_ = {};
            while (!inflater_->ended()) {
                inflate(inflater::piece);
                position_ += pending_.size();
                pending_ = {};
            }
            if (inflated_ != member_.size) fail_size();
        }
        if (crc_ != member_.crc) fail("its CRC-32 does not match its data (a corrupt archive)");
    }

private:
    // Compressed bytes are read from the file this many at a time.
    static constexpr std::uint64_t input_piece = 64 * 1024;

    [[noreturn]] void fail(std::string_view what) const { archive_.fail_member(member_, what); }

    std::span<const unsigned char> next_input() {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(input_.size(), member_.compressed_size - fetched_));
        if (n == 0) return {};
        archive_.read_at(start_ + fetched_, input_.data(), n);
        fetched_ += n;
        return {input_.data(), n};
    }

    // The next inflated bytes, at least `want` where the stream holds them, into pending_; an
    // error if the stream ends before the directory's size or passes it.
    void inflate(std::uint64_t want) {
        pending_ = inflater_->next(static_cast<std::size_t>(std::min<std::uint64_t>(want, inflater::piece)));
        inflated_ += pending_.size();
        if (inflated_ > member_.size) {
            fail("corrupt deflate data: it decompresses to more than the " + std::to_string(member_.size) +
                 " bytes the directory says");
        }
        if (pending_.empty() && inflated_ != member_.size) fail_size();  // the stream has ended short
        crc_ = crc32(crc_, pending_.data(), pending_.size());
    }

    [[noreturn]] void fail_size() const {
        fail("corrupt deflate data: it decompresses to " + std::to_string(inflated_) + " bytes, the directory says " +
             std::to_string(member_.size));
    }

    reader& archive_;
    const member& member_;
    const std::uint64_t start_;      // where the member's data starts in the file
    std::uint64_t position_ = 0;     // bytes handed out: read or skipped
    std::uint32_t crc_ = 0;          // of the bytes produced so far
    bool crc_whole_ = true;          // whether those are all the bytes from the first
    std::uint64_t compressed_read_ = 0;  // a stored member's
    // A deflated member's: its compressed bytes read in pieces, the bytes inflated so far, and
    // those not yet handed out.
    std::vector<unsigned char> input_;
    std::uint64_t fetched_ = 0, inflated_ = 0;
    std::optional<inflater> inflater_;
    std::span<const unsigned char> pending_;
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
