// Once warm, a server shard's data path allocates nothing: a dist_sync round of small pushpulls
// (two workers, each pushing and pulling the key in one request, the key answered where it
// arrives) makes no operator new and takes no fresh storage block. What the test drives is
// shard_core alone, as the broker's lane runs it; the messages it hands in are built before the
// probe is armed, as a receiver builds them from its pooled frame buffers.
//
// A worker's rules (worker_core) likewise: a warm worker's pushpull of one small key allocates
// nothing between the call and its completion, and a call of many small keys allocates per fused
// frame, not per key. The calls are built before the probe is armed, as the facade builds them
// on the caller's thread; the replies inside it, as a receiver decodes them.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/wire_conversions.hpp"
#include "actors/logic/worker_core.hpp"
#include "engine/storage.hpp"
#include "tests/actors/logic/shard_driver.hpp"
#include "tests/allocation_probe.hpp"

using namespace troupe;
using troupe::test::allocation_probe;
using troupe::testing::shard_driver;
using troupe::testing::whole;

namespace {

constexpr std::uint64_t key = 3;
constexpr std::uint32_t workers = 2;

/// Both workers' pushpulls of rounds [first, last), in the order they arrive.
std::vector<envelope> pushpulls(std::uint64_t first, std::uint64_t last,
                                const std::vector<ndarray>& gradients) {
  std::vector<envelope> out;
  std::uint64_t id = 100 + first * workers;
  for (std::uint64_t round = first; round < last; ++round)
    for (std::uint32_t worker = 0; worker < workers; ++worker) {
      const auto& gradient = gradients[worker];
      out.push_back(envelope{wire::pushpull{id++, key, worker, round, whole(gradient)},
                             gradient.keepalive(), shard_driver::connection});
    }
  return out;
}

/// Runs `requests` through the shard; the replies are kept only until the round's last one
/// arrived, as the broker releases a reply once it is written.
std::size_t run(shard_driver& job, std::vector<envelope>& requests) {
  std::size_t values = 0;
  const reply_function sink = [&](envelope out) { job.replies.push_back(std::move(out)); };
  for (auto& request : requests) {
    job.shard->handle(std::move(request), sink);
    for (const auto& reply : job.replies)
      values += std::holds_alternative<wire::pull_reply>(reply.msg) ? 1 : 0;
    job.replies.clear();
  }
  return values;
}

void expect_no_allocation_once_warm(shard_driver& job) {
  std::vector<ndarray> gradients;
  for (std::uint32_t worker = 0; worker < workers; ++worker)
    gradients.push_back(ndarray::full({1024}, 1.0 + worker)); // 4 KiB each
  BOOST_TEST_REQUIRE(job.init(key, ndarray::zeros({1024})));
  job.replies.clear();
  job.replies.reserve(16);

  constexpr std::uint64_t warm = 4, measured = 20;
  auto warming = pushpulls(0, warm, gradients);
  BOOST_TEST(run(job, warming) == warm * workers);
  auto steady = pushpulls(warm, warm + measured, gradients);
  const auto fresh_blocks = storage_pool::shared().stats().misses;
  std::size_t values = 0;
  std::size_t allocations = 0;
  {
    allocation_probe probe;
    values = run(job, steady);
    allocations = probe.count();
  }
  BOOST_TEST(values == measured * workers); // every pushpull was answered with its round's value
  BOOST_TEST(allocations == 0u);
  BOOST_TEST(storage_pool::shared().stats().misses == fresh_blocks);
  BOOST_TEST(job.shard->completed_rounds(key) == warm + measured);
}

/// Runs a worker_core of one server and is its output, with room for what it sends reserved: the
/// test answers each request itself.
struct worker_bench : worker_core::output {
  struct frame {
    envelope request;
    send_receipt receipt;
  };
  std::vector<frame> sent;
  worker_core core;

