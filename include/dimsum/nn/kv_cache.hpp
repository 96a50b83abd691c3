#pragma once
// A key/value cache for decoding step by step: memory for every position up to a maximum,
// allocated once; each step writes its new keys and values into the next positions, and
// attention reads views of the positions so far.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

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
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_real_count(std::size_t given, std::size_t batch) {
    message m;
    m << "dimsum: kv_cache: " << given << " real-row counts given for a batch of " << batch;
    throw shape_error(m);
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_real_rows(std::size_t real, std::size_t rows) {
    message m;
    m << "dimsum: kv_cache: " << real << " real rows in a step of " << rows;
    throw shape_error(m);
}
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_cannot_keep(std::size_t size, std::size_t have) {
    message m;
    m << "dimsum: kv_cache: cannot keep " << size << " positions of " << have;
    throw shape_error(m);
}
}  // namespace detail

// Where the real tokens of a step of a padded batch lie among its n new rows: for sequence b,
// `real[b]` of them, the last ones (padding on the left, as batched generation pads prompts)
// or the first ones (padding on the right). Empty `real`: every row of every sequence.
enum class padding_side : unsigned char { left, right };
struct step_padding {
    std::span<const std::size_t> real = {};
    padding_side side = padding_side::left;
};

// Of a step of a padded batch (kv_cache::step_positions): each new row's position in its
// sequence (a padding row's clamped to the sequence's positions), and per sequence the end
// of its rows (row i is position ends - n + i, padding rows included) and its positions
// after the step. A row sees the cached positions up to its own and below `lengths`:
// causal_mask(ends, rows, keys) || !sequence_mask(lengths, keys) hides the others.
template <axis_type Batch, axis_type Rows>
struct step_positions {
    tensor<std::int64_t, Batch, Rows> rows;
    tensor<std::int64_t, Batch> ends;
    tensor<std::int64_t, Batch> lengths;
};

// A key/value cache as multi_head_attention reads one: kv_cache (below), or a type with its
// members.
template <class C>
concept key_value_cache = requires(const C& cache) {
    typename C::batch_axis;
    typename C::seq_axis;
    typename C::kv_heads_axis;
    typename C::head_axis;
    typename C::value_head_axis;
    typename C::value_type;
    cache.keys();
    cache.values();
    cache.size();
    cache.uniform();
};

// Keys (batch, kv_heads, seq, head) and values (batch, kv_heads, seq, value_head) of up to
// `capacity` positions per sequence. append() writes a step's keys and values (tensors or
// formulas, their seq axis the step's new rows) after each sequence's positions so far;
// keys() and values() are views of the positions so far, as many as the longest sequence has.
// Sequences of a batch may hold different numbers of positions (a padded batch, step_padding):
// a sequence's position p is slot p of its rows, and the slots past its length are not its
// positions (attention must mask them: see step_positions). Nothing allocates after the
// constructor but a padded append's scratch, and the views stay valid until clear() or the
// cache's end.
template <class T, axis_type Batch, axis_type KvHeads, axis_type Seq, axis_type Head, axis_type ValueHead = Head>
class kv_cache {
public:
    using batch_axis = Batch;
    using kv_heads_axis = KvHeads;
    using seq_axis = Seq;
    using head_axis = Head;
    using value_head_axis = ValueHead;
    using value_type = T;

    kv_cache(std::size_t batch, std::size_t capacity)
        : keys_(Batch{batch}, KvHeads{KvHeads::static_extent}, Seq{capacity}, Head{Head::static_extent}),
          values_(Batch{batch}, KvHeads{KvHeads::static_extent}, Seq{capacity}, ValueHead{ValueHead::static_extent}),
          lengths_(batch, 0) {}

    std::size_t batch() const { return keys_.extent(0); }
    // The positions of the longest sequence: the seq extent of keys() and values().
    std::size_t size() const { return size_; }
    std::size_t capacity() const { return keys_.extent(2); }
    // The positions of each sequence, all size() unless a padded step made them differ.
    std::span<const std::size_t> lengths() const { return lengths_; }
    bool uniform() const {
        return std::all_of(lengths_.begin(), lengths_.end(), [&](std::size_t l) { return l == size_; });
    }

