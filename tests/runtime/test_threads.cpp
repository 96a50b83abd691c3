// Threads: how many by default (from each source, faked), and the thread team that runs the
// kernels' parallel loops: every chunk exactly once, helpers that fail to prepare, nested
// loops, callers inside the user's OpenMP region and on several threads of the user's own.
#include <dimsum/dimsum.hpp>
#include <dimsum/backend/cpu/threads.hpp>

#include <omp.h>

#include <atomic>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "support.hpp"

namespace ds = dimsum;

namespace {

using M = ds::axis<"m">;
using K = ds::axis<"k">;
using N = ds::axis<"n">;

ds::runtime::cpu_sources machine(int affinity, int online) {
    ds::runtime::cpu_sources s;
    s.affinity = affinity;
    s.online = online;
    return s;
}

}  // namespace

TEST_CASE("the default thread count: the affinity mask, the cgroup quota, OMP_NUM_THREADS, MPI ranks") {
    using ds::runtime::default_thread_count;
    // the CPUs this process may use, not the machine's
    REQUIRE(default_thread_count(machine(16, 16)) == 16);
    REQUIRE(default_thread_count(machine(3, 16)) == 3);  // taskset -c 0-2
    REQUIRE(default_thread_count(machine(0, 8)) == 8);   // no mask known: the machine
    REQUIRE(default_thread_count(machine(0, 0)) == 1);
    // a cgroup quota, rounded up; the smallest of the process's cgroup and its ancestors
    auto limited = machine(16, 16);
    limited.quotas = {"max 100000", "150000 100000"};  // v2: no limit here, 1.5 CPUs above
    REQUIRE(default_thread_count(limited) == 2);
    limited.quotas = {"400000 100000", "200000 100000"};
    REQUIRE(default_thread_count(limited) == 2);
    limited.quotas = {"50000 100000"};  // half a CPU: one thread
    REQUIRE(default_thread_count(limited) == 1);
    limited.quotas = {"-1 100000"};  // v1: no limit
    REQUIRE(default_thread_count(limited) == 16);
    limited.quotas = {"garbage", "", "max"};  // unreadable or malformed: no limit
    REQUIRE(default_thread_count(limited) == 16);
    auto small_mask = machine(2, 16);
    small_mask.quotas = {"800000 100000"};  // the mask is smaller than the quota
    REQUIRE(default_thread_count(small_mask) == 2);
    // OMP_NUM_THREADS wins over all of these (its first value, as OpenMP reads a list)
    auto omp = limited;
    omp.omp_num_threads = "3,2";
    REQUIRE(default_thread_count(omp) == 3);
    omp.omp_num_threads = "0";  // not a count: ignored
    REQUIRE(default_thread_count(omp) == 16);
    // MPI ranks on one node that all see the whole machine divide it; ranks bound to their
    // own CPUs already see only those
    auto ranks = machine(16, 16);
    ranks.local_ranks = "4";
    REQUIRE(default_thread_count(ranks) == 4);
    ranks.local_ranks = "32";
    REQUIRE(default_thread_count(ranks) == 1);
    auto bound = machine(1, 16);
    bound.local_ranks = "4";
    REQUIRE(default_thread_count(bound) == 1);
    auto bound_wide = machine(4, 16);
    bound_wide.local_ranks = "4";
    REQUIRE(default_thread_count(bound_wide) == 4);
}

TEST_CASE("the default thread count of this process is within its affinity mask") {
    const auto sources = ds::runtime::this_process_cpu_sources();
    REQUIRE(sources.affinity >= 1);
    REQUIRE(ds::default_num_threads() >= 1);
    if (sources.omp_num_threads.empty()) REQUIRE(ds::default_num_threads() <= sources.affinity);
    // set_num_threads wins, and 0 returns to the default
    ds::set_num_threads(5);
    REQUIRE(ds::num_threads() == 5);
    ds::set_num_threads(0);
    REQUIRE(ds::num_threads() == ds::default_num_threads());
}

TEST_CASE("a parallel loop runs every index exactly once, whatever the threads and the count") {
    for (int threads : {1, 2, 3, 4, 7}) {
        for (std::size_t count : {0, 1, 2, 3, 17, 64, 1000}) {
            std::vector<std::atomic<int>> seen(count);
            std::atomic<int> prepared{0}, empty_ranges{0};
            ds::backend::cpu::split_range(threads, count, [&] { ++prepared; }, [&](std::size_t first, std::size_t last) {
                if (first >= last) ++empty_ranges;  // (Catch2's assertions are for the test's own thread)
                for (std::size_t i = first; i < last; ++i) ++seen[i];
            });
            INFO("threads " << threads << ", count " << count);
            REQUIRE(empty_ranges.load() == (count == 0 ? 1 : 0));
            for (auto& s : seen) REQUIRE(s.load() == 1);
            REQUIRE(prepared.load() >= 1);
            REQUIRE(prepared.load() <= threads);
        }
    }
}

