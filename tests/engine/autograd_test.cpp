// Autograd: record scopes, attach_grad with write/add/null, backward through recorded calls and
// ndarray arithmetic, retain_graph, custom steps, gradients against finite differences, and
// tracing into a symbol.

#include <cmath>
#include <functional>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/autograd.hpp"
#include "engine/nd.hpp"
#include "engine/ndarray.hpp"
#include "engine/trace.hpp"
#include "engine_test_support.hpp"

namespace troupe {
namespace {

ndarray values(std::initializer_list<float> list, shape_vector shape) {
  return ndarray::from_values(list, std::move(shape));
}

std::vector<float> host(const ndarray& array) {
  return array.to_vector<float>();
}

/// Central differences of the scalar `loss(x)` with respect to every element of x, in double.
std::vector<double> numeric_gradient(const std::function<double(const ndarray&)>& loss,
                                     const ndarray& x, double step = 1e-2) {
  std::vector<double> gradient(static_cast<std::size_t>(x.size()));
  for (std::size_t i = 0; i < gradient.size(); ++i) {
    ndarray plus = x.copy();
    ndarray minus = x.copy();
    plus.data<float>()[i] += static_cast<float>(step);
    minus.data<float>()[i] -= static_cast<float>(step);
    gradient[i] = (loss(plus) - loss(minus)) / (2 * step);
  }
  return gradient;
}

void require_close(const std::vector<float>& analytic, const std::vector<double>& numeric,
                   double tolerance) {
  BOOST_REQUIRE_EQUAL(analytic.size(), numeric.size());
  for (std::size_t i = 0; i < analytic.size(); ++i)
    BOOST_TEST(std::abs(analytic[i] - numeric[i]) <= tolerance * (1 + std::abs(numeric[i])),
               "element " << i << ": analytic " << analytic[i] << ", numeric " << numeric[i]);
}

} // namespace

BOOST_AUTO_TEST_SUITE(autograd_tests)

BOOST_AUTO_TEST_CASE(a_recorded_copy_to_another_context_sends_the_gradient_back) {
  auto x = ndarray::from_values({1, 2, 3}, {3}, context::cpu(0));
  x.attach_grad();
  ndarray y;
  {
    autograd::record_scope record;
    y = nd::multiply(nd::copy_to(x, context::cpu(1)), nd::copy_to(x, context::cpu(1)));
  }
  y.backward();
  BOOST_TEST(y.ctx() == context::cpu(1));
  BOOST_TEST(x.grad().ctx() == context::cpu(0));
  BOOST_TEST(x.grad().to_vector<float>() == (std::vector<float>{2, 4, 6}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(product_of_a_value_with_itself_gives_twice_the_value) {
  auto x = values({1, -2, 3}, {3});
  x.attach_grad();
  {
    autograd::record_scope record;
    auto y = x * x + x; // dy/dx = 2x + 1
    y.backward();
  }
  BOOST_TEST(host(x.grad()) == (std::vector<float>{3, -3, 7}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(grad_req_write_overwrites_add_accumulates_null_gets_nothing) {
  auto w = values({1, 2}, {2});
  auto a = values({1, 2}, {2});
  auto n = values({1, 2}, {2});
  w.attach_grad(grad_req::write);
  a.attach_grad(grad_req::add);
  n.attach_grad(grad_req::null);
  for (int round = 0; round < 2; ++round) {
    autograd::record_scope record;
    auto loss = nd::sum(w * 3.0 + a * 5.0 + n);
    loss.backward();
  }
  BOOST_TEST(host(w.grad()) == (std::vector<float>{3, 3}), boost::test_tools::per_element());
  BOOST_TEST(host(a.grad()) == (std::vector<float>{10, 10}), boost::test_tools::per_element());
  BOOST_TEST(n.grad().is_none());
}

BOOST_AUTO_TEST_CASE(outside_a_record_scope_nothing_is_recorded) {
  auto x = values({1, 2}, {2});
  x.attach_grad();
  auto y = x * x;
  test::require_error([&] { y.backward(); }, errc::invalid_argument, "no recorded history");
  {
    autograd::record_scope record;
    ndarray paused;
    {
      autograd::pause_scope pause;
      paused = x * x;
    }
    test::require_error([&] { paused.backward(); }, errc::invalid_argument, "(2,)");
  }
}

BOOST_AUTO_TEST_CASE(a_released_graph_is_an_error_unless_retained) {
  auto x = values({2}, {1});
  x.attach_grad(grad_req::add);
  autograd::record_scope record;
  auto y = nd::square(x);
  y.backward(ndarray{}, true);
  y.backward(); // retained by the first call; releases now
  BOOST_TEST(host(x.grad())[0] == 8.0f);
  test::require_error([&] { y.backward(); }, errc::invalid_argument, "retain_graph");
}

BOOST_AUTO_TEST_CASE(head_gradient_scales_and_must_match_the_head) {
  auto x = values({1, 2}, {2});
  x.attach_grad();
  autograd::record_scope record;
  auto y = x * 4.0;
  y.backward(values({1, 10}, {2}), true);
  BOOST_TEST(host(x.grad()) == (std::vector<float>{4, 40}), boost::test_tools::per_element());
  test::require_error([&] { y.backward(values({1, 2, 3}, {3})); }, errc::shape_mismatch, "(3,)");
}

BOOST_AUTO_TEST_CASE(views_and_detach_carry_no_history) {
  auto x = values({1, 2, 3, 4}, {2, 2});
  x.attach_grad();
  BOOST_TEST(!x.reshape({4}).autograd_state());
  BOOST_TEST(!x.detach().autograd_state());
  BOOST_TEST(x.detach().shares_storage_with(x));
  autograd::record_scope record;
  auto y = nd::sum(nd::reshape(x, {4}) * 2.0);
  y.backward();
  BOOST_TEST(host(x.grad()) == (std::vector<float>{2, 2, 2, 2}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_custom_step_receives_the_output_gradients) {
  auto x = values({1, 2, 3}, {3});
  x.attach_grad();
  autograd::record_scope record;
  ndarray doubled = x.detach() * 2.0; // computed outside the registry
  int calls = 0;
  std::array<ndarray, 1> inputs{x};
  std::array<ndarray, 1> outputs{doubled};
  autograd::record_custom(inputs, outputs,
                          [&](std::span<const ndarray> output_grads, std::span<ndarray> grads) {
                            ++calls;
                            (output_grads[0] * 2.0).copy_to(grads[0]);
                          });
  auto loss = nd::sum(nd::square(outputs[0])); // d/dx Σ (2x)² = 8x
  loss.backward();
  BOOST_TEST(calls == 1);
  BOOST_TEST(host(x.grad()) == (std::vector<float>{8, 16, 24}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(mlp_gradients_match_finite_differences) {
  const auto x = ndarray::random_normal(0, 1, {4, 6}, 1);
  const auto label = values({0, 2, 1, 2}, {4});
  auto w1 = ndarray::random_normal(0, 0.5, {5, 6}, 2);
  auto b1 = ndarray::random_normal(0, 0.5, {5}, 3);
  auto w2 = ndarray::random_normal(0, 0.5, {3, 5}, 4);
  auto b2 = ndarray::random_normal(0, 0.5, {3}, 5);
  const auto loss_of = [&](const ndarray& a, const ndarray& b, const ndarray& c, const ndarray& d) {
    auto hidden = nd::tanh(nd::fully_connected(x, a, b, 5));
    auto logits = nd::fully_connected(nd::sigmoid(hidden) * hidden, c, d, 3);
    return nd::mean(nd::softmax_cross_entropy(logits, label));
  };
  for (auto* p : {&w1, &b1, &w2, &b2})
    p->attach_grad();
  {
    autograd::record_scope record;
    loss_of(w1, b1, w2, b2).backward();
  }
  const auto scalar = [](const ndarray& a) { return a.as_scalar(); };
  require_close(host(w1.grad()),
                numeric_gradient([&](const ndarray& v) { return scalar(loss_of(v, b1, w2, b2)); },
                                 w1.detach()),
                2e-2);
  require_close(host(b1.grad()),
                numeric_gradient([&](const ndarray& v) { return scalar(loss_of(w1, v, w2, b2)); },
                                 b1.detach()),
                2e-2);
  require_close(host(w2.grad()),
                numeric_gradient([&](const ndarray& v) { return scalar(loss_of(w1, b1, v, b2)); },
                                 w2.detach()),
                2e-2);
  require_close(host(b2.grad()),
                numeric_gradient([&](const ndarray& v) { return scalar(loss_of(w1, b1, w2, v)); },
                                 b2.detach()),
                2e-2);
}

BOOST_AUTO_TEST_CASE(conv_pool_gradients_match_finite_differences) {
  const auto x = ndarray::random_normal(0, 1, {2, 2, 6, 6}, 11);
  auto w = ndarray::random_normal(0, 0.5, {3, 2, 3, 3}, 12);
  auto b = ndarray::random_normal(0, 0.5, {3}, 13);
  const auto weights = ndarray::random_normal(0, 1, {2, 3, 3, 3}, 14);
  const auto loss_of = [&](const ndarray& kernel, const ndarray& bias) {
    auto y = nd::relu(nd::convolution(x, kernel, bias, {3, 3}, 3, {1, 1}, {1, 1}));
    auto pooled = nd::pooling(y, {2, 2}, "max", {2, 2});
    return nd::sum(pooled * weights);
  };
  w.attach_grad();
  b.attach_grad();
  {
    autograd::record_scope record;
    loss_of(w, b).backward();
  }
  require_close(host(w.grad()),
                numeric_gradient([&](const ndarray& v) { return loss_of(v, b).as_scalar(); },
                                 w.detach(), 1e-3),
                3e-2);
  require_close(host(b.grad()),
                numeric_gradient([&](const ndarray& v) { return loss_of(w, v).as_scalar(); },
                                 b.detach(), 1e-3),
                3e-2);
}

BOOST_AUTO_TEST_CASE(dropout_drops_only_in_training_mode) {
  const auto x = ndarray::ones({1000});
  {
    autograd::record_scope record(false);
    BOOST_TEST(nd::dropout(x, 0.5).sum() == 1000.0);
  }
  {
    autograd::record_scope record(true);
    const auto y = host(nd::dropout(x, 0.5));
    const auto zeros = std::count(y.begin(), y.end(), 0.0f);
    BOOST_TEST(zeros > 400);
    BOOST_TEST(zeros < 600);
  }
  autograd::training_scope predict(false);
  BOOST_TEST(nd::dropout(x, 0.5).sum() == 1000.0);
}

BOOST_AUTO_TEST_CASE(a_trace_becomes_a_symbol_over_the_marked_variables) {
  auto x = ndarray::random_normal(0, 1, {2, 3}, 21);
  auto w = ndarray::random_normal(0, 1, {4, 3}, 22);
  auto b = ndarray::random_normal(0, 1, {4}, 23);
  trace_scope trace;
  trace.mark_variable(x, "data");
  trace.mark_variable(w, "fc_weight");
  trace.mark_variable(b, "fc_bias");
  auto y = nd::relu(nd::fully_connected(x, w, b, 4));
  const auto graph = trace.to_symbol({&y, 1});
  BOOST_TEST(graph.list_arguments() == (std::vector<std::string>{"data", "fc_weight", "fc_bias"}),
             boost::test_tools::per_element());

  auto constant = ndarray::ones({2, 4});
  auto z = y * constant;
  test::require_error([&] { (void)trace.to_symbol({&z, 1}); }, errc::invalid_argument, "(2,4)");
}

BOOST_AUTO_TEST_SUITE_END()

} // namespace troupe