  worker_bench() : core(options(), *this) {
    sent.reserve(64);
    std::vector<std::string> names{"server 0"};
    core.on_links(std::move(names));
  }
  static worker_core_options options() {
    worker_core_options out;
    out.num_servers = 1;
    return out;
  }

  void send(std::uint32_t, envelope request, send_receipt receipt) override {
    sent.push_back({std::move(request), receipt});
  }
  void copy_elsewhere(std::uint64_t, std::function<std::pair<chunk_copy, std::string>()>) override {
    BOOST_FAIL("no reply of this test is large enough to be copied elsewhere");
  }
  void report_lost_later(std::uint64_t, std::string) override {}
  void relink(const wire::node_info&) override {}

  /// A pushpull of `keys` (each pushing `value` and pulling into its own output), built as the
  /// facade builds it.
  static kv_operation pushpull(std::span<const std::int64_t> keys, const ndarray& value,
                               std::span<const ndarray> outputs) {
    kv_operation op;
    op.call = kv_call::pushpull;
    op.what = "pushpull";
    op.keys.reserve(keys.size());
    for (std::size_t k = 0; k < keys.size(); ++k) {
      kv_key_work work;
      work.index = keys[k];
      work.name = std::to_string(keys[k]);
      work.shape = value.shape();
      work.type = value.dtype();
      work.value = value;
      work.outputs = {outputs[k]};
      op.keys.push_back(std::move(work));
    }
    return op;
  }

  /// Answers every pushpull sent so far with `value` as its round's result, batch by batch as
  /// they were sent, then lets the frames go.
  void answer_all(const wire::tensor_chunk& value) {
    const auto frames = sent.size();
    for (std::size_t i = 0; i < frames; ++i) {
      const auto& f = sent[i];
      auto answer = [&](const wire::pushpull& request) {
        auto tensor = value;
        envelope reply{
            wire::pull_reply{request.request_id, request.key, request.round + 1, std::move(tensor)},
            nullptr, 1};
        core.on_reply(reply);
      };
      if (const auto* one = std::get_if<wire::pushpull>(&f.request.msg))
        answer(*one);
      else if (const auto* fused = std::get_if<wire::batch>(&f.request.msg))
        for (const auto& each : fused->messages)
          answer(std::get<wire::pushpull>(each));
      else
        BOOST_FAIL("the worker sent " << wire::kind_name(f.request.msg));
    }
    // Let go of in the order they were sent, as the link does (which may send more).
    for (std::size_t i = 0; i < frames; ++i)
      core.frame_left(sent[i].receipt);
    sent.erase(sent.begin(), sent.begin() + static_cast<std::ptrdiff_t>(frames));
  }
};

wire::tensor_chunk whole_chunk(const ndarray& value) {
  wire::tensor_chunk tensor;
  tensor.type = to_wire(value.dtype());
  tensor.shape.assign(value.shape().begin(), value.shape().end());
  tensor.data = {static_cast<const std::byte*>(value.raw_data()), value.nbytes()};
  tensor.total_bytes = value.nbytes();
  return tensor;
}

bool all_ok(const std::vector<completion<status>>& calls) {
  return std::all_of(calls.begin(), calls.end(), [](const auto& done) {
    auto got = done.peek();
    return got && got->has_value();
  });
}

} // namespace

BOOST_AUTO_TEST_SUITE(steady_state_allocation)

