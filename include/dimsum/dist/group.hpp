#pragma once
// Tensor parallelism over MPI, part 1: a process group, the part of a split each rank owns, and
// the collectives of dimsum tensors (sum all-reduce, all-gather and reduce-scatter along a named
// axis). Every call goes to the dimsum::dist library (src/dist/mpi.cpp), the one place that
// includes <mpi.h>: this header names MPI only through a communicator handle, the int that
// MPI_Comm_c2f gives, so a program that includes it needs no MPI compiler wrapper.
//
// A collective is a call that every rank of the group makes, in the same order. Each checks
// first, with one small all-reduce, that every rank passes the same shape, and throws the same
// shape_error on every rank if not: no rank is left waiting for a call another rank skipped.

#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dimsum/backend/default.hpp"
#include "dimsum/core/shape_error.hpp"
#include "dimsum/ops/view.hpp"
#include "dimsum/tensor/tensor.hpp"
#include "dimsum/tensor/tensor_view.hpp"

namespace dimsum::dist {

namespace detail {

// bf16 travels as bf16 (half float's bytes) and sums as float, rounded at each step of the
// reduction, as NCCL's bf16 all-reduce does.
enum class number_type { float32, float64, bf16 };
template <class T>
constexpr number_type number_type_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>,
                  "dimsum: dist: the collectives take float, double and bf16 tensors");
    return std::is_same_v<T, float> ? number_type::float32 : std::is_same_v<T, double> ? number_type::float64
                                                                                        : number_type::bf16;
}

// src/dist/mpi.cpp: MPI calls on plain memory. `communicator` is an MPI_Fint handle.
int world_communicator();
int rank_of(int communicator);
int size_of(int communicator);
bool initialised();
// Throws the same shape_error on every rank unless every rank passed the same count.
void check_same_count(int communicator, std::size_t count, std::string_view op);
void all_reduce_sum(int communicator, void* data, std::size_t count, number_type type);
int start_all_reduce_sum(int communicator, void* data, std::size_t count, number_type type);  // a request handle
void wait(int request);
void all_gather(int communicator, const void* local, void* all, std::size_t count, number_type type);
void reduce_scatter_sum(int communicator, const void* all, void* local, std::size_t count, number_type type);
[[noreturn]] void abort(int communicator, const std::string& message) noexcept;
void barrier(int communicator);
void idle_barrier(int communicator);

}  // namespace detail

// MPI for the life of the object: MPI_Init_thread (MPI_THREAD_FUNNELED: only the thread that
// made the session calls MPI; OpenMP teams inside a rank are fine) and MPI_Finalize. Nothing
// when the program initialised MPI itself.
class session {
public:
    session(int& argc, char**& argv);
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

private:
    bool owns_ = false;
};

// The positions [first, first + count) of a split that one rank owns.
struct share {
    std::size_t first = 0, count = 0;
};

// A group of processes: an MPI communicator, seen by rank and size.
class group {
public:
    // Every process of the MPI job (MPI_COMM_WORLD).
    static group world() { return group(detail::world_communicator()); }
    // Any communicator, by its handle: dist::group(MPI_Comm_c2f(comm)).
    explicit group(int communicator) : communicator_(communicator) {}

    int rank() const { return detail::rank_of(communicator_); }
    int size() const { return detail::size_of(communicator_); }
    int handle() const { return communicator_; }

    // The part of `total` items (heads, hidden units) that this rank owns: total / size()
    // consecutive ones, rank r the r-th part. A size that does not divide total is a
    // shape_error, the same on every rank, e.g. `dimsum: dist: 12 heads do not split over 5
    // ranks`.
    share split(std::size_t total, std::string_view what) const {
        const auto ranks = static_cast<std::size_t>(size());
        if (total % ranks != 0) {
            throw shape_error("dimsum: dist: " + std::to_string(total) + " " + std::string(what) + " do not split over " +
                              std::to_string(ranks) + " ranks");
        }
        const std::size_t each = total / ranks;
        return {static_cast<std::size_t>(rank()) * each, each};
    }

