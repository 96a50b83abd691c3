#pragma once
// The .safetensors container (Hugging Face's format for model weights), read and written by
// hand: an 8-byte little-endian header length N, N bytes of JSON
//     {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//      "__metadata__": {"key": "value", ...}}
// then the data, each tensor in C order at [begin, end) of the bytes after the header.
// The reader checks what the format promises: a header of at most 100 MB that is one JSON
// object, known dtypes, sizes that match the shapes, and tensors that cover the data exactly,
// without overlap or gap; anything else is a file_error.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "dimsum/core/file_error.hpp"

namespace dimsum::detail::safetensors {

// One tensor of the file: offsets are relative to the first byte after the header.
struct entry {
    std::string name;
    std::string dtype;  // as the file writes it: "F32", "BF16", "I64", ...
    std::vector<std::size_t> shape;
    std::uint64_t begin = 0, end = 0;
};

inline constexpr std::uint64_t max_header_length = 100'000'000;

// The bytes of one element of a dtype the format defines; 0 for a name it does not.
inline std::size_t dtype_size(std::string_view dtype) {
    static constexpr std::pair<std::string_view, std::size_t> sizes[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
        {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},   {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (auto [name, size] : sizes) {
        if (name == dtype) return size;
    }
    return 0;
}

// The JSON the header is: objects, arrays, strings, non-negative integers where the format
// has numbers; true, false, null and other numbers only inside "__metadata__" (skipped).
class header_parser {
public:
    header_parser(std::string_view text, std::string_view op, std::string_view where)
        : text_(text), op_(op), where_(where) {}

    std::vector<entry> parse() {
        std::vector<entry> entries;
        std::map<std::string, bool> seen;
        expect('{');
        if (!eat('}')) {
            do {
                std::string name = string();
                if (seen[name]) malformed("the name '" + name + "' appears twice");
                seen[name] = true;
                expect(':');
                if (name == "__metadata__") {
                    skip_value(0);
                } else {
                    entries.push_back(tensor(std::move(name)));
                }
            } while (eat(','));
            expect('}');
        }
        skip_space();
        if (pos_ != text_.size()) malformed_at("nothing after the header's closing '}' but spaces");
        return entries;
    }

private:
    [[noreturn]] void malformed(const std::string& what) const {
        throw_file_error(op_, where_, "malformed .safetensors header: " + what);
    }
    [[noreturn]] void malformed_at(const std::string& expected) const {
        malformed("expected " + expected + " at byte " + std::to_string(pos_) + " of the header");
    }

    void skip_space() {
        while (pos_ < text_.size() && std::string_view(" \t\r\n").find(text_[pos_]) != std::string_view::npos) ++pos_;
    }
    char peek() {
        skip_space();
        return pos_ < text_.size() ? text_[pos_] : '\0';
    }
    bool eat(char c) {
        if (peek() != c) return false;
        ++pos_;
        return true;
    }
    void expect(char c) {
        if (!eat(c)) malformed_at(std::string("'") + c + "'");
    }

    entry tensor(std::string name) {
        entry e;
        e.name = std::move(name);
        bool has_dtype = false, has_shape = false, has_offsets = false;
        expect('{');
        if (!eat('}')) {
            do {
                std::string key = string();
                expect(':');
                if (key == "dtype") {
                    e.dtype = string();
                    has_dtype = true;
                } else if (key == "shape") {
                    e.shape = integers();
                    has_shape = true;
                } else if (key == "data_offsets") {
                    std::vector<std::size_t> offsets = integers();
                    if (offsets.size() != 2) malformed("'" + e.name + "': data_offsets is not [begin, end]");
                    e.begin = offsets[0];
                    e.end = offsets[1];
                    has_offsets = true;
                } else {
                    skip_value(0);  // a key later versions may add
                }
            } while (eat(','));
            expect('}');
        }
        if (!has_dtype || !has_shape || !has_offsets) {
            malformed("'" + e.name + "' lacks " + (!has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets"));
        }
        return e;
    }

    std::vector<std::size_t> integers() {
        std::vector<std::size_t> values;
        expect('[');
        if (eat(']')) return values;
        do {
            if (peek() < '0' || peek() > '9') malformed_at("a non-negative integer");
            std::size_t n = 0;
            for (; pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9'; ++pos_) {
                if (__builtin_mul_overflow(n, 10, &n) || __builtin_add_overflow(n, std::size_t(text_[pos_] - '0'), &n)) {
                    malformed("an integer too large at byte " + std::to_string(pos_));
                }
            }
            values.push_back(n);
        } while (eat(','));
        expect(']');
        return values;
    }

    static void append_utf8(std::string& s, std::uint32_t c) {
        if (c < 0x80) {
            s += static_cast<char>(c);
        } else if (c < 0x800) {
            s += static_cast<char>(0xc0 | c >> 6);
            s += static_cast<char>(0x80 | (c & 0x3f));
        } else if (c < 0x10000) {
            s += static_cast<char>(0xe0 | c >> 12);
            s += static_cast<char>(0x80 | (c >> 6 & 0x3f));
            s += static_cast<char>(0x80 | (c & 0x3f));
        } else {
            s += static_cast<char>(0xf0 | c >> 18);
            s += static_cast<char>(0x80 | (c >> 12 & 0x3f));
            s += static_cast<char>(0x80 | (c >> 6 & 0x3f));
            s += static_cast<char>(0x80 | (c & 0x3f));
        }
    }

    std::uint32_t hex4() {
        if (text_.size() - pos_ < 4) malformed_at("four hex digits after \\u");
        std::uint32_t c = 0;
        for (int i = 0; i < 4; ++i, ++pos_) {
            char h = text_[pos_];
            int digit = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (digit < 0) malformed_at("a hex digit");
            c = c << 4 | static_cast<std::uint32_t>(digit);
        }
        return c;
    }

    std::string string() {
        if (peek() != '"') malformed_at("a string");
        std::string s;
        for (++pos_;;) {
            if (pos_ == text_.size()) malformed("a string is not closed");
            char c = text_[pos_++];
            if (c == '"') return s;
            if (static_cast<unsigned char>(c) < 0x20) malformed("a control character inside a string");
            if (c != '\\') {
                s += c;
                continue;
            }
            if (pos_ == text_.size()) malformed("a string is not closed");
            switch (char e = text_[pos_++]) {
                case '"': case '\\': case '/': s += e; break;
                case 'b': s += '\b'; break;
                case 'f': s += '\f'; break;
                case 'n': s += '\n'; break;
                case 'r': s += '\r'; break;
                case 't': s += '\t'; break;
                case 'u': {
                    std::uint32_t c1 = hex4();
                    if (c1 >= 0xd800 && c1 < 0xdc00) {  // a surrogate pair
                        if (text_.substr(pos_, 2) != "\\u") malformed_at("the second half of a surrogate pair");
                        pos_ += 2;
                        std::uint32_t c2 = hex4();
                        if (c2 < 0xdc00 || c2 >= 0xe000) malformed_at("the second half of a surrogate pair");
                        c1 = 0x10000 + ((c1 - 0xd800) << 10) + (c2 - 0xdc00);
                    } else if (c1 >= 0xdc00 && c1 < 0xe000) {
                        malformed_at("a character, not half of a surrogate pair");
                    }
                    append_utf8(s, c1);
                    break;
                }
                default: malformed("an unknown escape '\\" + std::string(1, e) + "' in a string");
            }
        }
    }

    // Any JSON value, checked and dropped; nesting is bounded so that a hostile header cannot
    // exhaust the stack.
    void skip_value(int depth) {
        if (depth > 64) malformed("values nested more than 64 deep");
        char c = peek();
        if (c == '"') {
            string();
        } else if (c == '{' || c == '[') {
            ++pos_;
            const char close = c == '{' ? '}' : ']';
            if (eat(close)) return;
            do {
                if (c == '{') {
                    string();
                    expect(':');
                }
                skip_value(depth + 1);
            } while (eat(','));
            expect(close);
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            ++pos_;
            while (pos_ < text_.size() && std::string_view("0123456789.eE+-").find(text_[pos_]) != std::string_view::npos) ++pos_;
        } else {
            for (std::string_view word : {"true", "false", "null"}) {
                if (text_.substr(pos_, word.size()) == word) {
                    pos_ += word.size();
                    return;
                }
            }
            malformed_at("a JSON value");
        }
    }

    std::string_view text_;
    std::size_t pos_ = 0;
    std::string_view op_, where_;
};

// Checks the entries against the data's size: known dtypes, `end - begin` the bytes of the
// shape, and the tensors in order of their offsets covering [0, data_size) exactly.
inline void check_layout(std::vector<entry> entries, std::uint64_t data_size, std::string_view op,
                         std::string_view where) {
    auto fail = [&](const std::string& what) { throw_file_error(op, where, "the header lies: " + what); };
    for (const entry& e : entries) {
        const std::size_t item = dtype_size(e.dtype);
        if (item == 0) throw_file_error(op, where, "'" + e.name + "' has the unknown dtype '" + e.dtype + "'");
        std::uint64_t bytes = item;
        for (std::size_t extent : e.shape) {
            if (__builtin_mul_overflow(bytes, extent, &bytes)) fail("the shape of '" + e.name + "' overflows");
        }
        if (e.begin > e.end || e.end - e.begin != bytes) {
            fail("'" + e.name + "' takes bytes [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                 ") but its shape and dtype need " + std::to_string(bytes));
        }
    }
    std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t covered = 0;
    for (const entry& e : entries) {
        if (e.begin != covered) {
            fail(e.begin < covered ? "'" + e.name + "' overlaps another tensor"
                                   : "a gap of unused bytes before '" + e.name + "'");
        }
        covered = e.end;
    }
    if (covered != data_size) {
        fail("the tensors take " + std::to_string(covered) + " bytes of data, the file holds " +
             std::to_string(data_size) + (covered > data_size ? " (truncated?)" : ""));
    }
}

// The header of a file of these entries, in this order, their offsets set consecutively:
// the length, then the JSON, padded with spaces to a multiple of 8 bytes so that the data
// starts aligned.
inline std::string file_head(std::vector<entry>& entries) {
    auto quoted = [](const std::string& s) {
        std::string out = "\"";
        for (char c : s) {
            if (c == '"' || c == '\\') {
                out += '\\';
                out += c;
            } else if (static_cast<unsigned char>(c) < 0x20) {
                constexpr char hex[] = "0123456789abcdef";
                out += "\\u00";
                out += hex[c >> 4];
                out += hex[c & 15];
            } else {
                out += c;
            }
        }
        return out + "\"";
    };
    std::string json = "{";
    std::uint64_t offset = 0;
    for (entry& e : entries) {
        e.begin = offset;
        std::uint64_t bytes = dtype_size(e.dtype);
        for (std::size_t extent : e.shape) bytes *= extent;
        e.end = offset += bytes;
        if (json.size() > 1) json += ',';
        // appended piece by piece, not `"..." + std::to_string(...)`: g++ 12 warns (-Wrestrict)
        // about its own inlined concatenation of a literal and a temporary string
        json.append(quoted(e.name)).append(":{\"dtype\":\"").append(e.dtype).append("\",\"shape\":[");
        for (std::size_t i = 0; i < e.shape.size(); ++i) json.append(i ? "," : "").append(std::to_string(e.shape[i]));
        json.append("],\"data_offsets\":[").append(std::to_string(e.begin)).append(",");
        json.append(std::to_string(e.end)).append("]}");
    }
    json += '}';
    json.append((8 - json.size() % 8) % 8, ' ');
    std::string head;
    for (int i = 0; i < 8; ++i) head += static_cast<char>((json.size() >> (8 * i)) & 0xff);
    return head + json;
}

}  // namespace dimsum::detail::safetensors
