#pragma once
// A tape: the forward of a model of several formulas, evaluated one after another, and one
// call for the gradients of every parameter through all of them.
//
//   ds::tape<float> tape;
//   auto x1 = tape.eval(layer(p.layer_0, x0));   // evaluated now, its formula recorded
//   auto x2 = tape.eval(layer(p.layer_1, x1));   // reads the tape's x1 (a view of it)
//   double loss = tape.backward(loss_of(p, x2), std::tie(x0, p), std::tie(dx0, g));
//
// backward differentiates the loss, then each recorded formula from the last, each from the
// gradient of what it computed (ds::backward_from): one program each, in which the steps of
// its forward that its gradients read are computed again. So the tape keeps only what each
// formula computed (the checkpoints between layers), never a layer's inner activations, at the
// cost of a second forward. A tensor read by several formulas (a residual stream, a weight
// shared by two layers) gets the sum of their gradients.
//
// The tape owns the tensors eval returns views of, and their gradients; backward ends the
// step, and the next step's evaluations reuse that memory (the same formulas in the same order
// allocate nothing after the first step). A view eval returned holds the next step's value
// once that step evaluates it again.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "dimsum/backend/default.hpp"
#include "dimsum/nn/gradients.hpp"
#include "dimsum/ops/cast.hpp"

namespace dimsum {

// T: the element type of every formula recorded (float, double or bf16); the gradients are of
// the type the formulas compute in (float for bf16: a bf16 model's values are held in bf16 and
// its gradients computed and kept in float). Backend: what evaluates the formulas and their
// gradients (the CPU backend, the reference backend, or the CUDA backend, which copies the
// tape's host tensors to the device at each evaluation).
template <class T, class Backend = default_backend>
class tape {
    static_assert(evaluable_element<T>, "dimsum: tape: of float, double or bf16");
    using G = compute_type_t<T>;  // the gradients' element type

public:
    tape() = default;
    explicit tape(Backend backend) : backend_(backend) {}
    // backward differentiates with `options` (gradient_options: .bf16_products)
    explicit tape(gradient_options options, Backend backend = {}) : backend_(backend), options_(options) {}
    tape(const tape&) = delete;  // the recorded formulas read the tape's own tensors
    tape& operator=(const tape&) = delete;

    // Evaluates `formula` (of T) into a tensor the tape owns, and records the formula for
    // backward; returns a view of that tensor, which later formulas read (a view, so that
    // `auto x = tape.eval(f)` still reads the tape's memory: a copy would not lead back to f).
    // The tensors the formula reads must keep their values until backward: the recorded
    // formula is evaluated again there.
    template <operand F>
    view_of_shape_t<const T, shape_of<F>> eval(F&& formula) {
        static_assert(std::is_same_v<value_type_of<F>, T>, "dimsum: tape: a formula of the tape's element type");
        static_assert(!is_tensor<std::remove_cvref_t<F>>::value && !is_tensor_view<std::remove_cvref_t<F>>::value,
                      "dimsum: tape: record a formula; a tensor needs no evaluating (pass it to backward to get its gradient)");
        using recorded = record<std::remove_cvref_t<F>>;
        if (count_ == records_.size()) records_.push_back(nullptr);
        auto* r = dynamic_cast<recorded*>(records_[count_].get());
        if (r == nullptr) {  // a formula of another type than this step's last: new memory
            records_[count_] = std::make_unique<recorded>();
            r = static_cast<recorded*>(records_[count_].get());
        }
        r->formula.emplace(std::forward<F>(formula));
        if (r->value.shape().extents() != r->formula->shape().extents()) {
            r->value = typename recorded::value_type(r->formula->shape());
            r->gradient = typename recorded::gradient_type();  // of the new extents when backward needs it
        }
        evaluation::assign_with(backend_, r->value.view(), *r->formula);
        ++count_;
        return std::as_const(r->value).view();
    }

    // grads := the gradient of `loss` (a formula of no axes, of T or of the type T computes
    // in, which may read the tensors eval returned) with respect to each tensor of `params`,
    // through every formula recorded since the last backward: a parameter struct, a tensor, or
    // a std::tuple of them (std::tie(x0, params)), as for ds::backward, the gradients of the
    // type T computes in (a float struct for a bf16 model's); a parameter nothing reads gets
    // zeros. Returns the loss's value and ends the step: the records are dropped, the memory kept.
    template <class Loss, class Params, class Grads>
    G backward(const Loss& loss, const Params& params, Grads&& grads) {
        static_assert(shape_of<Loss>::rank == 0, "dimsum: tape::backward: the loss must be a formula of no axes (a scalar): sum it");
        static_assert(std::is_same_v<value_type_of<Loss>, T> || std::is_same_v<value_type_of<Loss>, G>,
                      "dimsum: tape::backward: a loss of the tape's element type, or of the type it computes in");
        struct end_of_step {  // on success or an exception alike
            tape& t;
            ~end_of_step() { t.clear(); }
        } ending{*this};
        detail::match_gradients(loss, params, grads, state_, "tape::backward");
        wanted_.clear();
        for (std::size_t i = 0; i < state_.wrt.size(); ++i) {
            wanted_.push_back({state_.wrt[i], state_.destinations[i], false});
        }
        const std::size_t parameters = wanted_.size();
        for (std::size_t i = 0; i < count_; ++i) {  // each recorded value, its gradient of its extents
            records_[i]->ready_gradient();
            wanted_.push_back(records_[i]->as_wanted());
        }
        for (std::size_t i = 0; i < count_; ++i) {  // no recorded formula may read a gradient it writes
            for (std::size_t w = 0; w < parameters; ++w) {
                if (records_[i]->reads(memory_of(wanted_[w].destination))) {
                    throw std::invalid_argument("dimsum: tape::backward: a gradient overlaps memory a recorded formula reads");
                }
            }
        }
        G value{};
        contribute(loss, expr::scalar<G>{1, {}}, parameters + count_, &value);
        for (std::size_t i = count_; i-- > 0;) {
            // a value nothing after it read (its gradient never written) contributes nothing
            if (wanted_[parameters + i].written) records_[i]->backward(*this, parameters + i);
        }
        for (std::size_t w = 0; w < parameters; ++w) {
            if (!wanted_[w].written) fill_zeros(wanted_[w].destination);
        }
        return value;
    }

