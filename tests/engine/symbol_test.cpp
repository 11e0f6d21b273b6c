// Symbols and executors: MXNet's argument order, shape inference and its errors, binding, memory
// planning, and forward/backward results that equal the imperative operators with autograd bit
// for bit (the same op_defs, and gradients summed in the same order).
//
// This file replaces the global operator new / delete of engine_tests with malloc / free that
// count the calls made on a thread while an allocation_counter is alive there, to show that a
// bound executor allocates nothing per call.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <map>
#include <new>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/autograd.hpp"
#include "engine/dispatch.hpp"
#include "engine/nd.hpp"
#include "engine/ndarray.hpp"
#include "engine/op.hpp"
#include "engine/symbol.hpp"
#include "engine_test_support.hpp"

namespace {

thread_local bool counting_allocations = false;
std::atomic<std::size_t> allocations_counted{0};

void* counted_malloc(std::size_t size) noexcept {
  if (counting_allocations)
    allocations_counted.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}

} // namespace

// Every unaligned form, so that no block is allocated by one allocator and freed by another
// (AddressSanitizer checks that). Out of line, so that g++ does not inline a delete next to a new
// it knows and warn about free().
void* operator new(std::size_t size) {
  if (void* p = counted_malloc(size))
    return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  if (void* p = counted_malloc(size))
    return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  return counted_malloc(size);
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return counted_malloc(size);
}
[[gnu::noinline]] void operator delete(void* p) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
[[gnu::noinline]] void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

namespace troupe {
namespace {

/// Counts operator new calls on this thread while alive.
class allocation_counter {
public:
  allocation_counter() {
    allocations_counted.store(0);
    counting_allocations = true;
  }
  ~allocation_counter() { counting_allocations = false; }
  allocation_counter(const allocation_counter&) = delete;
  allocation_counter& operator=(const allocation_counter&) = delete;
  std::size_t count() const { return allocations_counted.load(); }
};

std::vector<float> host(const ndarray& array) {
  return array.to_vector<float>();
}

/// Bit-for-bit equality of two float arrays (operator== on floats, with the first difference
/// printed).
void require_identical(const ndarray& got, const ndarray& expected, const std::string& what) {
  BOOST_TEST_REQUIRE((got.shape() == expected.shape()),
                     what << ": shape " << shape_to_string(got.shape()) << " vs "
                          << shape_to_string(expected.shape()));
  const auto a = host(got);
  const auto b = host(expected);
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      BOOST_ERROR(what << ": element " << i << " is " << std::setprecision(9) << a[i]
                       << ", expected " << b[i]);
      return;
    }
}

symbol var(const char* name) {
  return symbol::variable(name);
}

/// data -> FullyConnected(16) -> relu -> FullyConnected(5) -> SoftmaxCrossEntropy(label) -> sum.
symbol mlp_loss() {
  const auto hidden = sym::activation(
      sym::fully_connected(var("data"), var("fc1_weight"), var("fc1_bias"), 16), "relu");
  const auto logits = sym::fully_connected(hidden, var("fc2_weight"), var("fc2_bias"), 5);
  return sym::sum(sym::softmax_cross_entropy(logits, var("label")));
}

/// Argument values for mlp_loss with a batch of `batch` rows of 12 features.
std::map<std::string, ndarray> mlp_values(std::int64_t batch) {
  std::vector<float> labels(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < labels.size(); ++i)
    labels[i] = static_cast<float>((i * 3) % 5);
  return {{"data", ndarray::random_normal(0, 1, {batch, 12}, 1)},
          {"fc1_weight", ndarray::random_normal(0, 0.3, {16, 12}, 2)},
          {"fc1_bias", ndarray::random_normal(0, 0.1, {16}, 3)},
          {"fc2_weight", ndarray::random_normal(0, 0.3, {5, 16}, 4)},
          {"fc2_bias", ndarray::random_normal(0, 0.1, {5}, 5)},
          {"label", ndarray::from_values(labels, {batch})}};
}

/// Copies `values` into the executor's bound arguments.
void set_arguments(executor& exec, const std::map<std::string, ndarray>& values) {
  for (const auto& [name, value] : values)
    value.copy_to(exec.arg(name));
}

/// Copies of `values` with gradients attached to those named in `with_grad` (autograd leaves).
std::map<std::string, ndarray> leaves(const std::map<std::string, ndarray>& values,
                                      const std::vector<std::string>& with_grad,
                                      grad_req req = grad_req::write) {
  std::map<std::string, ndarray> copies;
  for (const auto& [name, value] : values) {
    ndarray copy = value.copy();
    if (std::find(with_grad.begin(), with_grad.end(), name) != with_grad.end())
      copy.attach_grad(req);
    copies.emplace(name, copy);
  }
  return copies;
}

const std::vector<std::string> mlp_parameters{"fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"};

} // namespace

