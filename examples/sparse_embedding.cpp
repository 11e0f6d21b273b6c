// sparse_embedding: an embedding table trained through row_sparse gradients, as MXNet's
// Embedding(sparse_grad=True) with gluon's Trainer: each step touches a few rows of the table, and
// only those rows are summed, pushed and updated. A bag-of-words classifier on synthetic
// documents (8 words from a vocabulary of 50,000; each of 4 classes has its own 500 telling words
// among common ones), so that it runs anywhere in a few seconds.
//
// Build against an installed troupe (docs/embedding.md), then run alone (a local store) or as a
// job whose workers each train on their part of the data:
//   build-examples/sparse_embedding
//   troupe-launch -n 2 -s 1 -- build-examples/sparse_embedding
// With --row-sparse-weight the table is a row_sparse weight (gluon's contrib SparseEmbedding):
// it lives in the kvstore, and each forward pulls only the rows its batch uses.
// It prints, per epoch, the rows the last step pushed and the test accuracy:
//   sparse_embedding: rank 0 of 1, epoch 1: pushed 252 of 50000 rows per step, test accuracy 24.8 %
//   ...
//   sparse_embedding: rank 0 of 1, epoch 5: pushed 252 of 50000 rows per step, test accuracy 100.0 %
// and exits 0; 1 (the reason on stderr) when a call fails or the last accuracy is under 90 %.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "actors/dist_job.hpp"
#include "actors/gluon/trainer.hpp"
#include "engine/autograd.hpp"
#include "engine/nd.hpp"
#include "engine/nn/block.hpp"
#include "engine/nn/initializer.hpp"

using namespace troupe;

namespace {

constexpr std::int64_t vocabulary = 50'000;
constexpr std::int64_t words_per_document = 8;
constexpr std::int64_t classes = 4;
constexpr std::int64_t telling_words = 500; // per class, from the front of the vocabulary

struct batch {
  ndarray words; // float32 [n, words_per_document], word indices
  ndarray label; // float32 [n]
};

/// Documents of class c: half their words from c's telling words, the rest from anywhere.
std::vector<batch> make_batches(int count, std::int64_t size, std::uint64_t seed) {
  std::mt19937_64 random{seed};
  std::vector<batch> batches;
  for (int b = 0; b < count; ++b) {
    std::vector<float> words;
    std::vector<float> label;
    for (std::int64_t i = 0; i < size; ++i) {
      const auto c = static_cast<std::int64_t>(random() % classes);
      label.push_back(static_cast<float>(c));
      for (std::int64_t w = 0; w < words_per_document; ++w) {
        const auto word =
            w % 2 == 0 ? c * telling_words + static_cast<std::int64_t>(random() % telling_words)
                       : static_cast<std::int64_t>(random() % vocabulary);
        words.push_back(static_cast<float>(word));
      }
    }
    batches.push_back({ndarray::from_values(words, {size, words_per_document}),
                       ndarray::from_values(label, {size})});
  }
  return batches;
}

double accuracy(nn::block& net, const std::vector<batch>& batches) {
  std::int64_t correct = 0;
  std::int64_t seen = 0;
  for (const auto& batch : batches) {
    const auto scores = net.forward(batch.words).to_vector<float>();
    const auto labels = batch.label.to_vector<float>();
    for (std::size_t i = 0; i < labels.size(); ++i) {
      std::size_t best = 0;
      for (std::size_t c = 1; c < classes; ++c)
        if (scores[i * classes + c] > scores[i * classes + best])
          best = c;
      correct += static_cast<float>(best) == labels[i];
      ++seen;
    }
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(seen);
}

int train(bool in_job, bool row_sparse_weight) {
  auto store = kvstore::create(in_job ? "dist_sync" : "local").value();
  const int rank = store->rank();
  const int workers = store->num_workers();
  // Every worker makes the same data and trains on its part of it (batch b goes to b % workers).
  const auto all = make_batches(64, 32, 1);
  std::vector<batch> mine;
  for (std::size_t b = 0; b < all.size(); ++b)
    if (static_cast<int>(b % static_cast<std::size_t>(workers)) == rank)
      mine.push_back(all[b]);
  const auto test = make_batches(8, 64, 2);

  // README sparse_embedding {
  auto table = row_sparse_weight
                   ? std::make_shared<nn::sparse_embedding>(vocabulary, 16)
                   : std::make_shared<nn::embedding>(vocabulary, 16, /*sparse_grad=*/true);
  auto net = std::make_shared<nn::sequential>();
  net->add(table);                          // [n, 8] word indices -> [n, 8, 16]
  net->add(std::make_shared<nn::dense>(4)); // one output per class
  net->initialize(std::make_shared<nn::xavier>());
  // dist_sync: the servers update the rows pushed (update_on_kvstore, MXNet's rule for row_sparse
  // gradients across machines); local: the store sums them and the worker updates its rows.
  auto trainer = trainer::create(net->collect_params(), "sgd", {{"learning_rate", 0.5}},
                                 store.get(), std::nullopt)
                     .value();
  // README sparse_embedding }
  double last = 0;
  for (int epoch = 1; epoch <= 5; ++epoch) {
    std::size_t rows = 0;
    // README sparse_embedding {
    for (const auto& batch : mine) {
      {
        autograd::record_scope record;
        auto loss = nd::softmax_cross_entropy(net->forward(batch.words), batch.label);
        loss.backward();
      }
      rows = table->weight()->row_sparse_grad().stored_rows(); // the rows this step pushes
      trainer->step(batch.words.shape()[0]).value();
    }
    // README sparse_embedding }
    last = accuracy(*net, test);
    std::printf("sparse_embedding: rank %d of %d, epoch %d: pushed %zu of %lld rows per step, "
                "test accuracy %.1f %%\n",
                rank, workers, epoch, rows, static_cast<long long>(vocabulary), last);
  }
  if (last < 90.0) {
    std::cerr << "sparse_embedding: the test accuracy " << last << " % is under 90 %\n";
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (auto served = troupe::serve_if_node_role(argc, argv))
    return *served;
  bool row_sparse_weight = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--row-sparse-weight") == 0) {
      row_sparse_weight = true;
    } else {
      std::cerr << "sparse_embedding: unknown argument '" << argv[i]
                << "' (known: --row-sparse-weight)\n";
      return 2;
    }
  }
  try {
    return train(std::getenv("DMLC_ROLE") != nullptr, row_sparse_weight);
  } catch (const troupe::exception& failure) {
    std::cerr << "sparse_embedding: " << failure.what() << "\n";
    return 1;
  }
}