TEST_CASE("on 2 threads, the caller's chunks come first and the worker's last, each a contiguous range") {
    auto& team = ds::runtime::thread_team::instance();
    for (int trial = 0; trial < 20; ++trial) {
        constexpr std::size_t chunks = 64;
        std::vector<std::thread::id> ran_by(chunks);
        const auto caller = std::this_thread::get_id();
        auto prepare = [](std::size_t) {};
        auto chunk = [&](std::size_t c) { ran_by[c] = std::this_thread::get_id(); };
        if (!team.run(1, chunks, prepare, chunk)) continue;  // the team could not start: nothing to see
        // the caller claims from the front, the worker from the back: one boundary at most
        std::size_t boundary = 0;
        while (boundary < chunks && ran_by[boundary] == caller) ++boundary;
        for (std::size_t c = boundary; c < chunks; ++c) REQUIRE(ran_by[c] != caller);
    }
}

TEST_CASE("a loop inside a loop runs on its own thread, and the team is lent to one caller at a time") {
    const auto loops_before = ds::runtime::thread_team::instance().loops_run();
    std::atomic<int> inner_threads_seen{0}, inner_sum{0};
    ds::backend::cpu::split_range(2, 8, [] {}, [&](std::size_t first, std::size_t last) {
        for (std::size_t i = first; i < last; ++i) {
            if (ds::num_threads() == 1) ++inner_threads_seen;
            ds::backend::cpu::split_range(2, 10, [] {}, [&](std::size_t f, std::size_t l) { inner_sum += int(l - f); });
        }
    });
    REQUIRE(inner_threads_seen.load() == 8);
    REQUIRE(inner_sum.load() == 80);
    REQUIRE(ds::runtime::thread_team::instance().loops_run() - loops_before <= 1);  // the inner ones ran alone
}

TEST_CASE("an evaluation inside the user's OpenMP parallel region runs on its calling thread, with the same result") {
    ds::tensor<float, M, K> a(M{300}, K{256});
    ds::tensor<float, K, N> b(K{256}, N{200});
    ds::fill_uniform(a, 1);
    ds::fill_uniform(b, 2);
    auto formula = ds::softmax(ds::tanh(ds::matmul(a, b)) * 2.0f);
    ds::set_num_threads(2);
    auto want = ds::eval(formula);
    std::vector<ds::tensor<float, M, N>> got;
    for (int i = 0; i < 4; ++i) got.emplace_back(M{300}, N{200});
    int inner_threads[4] = {0, 0, 0, 0};
    const auto loops_before = ds::runtime::thread_team::instance().loops_run();
#pragma omp parallel for num_threads(2)
    for (int i = 0; i < 4; ++i) {
        inner_threads[i] = ds::num_threads();
        ds::assign(got[std::size_t(i)], formula);
    }
    REQUIRE(ds::runtime::thread_team::instance().loops_run() == loops_before);  // no team started
    for (int i = 0; i < 4; ++i) {
        REQUIRE(inner_threads[i] == 1);
        REQUIRE(std::equal(want.data(), want.data() + want.size(), got[std::size_t(i)].data()));
    }
    ds::set_num_threads(0);
}

TEST_CASE("one formula evaluated at once from 4 threads of the user gives each the same result") {
    ds::tensor<float, M, K> a(M{257}, K{129});
    ds::tensor<float, K, N> b(K{129}, N{300});
    ds::tensor<float, N> bias(N{300});
    ds::fill_uniform(a, 3);
    ds::fill_uniform(b, 4);
    ds::fill_uniform(bias, 5);
    auto formula = ds::layer_norm(ds::matmul(a, b) + bias);
    const auto want = ds::eval(formula, ds::backend::reference::evaluator{});
    for (int threads : {1, 2}) {
        ds::set_num_threads(threads);
        std::vector<ds::tensor<float, M, N>> got;
        for (int i = 0; i < 4; ++i) got.emplace_back(M{257}, N{300});
        std::vector<std::thread> users;
        for (int i = 0; i < 4; ++i) {
            users.emplace_back([&, i] {
                for (int round = 0; round < 5; ++round) ds::assign(got[std::size_t(i)], formula);
            });
        }
        for (auto& u : users) u.join();
        for (const auto& g : got) test::require_close(g, test::to_xt(want), 1e-4, 1e-5);
    }
    ds::set_num_threads(0);
}

TEST_CASE("release_workspace frees the team's scratch and the next evaluation is as good") {
    ds::tensor<float, M, K> a(M{200}, K{300});
    ds::tensor<float, K, N> b(K{300}, N{250});
    ds::fill_uniform(a, 6);
    ds::fill_uniform(b, 7);
    ds::set_num_threads(2);
    auto first = ds::eval(ds::matmul(a, b));
    ds::release_workspace();
    auto second = ds::eval(ds::matmul(a, b));
    REQUIRE(std::equal(first.data(), first.data() + first.size(), second.data()));
    ds::set_num_threads(0);
}