BOOST_AUTO_TEST_SUITE(symbol_suite)

// ---------------------------------------------------------------------------------------------
// Graph queries.

BOOST_AUTO_TEST_CASE(list_arguments_of_an_mlp_follows_mxnet_depth_first_order) {
  BOOST_TEST(mlp_loss().list_arguments() ==
                 (std::vector<std::string>{"data", "fc1_weight", "fc1_bias", "fc2_weight",
                                           "fc2_bias", "label"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_variable_used_twice_is_listed_once_at_its_first_visit) {
  const auto x = var("x");
  const auto y = sym::add(sym::multiply(x, var("w")), x);
  BOOST_TEST(y.list_arguments() == (std::vector<std::string>{"x", "w"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(calls_are_named_after_their_op_in_lower_case_with_a_counter) {
  const auto first = sym::activation(var("x"), "relu");
  const auto second = sym::activation(var("x"), "relu");
  const std::string a = first.outputs()[0].node->name;
  const std::string b = second.outputs()[0].node->name;
  BOOST_TEST(a.rfind("activation", 0) == 0);
  BOOST_TEST(b.rfind("activation", 0) == 0);
  BOOST_TEST(std::stoul(b.substr(10)) == std::stoul(a.substr(10)) + 1);
  BOOST_TEST(first.list_outputs() == (std::vector<std::string>{a + "_output"}),
             boost::test_tools::per_element());
  const std::array<symbol, 1> input{var("x")};
  const auto named = symbol::create("Activation", input, activation_attrs("tanh"), "act");
  BOOST_TEST(named.list_outputs() == (std::vector<std::string>{"act_output"}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(group_and_indexing_select_outputs) {
  const auto a = sym::sum(var("x"));
  const auto b = sym::activation(var("y"), "relu");
  const std::array<symbol, 2> parts{a, b};
  const auto both = symbol::group(parts);
  BOOST_TEST(both.outputs().size() == 2U);
  BOOST_TEST(both.list_arguments() == (std::vector<std::string>{"x", "y"}),
             boost::test_tools::per_element());
  BOOST_TEST(both[1].list_outputs() == b.list_outputs(), boost::test_tools::per_element());
  test::require_error([&] { (void)both[2]; }, errc::invalid_argument, "2 outputs");
}

BOOST_AUTO_TEST_CASE(an_empty_bias_drops_the_input_and_sets_no_bias) {
  const auto y = sym::fully_connected(var("data"), var("w"), symbol{}, 3);
  BOOST_TEST(y.list_arguments() == (std::vector<std::string>{"data", "w"}),
             boost::test_tools::per_element());
  BOOST_TEST(y.outputs()[0].node->attrs.no_bias);
}

BOOST_AUTO_TEST_CASE(create_checks_the_number_of_inputs_against_the_op) {
  const std::array<symbol, 2> two{var("data"), var("w")};
  test::require_error(
      [&] { (void)symbol::create("FullyConnected", two, fully_connected_attrs(3)); },
      errc::invalid_argument, "takes 3 inputs (data, weight, bias)");
  const std::array<symbol, 3> with_empty{var("data"), var("w"), symbol{}};
  test::require_error(
      [&] { (void)symbol::create("FullyConnected", with_empty, fully_connected_attrs(3)); },
      errc::invalid_argument, "input 2 (bias) of FullyConnected is an empty symbol");
  test::require_error([&] { (void)symbol::create("NoSuchOp", two, {}); }, errc::invalid_argument,
                      "NoSuchOp");
}

BOOST_AUTO_TEST_CASE(to_string_lists_each_call_with_inputs_and_attributes) {
  const std::array<symbol, 3> inputs{var("data"), var("fc_weight"), var("fc_bias")};
  const auto fc = symbol::create("FullyConnected", inputs, fully_connected_attrs(7), "fc");
  const std::string text = fc.to_string();
  BOOST_TEST(text.find("variable data\n") != std::string::npos, text);
  BOOST_TEST(text.find("fc = FullyConnected(data, fc_weight, fc_bias) {num_hidden=7") !=
                 std::string::npos,
             text);
  BOOST_TEST(text.find("outputs: fc_output") != std::string::npos, text);
}

// ---------------------------------------------------------------------------------------------
// Shape inference.

BOOST_AUTO_TEST_CASE(infer_shape_derives_every_parameter_from_the_data_shape) {
  const auto fc1 = sym::fully_connected(var("data"), var("fc1_weight"), var("fc1_bias"), 16);
  const auto net =
      sym::fully_connected(sym::activation(fc1, "relu"), var("fc2_weight"), var("fc2_bias"), 5);
  const auto shapes = net.infer_shape({{"data", {64, 12}}});
  BOOST_TEST_REQUIRE(shapes.has_value());
  const std::vector<shape_vector> expected{{64, 12}, {16, 12}, {16}, {5, 16}, {5}};
  BOOST_TEST_REQUIRE(shapes->arguments.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i)
    BOOST_TEST((shapes->arguments[i] == expected[i]), "argument " << i);
  BOOST_TEST_REQUIRE(shapes->outputs.size() == 1U);
  BOOST_TEST((shapes->outputs[0] == shape_vector{64, 5}));
}

BOOST_AUTO_TEST_CASE(infer_shape_fills_a_parameter_for_an_earlier_consumer_from_a_later_one) {
  // sum(w) cannot tell w's shape; the FullyConnected made after it can.
  const auto w = var("w");
  const auto total = sym::sum(w);
  const auto fc = sym::fully_connected(var("data"), w, symbol{}, 4);
  const std::array<symbol, 2> parts{total, fc};
  const auto shapes = symbol::group(parts).infer_shape({{"data", {2, 3}}});
  BOOST_TEST_REQUIRE(shapes.has_value());
  BOOST_TEST((shapes->arguments[0] == shape_vector{4, 3}));
  BOOST_TEST((shapes->outputs[0] == shape_vector{1}));
  BOOST_TEST((shapes->outputs[1] == shape_vector{2, 4}));
}

BOOST_AUTO_TEST_CASE(conflicting_shapes_name_the_node_and_the_shapes) {
  const std::array<symbol, 3> inputs{var("data"), var("fc2_weight"), var("fc2_bias")};
  const auto fc = symbol::create("FullyConnected", inputs, fully_connected_attrs(10), "fc2");
  const auto shapes = fc.infer_shape({{"data", {8, 128}}, {"fc2_weight", {10, 127}}});
  BOOST_TEST_REQUIRE(!shapes.has_value());
  const std::string& message = shapes.error().message();
  BOOST_TEST(shapes.error().code() == errc::shape_mismatch);
  BOOST_TEST(message.find("'fc2'") != std::string::npos, message);
  BOOST_TEST(message.find("fc2_weight=(10,127)") != std::string::npos, message);
  BOOST_TEST(message.find("data=(8,128)") != std::string::npos, message);
}

BOOST_AUTO_TEST_CASE(variables_whose_shape_cannot_be_inferred_are_listed) {
  const auto y = sym::sum(sym::multiply(sym::add(var("x"), var("y")), var("z")));
  const auto shapes = y.infer_shape({{"x", {3}}});
  BOOST_TEST_REQUIRE(!shapes.has_value());
  const std::string& message = shapes.error().message();
  BOOST_TEST(message.find("cannot infer the shapes of y, z") != std::string::npos, message);

  const auto typo = y.infer_shape({{"xx", {3}}});
  BOOST_TEST_REQUIRE(!typo.has_value());
  BOOST_TEST(typo.error().message().find("'xx' is not an argument") != std::string::npos,
             typo.error().message());
}

// ---------------------------------------------------------------------------------------------
// Binding.

BOOST_AUTO_TEST_CASE(bind_with_a_wrong_shape_names_the_variable) {
  auto values = mlp_values(8);
  values["fc1_weight"] = ndarray::zeros({16, 11});
  auto bound = mlp_loss().bind(context::cpu(), values);
  BOOST_TEST_REQUIRE(!bound.has_value());
  BOOST_TEST(bound.error().message().find("fc1_weight=(16,11)") != std::string::npos,
             bound.error().message());

  auto missing = mlp_values(8);
  missing.erase("fc2_bias");
  auto unbound = mlp_loss().bind(context::cpu(), missing);
  BOOST_TEST_REQUIRE(!unbound.has_value());
  BOOST_TEST(unbound.error().message().find("'fc2_bias'") != std::string::npos,
             unbound.error().message());

  auto bad_gradient =
      mlp_loss().bind(context::cpu(), mlp_values(8), {{"fc2_weight", ndarray::zeros({5, 15})}});
  BOOST_TEST_REQUIRE(!bad_gradient.has_value());
  BOOST_TEST(bad_gradient.error().message().find("'fc2_weight'") != std::string::npos,
             bad_gradient.error().message());
}

BOOST_AUTO_TEST_CASE(bind_uses_the_callers_arrays_and_gradient_arrays) {
  auto values = mlp_values(4);
  ndarray w_grad = ndarray::full({5, 16}, 7.0);
  auto exec =
      mlp_loss()
          .bind(context::cpu(), values, {{"fc2_weight", w_grad}}, {{"fc2_weight", grad_req::write}})
          .value();
  BOOST_TEST(exec.arg("fc1_weight").shares_storage_with(values.at("fc1_weight")));
  BOOST_TEST(exec.grad("fc2_weight").shares_storage_with(w_grad));
  BOOST_TEST(exec.grad("fc1_weight").is_none());
  exec.forward(true);
  exec.backward();
  BOOST_TEST(w_grad.to_vector<float>()[0] != 7.0f);
  test::require_error([&] { (void)exec.arg("nope"); }, errc::invalid_argument, "'nope'");
}

// ---------------------------------------------------------------------------------------------
// Running.

BOOST_AUTO_TEST_CASE(a_hand_computed_product_and_its_gradients) {
  // y = Σ x·w: dy/dx = w, dy/dw = x.
  const auto y = sym::sum(sym::multiply(var("x"), var("w")));
  auto exec = y.simple_bind(context::cpu(), {{"x", {3}}, {"w", {3}}}).value();
  ndarray::from_values({1, 2, 3}, {3}).copy_to(exec.arg("x"));
  ndarray::from_values({4, 5, 6}, {3}).copy_to(exec.arg("w"));
  exec.forward(true);
  BOOST_TEST(host(exec.outputs()[0]) == (std::vector<float>{32}), boost::test_tools::per_element());
  exec.backward();
  BOOST_TEST(host(exec.grad("x")) == (std::vector<float>{4, 5, 6}),
             boost::test_tools::per_element());
  BOOST_TEST(host(exec.grad("w")) == (std::vector<float>{1, 2, 3}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_fully_connected_layer_against_a_hand_computation) {
  // y = x·Wᵀ + b with x [[1, 2]], W [[1, 0], [0, 1], [1, 1]], b [0.5, 0, -1].
  const auto y = sym::fully_connected(var("x"), var("w"), var("b"), 3);
  auto exec = y.simple_bind(context::cpu(), {{"x", {1, 2}}}).value();
  ndarray::from_values({1, 2}, {1, 2}).copy_to(exec.arg("x"));
  ndarray::from_values({1, 0, 0, 1, 1, 1}, {3, 2}).copy_to(exec.arg("w"));
  ndarray::from_values({0.5, 0, -1}, {3}).copy_to(exec.arg("b"));
  exec.forward(true);
  BOOST_TEST(host(exec.outputs()[0]) == (std::vector<float>{1.5, 2, 2}),
             boost::test_tools::per_element());
  const std::array<ndarray, 1> head{ndarray::from_values({1, 2, 3}, {1, 3})};
  exec.backward(head);
  // dx = dy·W = [1 + 3, 2 + 3]; dW = dyᵀ·x; db = dy.
  BOOST_TEST(host(exec.grad("x")) == (std::vector<float>{4, 5}), boost::test_tools::per_element());
  BOOST_TEST(host(exec.grad("w")) == (std::vector<float>{1, 2, 2, 4, 3, 6}),
             boost::test_tools::per_element());
  BOOST_TEST(host(exec.grad("b")) == (std::vector<float>{1, 2, 3}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_mlp_forward_and_backward_equal_the_imperative_run_bit_for_bit) {
  const auto values = mlp_values(8);
  auto exec = mlp_loss()
                  .simple_bind(context::cpu(), {{"data", {8, 12}}, {"label", {8}}}, grad_req::write,
                               {{"label", grad_req::null}})
                  .value();
  set_arguments(exec, values);
  exec.forward(true);
  exec.backward();

  auto x = leaves(values, {"data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"});
  ndarray loss;
  {
    autograd::record_scope record;
    const auto hidden =
        nd::relu(nd::fully_connected(x.at("data"), x.at("fc1_weight"), x.at("fc1_bias"), 16));
    const auto logits = nd::fully_connected(hidden, x.at("fc2_weight"), x.at("fc2_bias"), 5);
    loss = nd::sum(nd::softmax_cross_entropy(logits, x.at("label")));
  }
  loss.backward();
  require_identical(exec.outputs()[0], loss, "loss");
  for (const char* name : {"data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"})
    require_identical(exec.grad(name), x.at(name).grad(), std::string("gradient of ") + name);
  BOOST_TEST(exec.grad("label").is_none());
}

BOOST_AUTO_TEST_CASE(an_mlp_against_the_op_defs_called_directly) {
  // The executor's arrays are views of planned buffers; the same op_defs on fresh arrays must
  // give the same numbers.
  const auto values = mlp_values(6);
  auto exec = mlp_loss()
                  .simple_bind(context::cpu(), {{"data", {6, 12}}, {"label", {6}}}, grad_req::write,
                               {{"label", grad_req::null}})
                  .value();
  set_arguments(exec, values);
  exec.forward(true);
  exec.backward();

  struct call {
    const op_def& op;
    op_attrs attrs;
    std::vector<ndarray> inputs;
    std::vector<ndarray> outputs;
    std::vector<ndarray> saved;
  };
  auto run = [](const char* name, op_attrs attrs, std::vector<ndarray> inputs) {
    call c{find_op(name), std::move(attrs), std::move(inputs), {}, {}};
    std::vector<shape_vector> shapes;
    for (const auto& input : c.inputs)
      shapes.push_back(input.shape());
    for (const auto& shape : c.op.infer_shape(c.attrs, shapes))
      c.outputs.emplace_back(shape);
    c.op.forward(op_forward_call{c.attrs, true, c.inputs, c.outputs, c.saved,
                                 seed_for_call(c.op, c.attrs, true)});
    return c;
  };
  auto fc1 = run("FullyConnected", fully_connected_attrs(16),
                 {values.at("data"), values.at("fc1_weight"), values.at("fc1_bias")});
  auto relu = run("Activation", activation_attrs("relu"), {fc1.outputs[0]});
  auto fc2 = run("FullyConnected", fully_connected_attrs(5),
                 {relu.outputs[0], values.at("fc2_weight"), values.at("fc2_bias")});
  auto sce = run("SoftmaxCrossEntropy", {}, {fc2.outputs[0], values.at("label")});
  auto total = run("sum", {}, {sce.outputs[0]});
  require_identical(exec.outputs()[0], total.outputs[0], "loss");

  auto back = [](call& c, std::vector<ndarray> output_grads, std::vector<ndarray> input_grads) {
    std::vector<grad_req> reqs;
    for (const auto& grad : input_grads)
      reqs.push_back(grad.is_none() ? grad_req::null : grad_req::write);
    c.op.backward(
        op_backward_call{c.attrs, c.inputs, c.outputs, c.saved, output_grads, input_grads, reqs});
    return input_grads;
  };
  auto like = [](const ndarray& a) { return ndarray::empty(a.shape()); };
  auto d_sce = back(total, {ndarray::ones({1})}, {like(sce.outputs[0])});
  auto d_fc2 = back(sce, {d_sce[0]}, {like(fc2.outputs[0]), {}});
  auto d_relu =
      back(fc2, {d_fc2[0]},
           {like(relu.outputs[0]), like(values.at("fc2_weight")), like(values.at("fc2_bias"))});
  auto d_fc1 = back(relu, {d_relu[0]}, {like(fc1.outputs[0])});
  auto d_in =
      back(fc1, {d_fc1[0]},
           {like(values.at("data")), like(values.at("fc1_weight")), like(values.at("fc1_bias"))});
  require_identical(exec.grad("fc2_weight"), d_relu[1], "fc2_weight");
  require_identical(exec.grad("fc2_bias"), d_relu[2], "fc2_bias");
  require_identical(exec.grad("data"), d_in[0], "data");
  require_identical(exec.grad("fc1_weight"), d_in[1], "fc1_weight");
  require_identical(exec.grad("fc1_bias"), d_in[2], "fc1_bias");
}

BOOST_AUTO_TEST_CASE(the_gradient_of_x_times_x_is_twice_x) {
  const auto x = var("x");
  const auto y = sym::sum(sym::multiply(x, x));
  auto exec = y.simple_bind(context::cpu(), {{"x", {4}}}).value();
  ndarray::from_values({1, -2, 3.5, 0.25}, {4}).copy_to(exec.arg("x"));
  exec.forward(true);
  exec.backward();
  BOOST_TEST(host(exec.grad("x")) == (std::vector<float>{2, -4, 7, 0.5}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(grad_req_add_accumulates_across_backward_calls) {
  // x feeds two calls, so each backward adds two contributions to its gradient; w one.
  const auto x = var("x");
  const auto w = var("w");
  const auto product = sym::multiply(x, w);
  const auto squashed = sym::activation(x, "tanh");
  const auto y = sym::sum(sym::add(product, squashed));
  auto exec = y.simple_bind(context::cpu(), {{"x", {5}}, {"w", {5}}}, grad_req::add).value();
  ndarray::random_normal(0, 1, {5}, 11).copy_to(exec.arg("x"));
  ndarray::random_normal(0, 1, {5}, 12).copy_to(exec.arg("w"));
  exec.forward(true);
  exec.backward();
  const auto once_x = host(exec.grad("x"));
  const auto once_w = host(exec.grad("w"));
  BOOST_TEST(once_w == host(exec.arg("x")), boost::test_tools::per_element());
  exec.forward(true);
  exec.backward();
  const auto twice_x = host(exec.grad("x"));
  const auto twice_w = host(exec.grad("w"));
  for (std::size_t i = 0; i < 5; ++i) {
    BOOST_TEST(twice_w[i] == 2 * once_w[i]); // one contribution: exact
    // Two contributions added one by one round differently from doubling their sum.
    BOOST_TEST(twice_x[i] == 2 * once_x[i], boost::test_tools::tolerance(1e-6f));
  }

  // Bit for bit what autograd accumulates with grad_req add.
  auto xs = leaves({{"x", exec.arg("x")}, {"w", exec.arg("w")}}, {"x", "w"}, grad_req::add);
  for (int round = 0; round < 2; ++round) {
    ndarray out;
    {
      autograd::record_scope record;
      const auto a_product = nd::multiply(xs.at("x"), xs.at("w"));
      const auto a_squashed = nd::tanh(xs.at("x"));
      out = nd::sum(nd::add(a_product, a_squashed));
    }
    out.backward();
  }
  require_identical(exec.grad("x"), xs.at("x").grad(), "x");
  require_identical(exec.grad("w"), xs.at("w").grad(), "w");
}

BOOST_AUTO_TEST_CASE(a_shared_weight_and_a_shared_value_sum_like_autograd_bit_for_bit) {
  // W is used by two FullyConnected calls, whose weight gradients are GEMMs over a batch of
  // 1000 (an op's req add would add block by block and round differently), and h by three calls.
  const auto x = var("x");
  const auto w = var("w");
  const auto h = sym::activation(sym::fully_connected(x, w, var("b"), 64), "tanh");
  const auto h2 = sym::fully_connected(h, w, symbol{}, 64);
  const auto y = sym::sum(sym::add(sym::multiply(h2, h), h));
  auto exec = y.simple_bind(context::cpu(), {{"x", {1000, 64}}}).value();
  const std::map<std::string, ndarray> values{{"x", ndarray::random_normal(0, 1, {1000, 64}, 31)},
                                              {"w", ndarray::random_normal(0, 0.2, {64, 64}, 32)},
                                              {"b", ndarray::random_normal(0, 0.1, {64}, 33)}};
  set_arguments(exec, values);
  exec.forward(true);
  exec.backward();

  auto a = leaves(values, {"x", "w", "b"});
  ndarray out;
  {
    autograd::record_scope record;
    const auto ah = nd::tanh(nd::fully_connected(a.at("x"), a.at("w"), a.at("b"), 64));
    const auto ah2 = nd::fully_connected(ah, a.at("w"), {}, 64);
    out = nd::sum(nd::add(nd::multiply(ah2, ah), ah));
  }
  out.backward();
  require_identical(exec.outputs()[0], out, "output");
  for (const char* name : {"x", "w", "b"})
    require_identical(exec.grad(name), a.at(name).grad(), std::string("gradient of ") + name);
}

BOOST_AUTO_TEST_CASE(a_small_cnn_equals_the_imperative_run_bit_for_bit) {
  // Convolution, Pooling (whose backward reads its input and output), Flatten, Dropout.
  const auto conv = sym::convolution(var("data"), var("conv_weight"), var("conv_bias"), {3, 3}, 4,
                                     {1, 1}, {1, 1});
  const auto pooled = sym::pooling(sym::activation(conv, "relu"), {2, 2}, "max", {2, 2});
  const auto dropped = sym::dropout(sym::flatten(pooled), 0.25);
  const auto logits = sym::fully_connected(dropped, var("fc_weight"), var("fc_bias"), 3);
  const auto loss = sym::sum(sym::softmax_cross_entropy(logits, var("label")));
  auto exec = loss.simple_bind(context::cpu(), {{"data", {5, 2, 8, 8}}, {"label", {5}}},
                               grad_req::write, {{"label", grad_req::null}})
                  .value();
  BOOST_TEST(exec.planned_bytes() < exec.unplanned_bytes());
  const std::map<std::string, ndarray> values{
      {"data", ndarray::random_normal(0, 1, {5, 2, 8, 8}, 81)},
      {"conv_weight", ndarray::random_normal(0, 0.3, {4, 2, 3, 3}, 82)},
      {"conv_bias", ndarray::random_normal(0, 0.1, {4}, 83)},
      {"fc_weight", ndarray::random_normal(0, 0.3, {3, 64}, 84)},
      {"fc_bias", ndarray::random_normal(0, 0.1, {3}, 85)},
      {"label", ndarray::from_values({0, 2, 1, 1, 0}, {5})}};
  set_arguments(exec, values);
  seed_operators(5);
  for (int round = 0; round < 2; ++round) { // the second round reuses every buffer
    exec.forward(true);
    exec.backward();
  }

  auto a = leaves(values, {"data", "conv_weight", "conv_bias", "fc_weight", "fc_bias"});
  seed_operators(5);
  ndarray out;
  for (int round = 0; round < 2; ++round) {
    autograd::record_scope record;
    const auto a_conv = nd::convolution(a.at("data"), a.at("conv_weight"), a.at("conv_bias"),
                                        {3, 3}, 4, {1, 1}, {1, 1});
    const auto a_pooled = nd::pooling(nd::relu(a_conv), {2, 2}, "max", {2, 2});
    const auto a_dropped = nd::dropout(nd::flatten(a_pooled), 0.25);
    const auto a_logits = nd::fully_connected(a_dropped, a.at("fc_weight"), a.at("fc_bias"), 3);
    out = nd::sum(nd::softmax_cross_entropy(a_logits, a.at("label")));
    out.backward();
  }
  require_identical(exec.outputs()[0], out, "loss");
  for (const char* name : {"data", "conv_weight", "conv_bias", "fc_weight", "fc_bias"})
    require_identical(exec.grad(name), a.at(name).grad(), std::string("gradient of ") + name);
}

BOOST_AUTO_TEST_CASE(an_output_also_used_inside_the_graph_gets_both_gradients) {
  // Heads: the hidden layer and the loss computed from it, as autograd::backward of both.
  const auto hidden = sym::activation(
      sym::fully_connected(var("data"), var("fc1_weight"), var("fc1_bias"), 16), "relu");
  const auto logits = sym::fully_connected(hidden, var("fc2_weight"), var("fc2_bias"), 5);
  const auto loss = sym::softmax_cross_entropy(logits, var("label"));
  const std::array<symbol, 2> parts{hidden, loss};
  auto exec = symbol::group(parts)
                  .simple_bind(context::cpu(), {{"data", {8, 12}}, {"label", {8}}}, grad_req::write,
                               {{"label", grad_req::null}})
                  .value();
  const auto values = mlp_values(8);
  set_arguments(exec, values);
  exec.forward(true);
  const std::array<ndarray, 2> head_grads{ndarray::full({8, 16}, 0.5),
                                          ndarray::random_uniform(0, 1, {8}, 41)};
  exec.backward(head_grads);

  auto x = leaves(values, mlp_parameters);
  std::array<ndarray, 2> heads;
  {
    autograd::record_scope record;
    heads[0] =
        nd::relu(nd::fully_connected(x.at("data"), x.at("fc1_weight"), x.at("fc1_bias"), 16));
    heads[1] = nd::softmax_cross_entropy(
        nd::fully_connected(heads[0], x.at("fc2_weight"), x.at("fc2_bias"), 5), x.at("label"));
  }
  autograd::backward(heads, head_grads);
  require_identical(exec.outputs()[0], heads[0], "hidden");
  require_identical(exec.outputs()[1], heads[1], "loss");
  for (const auto& name : mlp_parameters)
    require_identical(exec.grad(name), x.at(name).grad(), "gradient of " + name);
}

BOOST_AUTO_TEST_CASE(calls_run_in_creation_order_so_dropout_draws_seeds_as_imperative) {
  // b is created after a but visited first depth-first (add(b, a)); the executor runs a first,
  // as the imperative code did, so each Dropout gets the same seed.
  const auto x = var("x");
  const auto a = sym::dropout(x, 0.5);
  const auto b = sym::dropout(x, 0.5);
  const auto y = sym::add(b, sym::multiply(a, a));
  auto exec = y.simple_bind(context::cpu(), {{"x", {64}}}).value();
  const auto values = ndarray::random_normal(0, 1, {64}, 51);
  values.copy_to(exec.arg("x"));
  seed_operators(99);
  exec.forward(true);
  exec.backward();

  auto xs = leaves({{"x", values}}, {"x"});
  seed_operators(99);
  ndarray out;
  {
    autograd::record_scope record;
    const auto da = nd::dropout(xs.at("x"), 0.5);
    const auto db = nd::dropout(xs.at("x"), 0.5);
    out = nd::add(db, nd::multiply(da, da));
  }
  out.backward();
  require_identical(exec.outputs()[0], out, "output");
  require_identical(exec.grad("x"), xs.at("x").grad(), "gradient of x");
}

BOOST_AUTO_TEST_CASE(backward_needs_a_training_forward_and_may_be_repeated) {
  auto exec = mlp_loss()
                  .simple_bind(context::cpu(), {{"data", {4, 12}}, {"label", {4}}}, grad_req::write,
                               {{"label", grad_req::null}})
                  .value();
  set_arguments(exec, mlp_values(4));
  test::require_error([&] { exec.backward(); }, errc::invalid_argument, "forward(true)");
  exec.forward(false);
  test::require_error([&] { exec.backward(); }, errc::invalid_argument, "forward(true)");
  exec.forward(true);
  exec.backward();
  const auto first = exec.grad("fc1_weight").copy();
  exec.backward(); // forward values read by backward are kept: the same gradients again
  require_identical(exec.grad("fc1_weight"), first, "fc1_weight");
}

BOOST_AUTO_TEST_CASE(forward_rejects_an_argument_replaced_by_another_shape) {
  auto exec = sym::sum(var("x")).simple_bind(context::cpu(), {{"x", {3}}}).value();
  exec.arg("x") = ndarray::zeros({4});
  test::require_error([&] { exec.forward(); }, errc::shape_mismatch, "'x'");
  exec.arg("x") = ndarray::ones({3}); // a new array of the bound shape is used
  exec.forward();
  BOOST_TEST(exec.outputs()[0].as_scalar() == 3.0);
}

// ---------------------------------------------------------------------------------------------
// Memory planning and steady-state cost.

BOOST_AUTO_TEST_CASE(an_inference_plan_of_a_5_layer_mlp_reuses_buffers) {
  symbol net = var("data");
  std::map<std::string, ndarray> values{{"data", ndarray::random_normal(0, 1, {64, 256}, 61)}};
  for (int layer = 1; layer <= 5; ++layer) {
    const std::string prefix = "fc" + std::to_string(layer);
    const std::int64_t out = layer == 5 ? 10 : 256;
    net = sym::fully_connected(net, var((prefix + "_weight").c_str()),
                               var((prefix + "_bias").c_str()), out);
    values.emplace(prefix + "_weight", ndarray::random_normal(0, 0.06, {out, 256}, 61 + layer));
    values.emplace(prefix + "_bias", ndarray::random_normal(0, 0.1, {out}, 71 + layer));
    if (layer < 5)
      net = sym::activation(net, "relu");
  }
  auto inference = net.simple_bind(context::cpu(), {{"data", {64, 256}}}, grad_req::null).value();
  auto training = net.simple_bind(context::cpu(), {{"data", {64, 256}}}, grad_req::write).value();
  BOOST_TEST_MESSAGE("5-layer MLP, batch 64, 256 wide: inference plan "
                     << inference.planned_bytes() << " of " << inference.unplanned_bytes()
                     << " bytes; training plan " << training.planned_bytes() << " of "
                     << training.unplanned_bytes() << " bytes");
  // Eight [64, 256] intermediates (4 FullyConnected, 4 relu) ping-pong between two buffers.
  const std::size_t one = 64 * 256 * sizeof(float);
  BOOST_TEST(inference.unplanned_bytes() == 8 * one);
  BOOST_TEST(inference.planned_bytes() == 2 * one);
  BOOST_TEST(training.planned_bytes() < training.unplanned_bytes());

  set_arguments(inference, values);
  set_arguments(training, values);
  inference.forward(false);
  training.forward(false);
  ndarray expected = values.at("data");
  for (int layer = 1; layer <= 5; ++layer) {
    const std::string prefix = "fc" + std::to_string(layer);
    expected = nd::fully_connected(expected, values.at(prefix + "_weight"),
                                   values.at(prefix + "_bias"), layer == 5 ? 10 : 256);
    if (layer < 5)
      expected = nd::relu(expected);
  }
  require_identical(inference.outputs()[0], expected, "inference output");
  require_identical(training.outputs()[0], expected, "training-plan output");
}

BOOST_AUTO_TEST_CASE(a_bound_executor_allocates_nothing_per_call) {
  if (engine::has_backend()) {
    // Queued work carries its arrays in an allocated closure; the naive engine allocates nothing.
    BOOST_TEST_MESSAGE("skipped: a device backend is installed (TROUPE_TEST_ENGINE=queued)");
    return;
  }
  auto exec = mlp_loss()
                  .simple_bind(context::cpu(), {{"data", {32, 12}}, {"label", {32}}},
                               grad_req::write, {{"label", grad_req::null}})
                  .value();
  set_arguments(exec, mlp_values(32));
  const std::array<ndarray, 1> head{ndarray::full({1}, 0.5)};
  for (int warm = 0; warm < 2; ++warm) {
    exec.forward(true);
    exec.backward(head);
  }
  std::size_t counted = 0;
  {
    const allocation_counter counter;
    for (int round = 0; round < 3; ++round) {
      exec.forward(true);
      exec.backward();
      exec.backward(head);
      exec.forward(false);
    }
    counted = counter.count();
  }
  BOOST_TEST(counted == 0U);
}

BOOST_AUTO_TEST_SUITE_END()

} // namespace troupe