    // Writes k (batch, kv_heads, seq=n, head) and v after each sequence's positions: all n rows,
    // or, of a padded step, each sequence's real rows. A shape mismatch, a full cache or a
    // bad `padding` is a shape_error, and leaves the cache as it was.
    template <class K, class V>
    void append(const K& k, const V& v, const step_padding& padding = {}, call_site caller = call_site::current()) {
        ::dimsum::detail::operation_site site(caller);
        const std::size_t n = k.shape().extent(2);
        if (v.shape().extent(2) != n) detail::throw_value_positions(n, v.shape().extent(2));
        check_step(n, padding);
        if (padding.real.empty() && uniform()) {
            assign(slice<Seq>(keys_, size_, size_ + n), k);
            assign(slice<Seq>(values_, size_, size_ + n), v);
            size_ += n;
            std::fill(lengths_.begin(), lengths_.end(), size_);
            return;
        }
        // each sequence's rows go to its own slots: the step's keys and values first held whole
        step_keys_ = k;
        step_values_ = v;
        // (slots past a sequence's length are not its positions until the lengths change, last)
        for (std::size_t b = 0; b < batch(); ++b) {
            const std::size_t real = real_rows(b, n, padding), first = first_real_row(b, n, padding), at = lengths_[b];
            assign(slice<Seq>(slice<Batch>(keys_, b, b + 1), at, at + real),
                   slice<Seq>(slice<Batch>(step_keys_, b, b + 1), first, first + real));
            assign(slice<Seq>(slice<Batch>(values_, b, b + 1), at, at + real),
                   slice<Seq>(slice<Batch>(step_values_, b, b + 1), first, first + real));
        }
        for (std::size_t b = 0; b < batch(); ++b) lengths_[b] += real_rows(b, n, padding);
        size_ = *std::max_element(lengths_.begin(), lengths_.end());
    }

    // Where the n rows of a step with this padding lie in their sequences, before append():
    // into `out`, resized as needed. What a layer needs to rotate the rows (each at its
    // position) and to mask their attention to this cache after append().
    template <axis_type Rows>
    void step_positions(std::size_t n, const step_padding& padding, nn::step_positions<Batch, Rows>& out) const {
        check_step(n, padding);
        if (out.rows.extent(0) != batch() || out.rows.extent(1) != n) {
            out.rows = tensor<std::int64_t, Batch, Rows>(Batch{batch()}, Rows{n});
            out.ends = tensor<std::int64_t, Batch>(Batch{batch()});
            out.lengths = tensor<std::int64_t, Batch>(Batch{batch()});
        }
        for (std::size_t b = 0; b < batch(); ++b) {
            const std::size_t real = real_rows(b, n, padding), after = lengths_[b] + real;
            // row i is position ends - n + i: on the left the real rows end the step, on the right they begin it
            const std::size_t end = padding.side == padding_side::left ? after : lengths_[b] + n;
            out.ends(b) = static_cast<std::int64_t>(end);
            out.lengths(b) = static_cast<std::int64_t>(after);
            const auto last = static_cast<std::int64_t>(after == 0 ? 0 : after - 1);
            for (std::size_t i = 0; i < n; ++i) {
                const std::int64_t p = static_cast<std::int64_t>(end) - static_cast<std::int64_t>(n) + static_cast<std::int64_t>(i);
                out.rows(b, i) = std::clamp<std::int64_t>(p, 0, last);  // a padding row: the nearest real position
            }
        }
    }

    // The positions so far: (batch, kv_heads, seq=size(), head) and (..., value_head).
    tensor_view<const T, Batch, KvHeads, Seq, Head> keys() const { return slice<Seq>(keys_, 0, size_); }
    tensor_view<const T, Batch, KvHeads, Seq, ValueHead> values() const { return slice<Seq>(values_, 0, size_); }

    // Forgets every position (a new sequence); the memory stays.
    void clear() {
        size_ = 0;
        std::fill(lengths_.begin(), lengths_.end(), 0);
    }
    // Forgets the positions from `size` on, of every sequence (a rejected draft, a beam
    // backtracking); a size past the positions so far is a shape_error.
    void keep(std::size_t size) {
        if (size > size_) detail::throw_cannot_keep(size, size_);
        size_ = size;
        for (std::size_t& l : lengths_) l = std::min(l, size);
    }

    // Throws shape_error unless a step of n rows with this padding fits (it is what append()
    // checks first).
    void check_step(std::size_t n, const step_padding& padding) const {
        if (!padding.real.empty() && padding.real.size() != batch()) detail::throw_real_count(padding.real.size(), batch());
        for (std::size_t b = 0; b < batch(); ++b) {
            const std::size_t real = real_rows(b, n, padding);
            if (real > n) detail::throw_real_rows(real, n);
            if (real > capacity() - lengths_[b]) detail::throw_cache_full(lengths_[b], real, capacity());
        }
    }

private:
    static std::size_t real_rows(std::size_t b, std::size_t n, const step_padding& padding) {
        return padding.real.empty() ? n : padding.real[b];
    }
    static std::size_t first_real_row(std::size_t b, std::size_t n, const step_padding& padding) {
        return padding.side == padding_side::left ? n - real_rows(b, n, padding) : 0;
    }

    tensor<T, Batch, KvHeads, Seq, Head> keys_;
    tensor<T, Batch, KvHeads, Seq, ValueHead> values_;
    std::vector<std::size_t> lengths_;
    std::size_t size_ = 0;
    tensor<T, Batch, KvHeads, Seq, Head> step_keys_;          // a padded step's keys and values,
    tensor<T, Batch, KvHeads, Seq, ValueHead> step_values_;  // kept for their memory
};

}  // namespace dimsum::nn
