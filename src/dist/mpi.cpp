// dimsum::dist's MPI calls (include/dimsum/dist/group.hpp), the one file that includes <mpi.h>.
// Every failure becomes an exception naming the call and MPI's message; counts beyond an int
// are sent in pieces.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "dimsum/dist/group.hpp"

namespace dimsum::dist {

namespace {

MPI_Comm comm_of(int handle) { return MPI_Comm_f2c(handle); }

MPI_Datatype mpi_type(detail::number_type type) {
    switch (type) {
        case detail::number_type::float32: return MPI_FLOAT;
        case detail::number_type::float64: return MPI_DOUBLE;
        case detail::number_type::bf16: return MPI_UINT16_T;  // the bits; summed by add_bf16
    }
    return MPI_DATATYPE_NULL;
}
std::size_t bytes_of(detail::number_type type) {
    switch (type) {
        case detail::number_type::float32: return 4;
        case detail::number_type::float64: return 8;
        case detail::number_type::bf16: return 2;
    }
    return 0;
}

// MPI has no bf16: its sum is a user operation, each pair added in float and rounded.
void add_bf16(void* in, void* in_out, int* length, MPI_Datatype*) {
    const auto* a = static_cast<const bf16*>(in);
    auto* b = static_cast<bf16*>(in_out);
    for (int i = 0; i < *length; ++i) b[i] = bf16(static_cast<float>(a[i]) + static_cast<float>(b[i]));
}

// The sum of a number type: MPI's own, or (bf16) the user operation, created on first use
// (after MPI_Init; one thread calls MPI) and kept until MPI_Finalize.
MPI_Op sum_of(detail::number_type type) {
    if (type != detail::number_type::bf16) return MPI_SUM;
    static MPI_Op bf16_sum = [] {
        MPI_Op op;
        if (MPI_Op_create(&add_bf16, 1, &op) != MPI_SUCCESS) throw std::runtime_error("dimsum: dist: MPI_Op_create failed");
        return op;
    }();
    return bf16_sum;
}

void check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw std::runtime_error(std::string("dimsum: dist: ") + call + " failed: " + std::string(text, length));
}

// The largest count one MPI call takes.
constexpr std::size_t max_count = INT_MAX;

}  // namespace

session::session(int& argc, char**& argv) {
    if (detail::initialised()) return;
    int provided = 0;
    check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    owns_ = true;
    // Errors come back as codes, which check() turns into exceptions, instead of ending the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

session::~session() {
    if (owns_) MPI_Finalize();
}

namespace detail {

bool initialised() {
    int flag = 0;
    MPI_Initialized(&flag);
    return flag != 0;
}

int world_communicator() {
    if (!initialised()) throw std::logic_error("dimsum: dist: MPI is not initialised: make a dist::session first");
    return MPI_Comm_c2f(MPI_COMM_WORLD);
}

int rank_of(int communicator) {
    int rank = 0;
    check(MPI_Comm_rank(comm_of(communicator), &rank), "MPI_Comm_rank");
    return rank;
}

int size_of(int communicator) {
    int size = 0;
    check(MPI_Comm_size(comm_of(communicator), &size), "MPI_Comm_size");
    return size;
}

void check_same_count(int communicator, std::size_t count, std::string_view op) {
    // the smallest and the largest count over the ranks, in one call: min(count), min(-count)
    const auto value = static_cast<std::int64_t>(std::min<std::size_t>(count, INT64_MAX));
    std::int64_t mine[2] = {value, -value}, all[2] = {0, 0};
    check(MPI_Allreduce(mine, all, 2, MPI_INT64_T, MPI_MIN, comm_of(communicator)), "MPI_Allreduce");
    if (all[0] != -all[1]) {
        throw shape_error("dimsum: " + std::string(op) + ": the ranks pass different sizes (from " +
                          std::to_string(all[0]) + " to " + std::to_string(-all[1]) + " elements; this rank " +
                          std::to_string(count) + ")");
    }
}

void all_reduce_sum(int communicator, void* data, std::size_t count, number_type type) {
    auto* bytes = static_cast<char*>(data);
    for (std::size_t done = 0; done < count;) {
        const std::size_t part = std::min(count - done, max_count);
        check(MPI_Allreduce(MPI_IN_PLACE, bytes + done * bytes_of(type), static_cast<int>(part), mpi_type(type), sum_of(type),
                            comm_of(communicator)),
              "MPI_Allreduce");
        done += part;
    }
}

int start_all_reduce_sum(int communicator, void* data, std::size_t count, number_type type) {
    if (count > max_count) throw shape_error("dimsum: all_reduce_start: more than INT_MAX elements: use all_reduce");
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), mpi_type(type), sum_of(type), comm_of(communicator),
                         &request),
          "MPI_Iallreduce");
    return MPI_Request_c2f(request);
}

void wait(int request) {
    MPI_Request r = MPI_Request_f2c(request);
    check(MPI_Wait(&r, MPI_STATUS_IGNORE), "MPI_Wait");
}

void all_gather(int communicator, const void* local, void* all, std::size_t count, number_type type) {
    if (count > max_count) throw shape_error("dimsum: all_gather: more than INT_MAX elements per rank");
    check(MPI_Allgather(local, static_cast<int>(count), mpi_type(type), all, static_cast<int>(count), mpi_type(type),
                        comm_of(communicator)),
          "MPI_Allgather");
}

void reduce_scatter_sum(int communicator, const void* all, void* local, std::size_t count, number_type type) {
    if (count > max_count) throw shape_error("dimsum: reduce_scatter: more than INT_MAX elements per rank");
    check(MPI_Reduce_scatter_block(all, local, static_cast<int>(count), mpi_type(type), sum_of(type),
                                   comm_of(communicator)),
          "MPI_Reduce_scatter_block");
}

void barrier(int communicator) { check(MPI_Barrier(comm_of(communicator)), "MPI_Barrier"); }

void idle_barrier(int communicator) {
    MPI_Request request;
    check(MPI_Ibarrier(comm_of(communicator), &request), "MPI_Ibarrier");
    for (int done = 0;;) {
        check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) return;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

void abort(int communicator, const std::string& message) noexcept {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    MPI_Abort(comm_of(communicator), 1);
    std::abort();  // MPI_Abort does not return; should it, end this process at least
}

}  // namespace detail

}  // namespace dimsum::dist