BOOST_AUTO_TEST_CASE(a_warm_worker_allocates_nothing_for_pushpulls_of_one_small_key) {
  worker_bench worker;
  const auto gradient = ndarray::full({1024}, 2.0); // 4 KiB
  const auto result = ndarray::full({1024}, 5.0);
  const auto answer = whole_chunk(result);
  const std::int64_t key = 7;
  constexpr std::size_t warm = 4, measured = 20;
  std::vector<ndarray> outputs;
  std::vector<kv_operation> calls;
  std::vector<completion<status>> done;
  for (std::size_t c = 0; c < warm + measured; ++c) {
    outputs.push_back(ndarray::zeros({1024}));
    calls.push_back(worker_bench::pushpull({&key, 1}, gradient, {&outputs.back(), 1}));
    done.push_back(calls.back().done);
  }
  for (std::size_t c = 0; c < warm; ++c) {
    worker.core.on_call(calls[c]);
    worker.answer_all(answer);
  }
  std::size_t allocations = 0;
  {
    allocation_probe probe;
    for (std::size_t c = warm; c < warm + measured; ++c) {
      worker.core.on_call(calls[c]);
      worker.answer_all(answer);
    }
    allocations = probe.count();
  }
  BOOST_TEST(all_ok(done));
  BOOST_TEST(allocations == 0u);
  BOOST_TEST(worker.core.under_way() == 0u);
  for (const auto& output : outputs) // every pull's value landed in its output
    BOOST_TEST(output.to_vector<float>() == std::vector<float>(1024, 5.0f));
}

BOOST_AUTO_TEST_CASE(a_warm_worker_allocates_per_fused_frame_not_per_key_for_many_small_keys) {
  worker_bench worker;
  constexpr std::size_t keys = 2048;
  const auto gradient = ndarray::full({256}, 1.0); // 1 KiB: 256 to a fused frame of 256 KiB
  const auto result = ndarray::full({256}, 3.0);
  const auto answer = whole_chunk(result);
  std::vector<std::int64_t> indices(keys);
  for (std::size_t k = 0; k < keys; ++k)
    indices[k] = static_cast<std::int64_t>(k);
  constexpr std::size_t warm = 2, measured = 4;
  std::vector<std::vector<ndarray>> outputs;
  std::vector<kv_operation> calls;
  std::vector<completion<status>> done;
  for (std::size_t c = 0; c < warm + measured; ++c) {
    outputs.emplace_back();
    for (std::size_t k = 0; k < keys; ++k)
      outputs.back().push_back(ndarray::zeros({256}));
    calls.push_back(worker_bench::pushpull(indices, gradient, outputs.back()));
    done.push_back(calls.back().done);
  }
  for (std::size_t c = 0; c < warm; ++c) {
    worker.core.on_call(calls[c]);
    worker.answer_all(answer);
  }
  std::size_t allocations = 0, frames = 0;
  {
    allocation_probe probe;
    for (std::size_t c = warm; c < warm + measured; ++c) {
      worker.core.on_call(calls[c]);
      frames += worker.sent.size();
      worker.answer_all(answer);
    }
    allocations = probe.count();
  }
  BOOST_TEST(all_ok(done));
  BOOST_TEST(frames == measured * keys / 256); // fused, 256 keys to a frame
  // A fused frame's list of messages and of the values they view (and the list's control block):
  // three, however many keys the frame carries.
  BOOST_TEST(allocations <= 3 * frames);
  BOOST_TEST(worker.core.under_way() == 0u);
  for (const auto& output : outputs.back())
    BOOST_TEST(output.to_vector<float>() == std::vector<float>(256, 3.0f));
}

BOOST_AUTO_TEST_CASE(a_warm_shard_allocates_nothing_for_rounds_of_small_pushpulls) {
  shard_driver job{workers};
  expect_no_allocation_once_warm(job);
  // Without an optimizer each round's sum becomes the value: 1 + 2.
  BOOST_TEST(job.stored(key) == std::vector<float>(1024, 3.0f));
}

BOOST_AUTO_TEST_CASE(a_warm_shard_allocates_nothing_for_rounds_it_updates_with_sgd) {
  shard_driver job{workers};
  job.send(wire::set_optimizer{1, "sgd", {{"learning_rate", 0.5}}});
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  expect_no_allocation_once_warm(job);
  // Each of the 24 rounds moves the value by -0.5 * (1 + 2).
  BOOST_TEST(job.stored(key) == std::vector<float>(1024, -36.0f));
}

BOOST_AUTO_TEST_SUITE_END()