    // Waits until every rank of the group has called it.
    void barrier() const { detail::barrier(communicator_); }
    // The same, sleeping between checks instead of spinning as MPI does: a rank with nothing
    // to do leaves its core to the others.
    void idle_barrier() const { detail::idle_barrier(communicator_); }

private:
    int communicator_;
};

// Runs f on this rank and returns what it returns. An exception that escapes f is written to
// the standard error with the rank (`dimsum: rank 1 of 2: ...`), and then every rank of the
// group ends with MPI_Abort: a rank that failed never leaves the others waiting in a
// collective it will not reach.
template <class F>
decltype(auto) run_or_abort(const group& g, F&& f) {
    try {
        return f();
    } catch (const std::exception& e) {
        detail::abort(g.handle(), "dimsum: rank " + std::to_string(g.rank()) + " of " + std::to_string(g.size()) + ": " +
                                      e.what());
    } catch (...) {
        detail::abort(g.handle(), "dimsum: rank " + std::to_string(g.rank()) + " of " + std::to_string(g.size()) +
                                      ": an exception that is not a std::exception");
    }
}

namespace detail {

// Contiguous memory of a view: its own, or a copy (`staged`) that the caller writes back.
template <class T, axis_type... A>
T* contiguous(const tensor_view<T, A...>& x, tensor<std::remove_const_t<T>, A...>& staged) {
    if (x.is_contiguous()) return x.data();
    staged = tensor<std::remove_const_t<T>, A...>(x.shape());
    assign(staged, x);
    return staged.data();
}

// Per thread and type: the staging memory of all_gather and reduce_scatter, kept between calls.
template <class T>
std::vector<T>& staging() {
    thread_local std::vector<T> memory;
    return memory;
}

}  // namespace detail

// x = the sum of every rank's x, element by element, in place. Every rank passes x of the same
// extents.
template <class T, axis_type... A>
void all_reduce(const group& g, const tensor_view<T, A...>& x) {
    static_assert(!std::is_const_v<T>, "dimsum: all_reduce writes x: give it a writable tensor or view");
    detail::check_same_count(g.handle(), x.size(), "all_reduce");
    tensor<T, A...> staged;
    T* data = detail::contiguous(x, staged);
    detail::all_reduce_sum(g.handle(), data, x.size(), detail::number_type_of<T>());
    if (data != x.data()) assign(x, staged);
}
template <class T, axis_type... A>
void all_reduce(const group& g, tensor<T, A...>& x) {
    all_reduce(g, x.view());
}

// An all-reduce under way (all_reduce_start): the sum is in x once wait() returns. Work that
// does not touch x may run in between; the destructor waits if wait() was not called.
class pending {
public:
    pending() = default;
    explicit pending(int request) : request_(request), active_(true) {}
    pending(pending&& other) noexcept : request_(other.request_), active_(other.active_) { other.active_ = false; }
    pending& operator=(pending&& other) noexcept {
        if (this != &other) {
            finish();
            request_ = other.request_;
            active_ = other.active_;
            other.active_ = false;
        }
        return *this;
    }
    ~pending() { finish(); }
    void wait() {
        if (active_) {
            active_ = false;
            detail::wait(request_);
        }
    }

private:
    void finish() noexcept {
        if (!active_) return;
        active_ = false;
        try {
            detail::wait(request_);
        } catch (...) {  // a destructor must not throw; wait() reports the error to a caller who asks
        }
    }
    int request_ = 0;
    bool active_ = false;
};