    // Drops the records without a backward (an evaluation that needs no gradient); the memory
    // stays for the next step.
    void clear() {
        for (std::size_t i = 0; i < count_; ++i) records_[i]->drop_formula();
        count_ = 0;
    }

    // The formulas recorded since the last backward or clear.
    std::size_t size() const { return count_; }

private:
    // A tensor differentiated with respect to: a parameter, or a value the tape recorded.
    struct wanted {
        detail::differentiated leaf;
        evaluation::strided<G> destination;  // its gradient's memory, contiguous
        bool written;                        // whether a program has written its gradient yet
    };

    struct record_base {
        virtual ~record_base() = default;
        virtual bool reads(const evaluation::byte_range& memory) const = 0;
        virtual void ready_gradient() = 0;
        virtual wanted as_wanted() = 0;
        virtual void backward(tape& t, std::size_t self) const = 0;
        virtual void drop_formula() = 0;
    };

    template <class F>
    struct record final : record_base {
        using value_type = tensor_of_shape_t<T, shape_of<F>>;
        using gradient_type = tensor_of_shape_t<G, shape_of<F>>;
        std::optional<F> formula;
        value_type value;
        gradient_type gradient;

        bool reads(const evaluation::byte_range& memory) const override { return evaluation::reads(*formula, memory); }
        void ready_gradient() override {
            if (gradient.shape().extents() != value.shape().extents()) gradient = gradient_type(value.shape());
        }
        wanted as_wanted() override { return {detail::differentiated_of<G>(value), evaluation::to_strided(gradient.view()), false}; }
        // the gradients its formula passes on, from the gradient of its value (the wanted
        // entries before `self`: the parameters and the values recorded before it)
        void backward(tape& t, std::size_t self) const override { t.contribute(*formula, gradient.view(), self, nullptr); }
        void drop_formula() override { formula.reset(); }
    };

    static evaluation::byte_range memory_of(const evaluation::strided<G>& contiguous) {
        const auto first = reinterpret_cast<std::uintptr_t>(contiguous.data);
        return {first, first + contiguous.size() * sizeof(G)};
    }

    static void fill_zeros(const evaluation::strided<G>& s) { std::fill_n(s.data, s.size(), G{}); }

    // One program: the vector-Jacobian products of `output` for `cotangent` with respect to
    // each of wanted_[0, candidates) that output reads, written into its gradient (the first
    // program to reach it) or added to it (a scratch, then a sum, in the order of the programs:
    // the same bits on any number of threads); and output's value into *value if given.
    template <class Output, class Cotangent>
    void contribute(const Output& output, const Cotangent& cotangent, std::size_t candidates, G* value) {
        read_.clear();
        leaves_.clear();
        for (std::size_t w = 0; w < candidates; ++w) {
            if (evaluation::reads(output, wanted_[w].leaf.memory)) {
                read_.push_back(w);
                leaves_.push_back(wanted_[w].leaf);
            }
        }
        if (read_.empty()) {
            if constexpr (shape_of<Output>::rank == 0) {  // the loss reads nothing differentiated: its value alone
                if (value != nullptr) {
                    if constexpr (std::is_same_v<value_type_of<Output>, G>) evaluation::assign_with(backend_, loss_value_.view(), output);
                    else evaluation::assign_with(backend_, loss_value_.view(), cast<G>(output));
                    *value = loss_value_.data()[0];
                }
            }
            return;
        }
        std::size_t scratch = 0;  // the scratch the gradients to add need, one after another
        for (std::size_t w : read_) scratch += wanted_[w].written ? wanted_[w].destination.size() : 0;
        if (scratch_.size() < scratch) scratch_.resize(scratch);
        destinations_.clear();
        std::size_t at = 0;
        for (std::size_t w : read_) {
            evaluation::strided<G> d = wanted_[w].destination;
            if (wanted_[w].written) {
                d.data = scratch_.data() + at;  // the same contiguous layout, in the scratch
                at += d.size();
            }
            destinations_.push_back(d);
        }
        const evaluation::strided<G> loss_value = evaluation::to_strided(loss_value_.view());
        detail::run_gradients<G>(backend_, output, cotangent, leaves_, destinations_, state_, value ? &loss_value : nullptr, options_);
        if (value) *value = loss_value_.data()[0];
        for (std::size_t i = 0; i < read_.size(); ++i) {
            wanted& w = wanted_[read_[i]];
            if (w.written) {
                const G* add = destinations_[i].data;
                G* sum = w.destination.data;
                for (std::size_t e = 0, n = w.destination.size(); e < n; ++e) sum[e] += add[e];
            }
            w.written = true;
        }
    }

    Backend backend_{};
    gradient_options options_{};
    std::vector<std::unique_ptr<record_base>> records_;  // this step's first count_, then kept for their memory
    std::size_t count_ = 0;
    // backward's, kept for their capacity
    detail::struct_gradients<G> state_;
    std::vector<wanted> wanted_;
    std::vector<std::size_t> read_;
    std::vector<detail::differentiated> leaves_;
    std::vector<evaluation::strided<G>> destinations_;
    std::vector<G> scratch_;
    tensor<G> loss_value_;
};

}  // namespace dimsum
