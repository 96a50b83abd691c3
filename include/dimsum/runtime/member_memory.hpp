#pragma once
// What a thread keeps from one kernel to the next (scratch, the tables of fused passes), held
// per member of a parallel loop rather than per thread, so that the caller can take every
// member's memory before it hands out any work (thread_team.hpp): a failed allocation then
// throws on the caller before anything is written, and a formula evaluated again allocates
// nothing, whichever workers happen to take part.
//
// member_local<S>() is the S of the member the calling thread is now: a worker of the team is
// its own member; the caller, while it prepares the members of a loop, is each in turn
// (as_member); any other thread is itself.

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

namespace dimsum::runtime {

class member_memory {
public:
    template <class S>
    S& get() {
        static const std::size_t key = next_key().fetch_add(1);
        if (key >= slots_.size()) slots_.resize(key + 1);
        auto& slot = slots_[key];
        if (!slot) slot = held(new S(), eraser{[](void* p) { delete static_cast<S*>(p); }});
        return *static_cast<S*>(slot.get());
    }

private:
    struct eraser {
        void (*erase)(void*) = nullptr;
        void operator()(void* p) const { erase(p); }
    };
    using held = std::unique_ptr<void, eraser>;
    static std::atomic<std::size_t>& next_key() {
        static std::atomic<std::size_t> key{0};
        return key;
    }
    std::vector<held> slots_;
};

namespace detail {
inline member_memory*& current_member() {
    thread_local member_memory* current = nullptr;  // null: the thread's own
    return current;
}
inline member_memory& own_member_memory() {
    thread_local member_memory memory;
    return memory;
}
}  // namespace detail

template <class S>
S& member_local() {
    member_memory* current = detail::current_member();
    return (current ? *current : detail::own_member_memory()).get<S>();
}

// Runs f() with the calling thread acting as `member` (see the top of this file).
template <class F>
void as_member(member_memory& member, F&& f) {
    member_memory*& current = detail::current_member();
    member_memory* const was = current;
    current = &member;
    struct restore {
        member_memory*& current;
        member_memory* was;
        ~restore() { current = was; }
    } back{current, was};
    f();
}

}  // namespace dimsum::runtime
