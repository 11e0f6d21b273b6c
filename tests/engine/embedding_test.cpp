// The Embedding operator (nd::embedding, nn::embedding): rows gathered by index, the weight's dense
// gradient summing each row's occurrences, and with sparse_grad a row_sparse gradient holding only
// the rows a batch used, equal bit for bit to the dense one; row_sparse gradients through
// autograd (write and add, dense contributions from other operators); bad indices named; a block
// with sparse_grad that stays imperative under hybridize while its dense children are cached.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/autograd.hpp"
#include "engine/nd.hpp"
#include "engine/nn/block.hpp"
#include "engine/nn/initializer.hpp"
#include "engine/row_sparse.hpp"

using namespace troupe;

namespace {

constexpr std::int64_t table_rows = 6;
constexpr std::int64_t width = 3;

/// A (6, 3) table whose element (r, c) is r + c / 10.
ndarray table() {
  std::vector<float> values;
  for (std::int64_t r = 0; r < table_rows; ++r)
    for (std::int64_t c = 0; c < width; ++c)
      values.push_back(static_cast<float>(r) + static_cast<float>(c) / 10.0f);
  return ndarray::from_values(values, {table_rows, width});
}

/// Row indices (2, 3) with row 2 used three times and rows 1 and 3 not at all.
ndarray batch_indices() {
  return ndarray::from_values({2, 0, 2, 5, 2, 4}, {2, 3});
}

std::vector<std::uint32_t> bits(const ndarray& array) {
  const auto values = array.to_vector<float>();
  std::vector<std::uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

/// table() with a gradient attached, row_sparse or dense.
ndarray table_with_gradient(bool sparse) {
  ndarray weight = table();
  if (sparse)
    autograd::attach_row_sparse_grad(weight);
  else
    weight.attach_grad();
  return weight;
}

/// The gradient of a table_with_gradient, dense either way.
ndarray dense_gradient(const ndarray& weight, bool sparse) {
  return sparse ? autograd::row_sparse_grad(weight).to_dense() : weight.grad();
}

/// The weight's gradient after backward of embedding(indices, weight) with head gradient
/// `head`, the weight's gradient being dense or row_sparse.
ndarray weight_gradient(const ndarray& indices, const ndarray& head, bool sparse) {
  ndarray weight = table_with_gradient(sparse);
  ndarray out;
  {
    autograd::record_scope record;
    out = nd::embedding(indices, weight, table_rows, width, sparse);
  }
  autograd::backward(out, head);
  return dense_gradient(weight, sparse);
}

} // namespace

BOOST_AUTO_TEST_SUITE(embedding_operator)

BOOST_AUTO_TEST_CASE(rows_are_gathered_by_index_in_the_indices_shape) {
  const auto out = nd::embedding(batch_indices(), table(), table_rows, width);
  BOOST_TEST(out.shape() == (shape_vector{2, 3, width}));
  const auto values = out.to_vector<float>();
  const std::vector<int> rows{2, 0, 2, 5, 2, 4};
  for (std::size_t i = 0; i < rows.size(); ++i)
    for (std::size_t c = 0; c < width; ++c)
      BOOST_TEST(values[i * width + c] ==
                 static_cast<float>(rows[i]) + static_cast<float>(c) / 10.0f);
}

BOOST_AUTO_TEST_CASE(the_dense_gradient_sums_the_output_gradient_of_each_rows_occurrences) {
  const auto head = ndarray::random_uniform(-1, 1, {2, 3, width}, 5);
  const auto grad = weight_gradient(batch_indices(), head, false).to_vector<float>();
  const auto dy = head.to_vector<float>();
  for (std::size_t c = 0; c < width; ++c) {
    // Occurrences of row 2 are positions 0, 2 and 4, added in that order.
    BOOST_TEST(grad[2 * width + c] == (dy[0 * width + c] + dy[2 * width + c]) + dy[4 * width + c]);
    BOOST_TEST(grad[0 * width + c] == dy[1 * width + c]);
    BOOST_TEST(grad[1 * width + c] == 0.0f);
    BOOST_TEST(grad[3 * width + c] == 0.0f);
  }
}

BOOST_AUTO_TEST_CASE(sparse_grad_holds_only_the_rows_used_and_equals_the_dense_gradient) {
  const auto head = ndarray::random_uniform(-1, 1, {2, 3, width}, 6);
  ndarray weight = table();
  autograd::attach_row_sparse_grad(weight);
  BOOST_TEST(weight.grad().is_none());
  ndarray out;
  {
    autograd::record_scope record;
    out = nd::embedding(batch_indices(), weight, table_rows, width, true);
  }
  autograd::backward(out, head);
  const auto rows = autograd::row_sparse_grad(weight);
  BOOST_TEST(rows.indices() == (std::vector<std::int64_t>{0, 2, 4, 5}));
  BOOST_TEST(bits(rows.to_dense()) == bits(weight_gradient(batch_indices(), head, false)));
}

BOOST_AUTO_TEST_CASE(row_sparse_gradients_add_over_backwards_and_take_dense_contributions) {
  // grad_req add: two backwards sum their rows.
  ndarray weight = table();
  autograd::attach_row_sparse_grad(weight, grad_req::add);
  ndarray dense_weight = table();
  dense_weight.attach_grad(grad_req::add);
  for (std::uint64_t seed : {11u, 12u}) {
    const auto indices = ndarray::from_values({static_cast<float>(seed % 6), 1}, {2});
    const auto head = ndarray::random_uniform(-1, 1, {2, width}, seed);
    for (auto* w : {&weight, &dense_weight}) {
      ndarray out;
      {
        autograd::record_scope record;
        out = nd::embedding(indices, *w, table_rows, width, w == &weight);
      }
      autograd::backward(out, head);
    }
  }
  BOOST_TEST(autograd::row_sparse_grad(weight).indices() == (std::vector<std::int64_t>{0, 1, 5}));
  BOOST_TEST(bits(autograd::row_sparse_grad(weight).to_dense()) == bits(dense_weight.grad()));

  // One graph using the weight twice through Embedding and once through a dense operator: the
  // dense contribution keeps its non-zero rows, and the sum equals the dense gradient.
  auto once = [](bool sparse) {
    ndarray w = table_with_gradient(sparse);
    ndarray loss;
    {
      autograd::record_scope record;
      auto a = nd::embedding(ndarray::from_values({3, 3}, {2}), w, table_rows, width, sparse);
      auto b = nd::embedding(ndarray::from_values({0}, {1}), w, table_rows, width, sparse);
      loss = nd::add(nd::add(nd::sum(nd::square(a)), nd::sum(b)), nd::sum(nd::multiply(w, w)));
    }
    loss.backward();
    return dense_gradient(w, sparse);
  };
  BOOST_TEST(bits(once(true)) == bits(once(false)));
}

BOOST_AUTO_TEST_CASE(indices_outside_the_table_or_not_integers_are_errors_naming_the_position) {
  for (float bad : {-1.0f, 6.0f, 1.5f}) {
    try {
      nd::embedding(ndarray::from_values({0, bad}, {2}), table(), table_rows, width).wait_to_read();
      BOOST_FAIL("index " << bad << " was accepted");
    } catch (const exception& e) {
      BOOST_TEST(e.error().code() == errc::invalid_argument);
      BOOST_TEST(std::string{e.what()}.find("Embedding: data[1]") != std::string::npos, e.what());
    }
  }
  // A weight of another shape than (input_dim, output_dim).
  BOOST_CHECK_THROW(nd::embedding(batch_indices(), table(), table_rows + 1, width), exception);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(embedding_block)

BOOST_AUTO_TEST_CASE(a_block_with_sparse_grad_gives_its_weight_the_rows_and_refuses_grad) {
  auto block = std::make_shared<nn::embedding>(table_rows, width, true, nullptr, "words_");
  block->initialize(std::make_shared<nn::constant>(0.5));
  auto& weight = *block->weight();
  BOOST_TEST(weight.name() == "words_weight");
  BOOST_TEST(weight.grad_stype() == storage_type::row_sparse);
  BOOST_TEST(weight.stype() == storage_type::dense);
  {
    autograd::record_scope record;
    auto out = (*block)(batch_indices());
    BOOST_TEST(out.shape() == (shape_vector{2, 3, width}));
    autograd::backward(out);
  }
  BOOST_TEST(weight.row_sparse_grad().indices() == (std::vector<std::int64_t>{0, 2, 4, 5}));
  try {
    weight.grad();
    BOOST_FAIL("grad() of a row_sparse gradient was accepted");
  } catch (const exception& e) {
    BOOST_TEST(std::string{e.what()}.find("row_sparse_grad()") != std::string::npos, e.what());
  }
  weight.zero_grad();
  BOOST_TEST(weight.row_sparse_grad().stored_rows() == 0u);
  // A row_sparse weight reads its rows through a trainer: without one, an error names it.
  nn::sparse_embedding sparse(table_rows, width, nullptr, "table_");
  sparse.initialize();
  try {
    sparse(batch_indices());
    BOOST_FAIL("a row_sparse weight was read without a trainer");
  } catch (const exception& e) {
    BOOST_TEST(std::string{e.what()}.find("table_weight") != std::string::npos, e.what());
    BOOST_TEST(std::string{e.what()}.find("no trainer") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(hybridized_nets_with_embeddings_compute_what_imperative_ones_do) {
  // The same net imperative and hybridized: the embedding with sparse_grad stays imperative and
  // the dense layer after it is cached; a dense-gradient embedding is traced with the rest.
  for (bool sparse : {true, false}) {
    std::vector<std::vector<std::uint32_t>> results[2];
    for (bool hybrid : {false, true}) {
      auto net = std::make_shared<nn::sequential>();
      auto words = std::make_shared<nn::embedding>(table_rows, width, sparse, nullptr, "w_");
      auto head = std::make_shared<nn::dense>(2, "", true, 2 * width, true, nullptr, "h_");
      net->add(words);
      net->add(head);
      net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 3);
      if (hybrid)
        net->hybridize();
      for (int step = 0; step < 3; ++step) {
        const auto indices = ndarray::from_values(
            {static_cast<float>(step), 4, 1, static_cast<float>(step)}, {2, 2});
        ndarray loss;
        {
          autograd::record_scope record;
          loss = nd::sum(nd::square((*net)(indices)));
        }
        loss.backward();
        auto& r = results[hybrid ? 1 : 0];
        r.push_back(bits(loss));
        r.push_back(
            bits(sparse ? words->weight()->row_sparse_grad().to_dense() : words->weight()->grad()));
        r.push_back(bits(head->weight()->grad()));
      }
      if (hybrid) {
        BOOST_TEST(net->is_hybridized() == !sparse);
        BOOST_TEST(head->is_hybridized());
        BOOST_TEST((sparse ? head->trace_count() : net->trace_count()) == 1u);
      }
    }
    BOOST_TEST(results[0] == results[1], "sparse_grad " << sparse);
  }
}

BOOST_AUTO_TEST_SUITE_END()