// The same all-reduce, started: it runs while the caller does other work, and x holds the sum
// after wait(). x must be contiguous and must not be read or written before then.
template <class T, axis_type... A>
[[nodiscard]] pending all_reduce_start(const group& g, const tensor_view<T, A...>& x) {
    static_assert(!std::is_const_v<T>, "dimsum: all_reduce_start writes x: give it a writable tensor or view");
    if (!x.is_contiguous()) throw shape_error("dimsum: all_reduce_start: x must be contiguous (a tensor, or a view of one whole)");
    detail::check_same_count(g.handle(), x.size(), "all_reduce_start");
    return pending(detail::start_all_reduce_sum(g.handle(), x.data(), x.size(), detail::number_type_of<T>()));
}
template <class T, axis_type... A>
[[nodiscard]] pending all_reduce_start(const group& g, tensor<T, A...>& x) {
    return all_reduce_start(g, x.view());
}

// out = every rank's `local` joined along Axis, rank 0's first: out's Axis has size() times
// local's extent, its other axes local's.
template <axis_type Axis, class T, class U, axis_type... A, axis_type... B>
void all_gather(const group& g, const tensor_view<U, A...>& local, const tensor_view<T, B...>& out) {
    constexpr auto found = ::dimsum::detail::find_axis<shape<A...>>("all_gather", describe_axis<Axis>);
    static_assert(found.error.length == 0, "dimsum: all_gather: local has no axis named like Axis");
    constexpr std::size_t axis = found.position;
    const std::size_t ranks = static_cast<std::size_t>(g.size()), count = local.size(), n = local.extent(axis);
    if (out.extent(axis) != n * ranks || out.size() != count * ranks) {
        throw shape_error("dimsum: all_gather: out's " + std::string(describe_axis<Axis>.name) + " must be " +
                          std::to_string(ranks) + " x " + std::to_string(n) + " and its other axes local's");
    }
    detail::check_same_count(g.handle(), count, "all_gather");
    std::vector<T>& all = detail::staging<T>();
    all.resize(count * ranks);
    tensor<T, A...> staged;
    const T* mine = detail::contiguous(tensor_view<const T, A...>(local), staged);
    detail::all_gather(g.handle(), mine, all.data(), count, detail::number_type_of<T>());
    for (std::size_t r = 0; r < ranks; ++r) {
        assign(slice<Axis>(out, r * n, (r + 1) * n), tensor_view<const T, A...>(all.data() + r * count, local.shape()));
    }
}

// out = the sum over ranks of part `rank` of `in`, cut into size() equal parts along Axis:
// out's Axis has in's extent / size(), its other axes in's.
template <axis_type Axis, class T, class U, axis_type... A, axis_type... B>
void reduce_scatter(const group& g, const tensor_view<U, A...>& in, const tensor_view<T, B...>& out) {
    constexpr auto found = ::dimsum::detail::find_axis<shape<B...>>("reduce_scatter", describe_axis<Axis>);
    static_assert(found.error.length == 0, "dimsum: reduce_scatter: out has no axis named like Axis");
    constexpr std::size_t axis = found.position;
    const std::size_t ranks = static_cast<std::size_t>(g.size()), count = out.size(), n = out.extent(axis);
    if (in.extent(axis) != n * ranks || in.size() != count * ranks) {
        throw shape_error("dimsum: reduce_scatter: in's " + std::string(describe_axis<Axis>.name) + " must be " +
                          std::to_string(ranks) + " x out's " + std::to_string(n) + ", its other axes out's");
    }
    detail::check_same_count(g.handle(), in.size(), "reduce_scatter");
    std::vector<T>& all = detail::staging<T>();
    all.resize(count * ranks);
    for (std::size_t r = 0; r < ranks; ++r) {  // part r, contiguous, where MPI expects it
        assign(tensor_view<T, B...>(all.data() + r * count, out.shape()), slice<Axis>(in, r * n, (r + 1) * n));
    }
    tensor<T, B...> staged;
    T* mine = detail::contiguous(out, staged);
    detail::reduce_scatter_sum(g.handle(), all.data(), mine, count, detail::number_type_of<T>());
    if (mine != out.data()) assign(out, staged);
}

}  // namespace dimsum::dist
