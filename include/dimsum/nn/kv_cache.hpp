#pragma once
// A key/value cache for decoding step by step: memory for every position up to a maximum,
// allocated once; each step writes its new keys and values into the next positions, and
// attention reads views of the positions so far.

#include <cstddef>

#include "dimsum/core/message.hpp"
#include "dimsum/core/shape_error.hpp"
#include "dimsum/evaluation/assign.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/tensor/tensor.hpp"

namespace dimsum::nn {

namespace detail {
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cache_full(std::size_t size, std::size_t adding,
                                                                    std::size_t capacity) {
    message m;
    m << "dimsum: kv_cache: " << adding << " more positions after " << size << " do not fit in its " << capacity;
    throw shape_error(m);
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_value_positions(std::size_t keys, std::size_t values) {
    message m;
    m << "dimsum: kv_cache: " << keys << " new key positions but " << values << " value positions";
    throw shape_error(m);
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cannot_keep(std::size_t size, std::size_t have) {
    message m;
    m << "dimsum: kv_cache: cannot keep " << size << " positions of " << have;
    throw shape_error(m);
}
}  // namespace detail

// Keys (batch, kv_heads, seq, head) and values (batch, kv_heads, seq, value_head) of up to
// `capacity` positions. append() writes a step's keys and values (tensors or formulas, their
// seq axis the new positions) after the positions so far; keys() and values() are views of
// the positions so far. Nothing allocates after the constructor, and the views stay valid
// until clear() or the cache's end.
template <class T, axis_type Batch, axis_type KvHeads, axis_type Seq, axis_type Head, axis_type ValueHead = Head>
class kv_cache {
public:
    kv_cache(std::size_t batch, std::size_t capacity)
        : keys_(Batch{batch}, KvHeads{KvHeads::static_extent}, Seq{capacity}, Head{Head::static_extent}),
          values_(Batch{batch}, KvHeads{KvHeads::static_extent}, Seq{capacity}, ValueHead{ValueHead::static_extent}) {}

    std::size_t size() const { return size_; }
    std::size_t capacity() const { return keys_.extent(2); }

    // Writes k (batch, kv_heads, seq=n, head) and v at positions size() .. size() + n and adds
    // them to the cache. A shape mismatch or a full cache is a shape_error, and leaves the
    // cache as it was.
    template <class K, class V>
    void append(const K& k, const V& v, call_site caller = call_site::current()) {
        ::dimsum::detail::operation_site site(caller);
        const std::size_t adding = k.shape().extent(2);
        if (adding > capacity() - size_) detail::throw_cache_full(size_, adding, capacity());
        if (v.shape().extent(2) != adding) detail::throw_value_positions(adding, v.shape().extent(2));
        assign(slice<Seq>(keys_, size_, size_ + adding), k);
        assign(slice<Seq>(values_, size_, size_ + adding), v);
        size_ += adding;
    }

    // The positions so far: (batch, kv_heads, seq=size(), head) and (..., value_head).
    tensor_view<const T, Batch, KvHeads, Seq, Head> keys() const { return slice<Seq>(keys_, 0, size_); }
    tensor_view<const T, Batch, KvHeads, Seq, ValueHead> values() const { return slice<Seq>(values_, 0, size_); }

    // Forgets every position (a new sequence); the memory stays.
    void clear() { size_ = 0; }
    // Forgets the positions from `size` on (a rejected draft, a beam backtracking); a size
    // past the positions so far is a shape_error.
    void keep(std::size_t size) {
        if (size > size_) detail::throw_cannot_keep(size, size_);
        size_ = size;
    }

private:
    tensor<T, Batch, KvHeads, Seq, Head> keys_;
    tensor<T, Batch, KvHeads, Seq, ValueHead> values_;
    std::size_t size_ = 0;
};

}  // namespace dimsum::nn
