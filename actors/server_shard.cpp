#include "actors/server_shard.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include <caf/event_based_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/wire_conversions.hpp"
#include "engine/serialize.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/half.hpp"

namespace troupe {
namespace {

envelope error_envelope(std::uint64_t request_id, std::optional<std::uint64_t> key,
                        wire::error_code code, std::string message) {
  return envelope{wire::error_reply{request_id, key, code, std::move(message)}, nullptr, 0};
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return shape_to_string(shape_vector(shape.begin(), shape.end()));
}

/// dst[i] += src[i] over `bytes` bytes of `type`.
void accumulate(std::byte* dst, const std::byte* src, std::size_t bytes, wire::dtype type) {
  switch (type) {
  case wire::dtype::float32: {
    auto n = bytes / sizeof(float);
    kernels::cpu::add(reinterpret_cast<const float*>(dst), reinterpret_cast<const float*>(src),
                      reinterpret_cast<float*>(dst), n);
    return;
  }
  case wire::dtype::float64: {
    auto n = bytes / sizeof(double);
    kernels::cpu::add(reinterpret_cast<const double*>(dst), reinterpret_cast<const double*>(src),
                      reinterpret_cast<double*>(dst), n);
    return;
  }
  case wire::dtype::int32: {
    auto n = bytes / sizeof(std::int32_t);
    kernels::cpu::add(reinterpret_cast<const std::int32_t*>(dst),
                      reinterpret_cast<const std::int32_t*>(src),
                      reinterpret_cast<std::int32_t*>(dst), n);
    return;
  }
  case wire::dtype::int64: {
    auto n = bytes / sizeof(std::int64_t);
    kernels::cpu::add(reinterpret_cast<const std::int64_t*>(dst),
                      reinterpret_cast<const std::int64_t*>(src),
                      reinterpret_cast<std::int64_t*>(dst), n);
    return;
  }
  case wire::dtype::float16: {
    using half = kernels::cpu::half_bits;
    const half* inputs[2] = {reinterpret_cast<const half*>(dst),
                             reinterpret_cast<const half*>(src)};
    kernels::cpu::sum_n_half(inputs, 2, reinterpret_cast<half*>(dst), bytes / sizeof(half));
    return;
  }
  }
}

/// A buffer like `like` that nobody else reads: `buffer` itself when it is unshared and fits.
void make_writable(ndarray& buffer, const ndarray& like) {
  if (buffer.is_none() || buffer.storage_is_shared() || buffer.shape() != like.shape() ||
      buffer.dtype() != like.dtype())
    buffer = ndarray::empty(like.shape(), context::cpu(), like.dtype());
}

} // namespace

shard_core::shard_core(shard_options options) : options_(options) {}

void shard_core::handle(envelope request, reply_function reply) {
  // Replies leave by the connection the request came in on.
  auto connection = request.connection;
  reply_function routed = [connection, reply = std::move(reply)](envelope out) {
    out.connection = connection;
    reply(std::move(out));
  };
  auto& msg = request.msg;
  if (auto* init = std::get_if<wire::init>(&msg)) {
    on_init(*init, routed);
  } else if (auto* push = std::get_if<wire::push>(&msg)) {
    on_push(push->request_id, push->key, push->sender_rank, push->round, push->tensor, false,
            request, routed);
  } else if (auto* pushpull = std::get_if<wire::pushpull>(&msg)) {
    on_push(pushpull->request_id, pushpull->key, pushpull->sender_rank, pushpull->round,
            pushpull->tensor, true, request, routed);
  } else if (auto* pull = std::get_if<wire::pull_request>(&msg)) {
    on_pull(*pull, routed);
  } else if (auto* optimizer = std::get_if<wire::set_optimizer>(&msg)) {
    on_set_optimizer(*optimizer, routed);
  } else if (auto* command = std::get_if<wire::command>(&msg)) {
    on_command(*command, routed);
  } else {
    routed(error_envelope(0, std::nullopt, wire::error_code::unsupported,
                          "a server shard does not take " + std::string{wire::kind_name(msg)} +
                              " messages"));
  }
}

void shard_core::on_init(const wire::init& msg, const reply_function& reply) {
  auto& tensor = msg.tensor;
  auto found = keys_.find(msg.key);
  if (found != keys_.end() && found->second.initialized) {
    reply(error_envelope(msg.request_id, msg.key, wire::error_code::already_initialized,
                         "init of key " + std::to_string(msg.key) + ", which is initialised"));
    return;
  }
  if (found == keys_.end()) {
    key_entry entry;
    shape_vector shape(tensor.shape.begin(), tensor.shape.end());
    entry.stored = ndarray::empty(shape, context::cpu(), from_wire(tensor.type));
    auto bytes = std::span{static_cast<std::byte*>(entry.stored.raw_data()), entry.stored.nbytes()};
    entry.init_assembly.emplace(bytes, tensor.type, tensor.shape);
    found = keys_.emplace(msg.key, std::move(entry)).first;
  }
  auto& entry = found->second;
  auto added = entry.init_assembly->add(tensor);
  if (!added) {
    reply(error_envelope(msg.request_id, msg.key, wire::error_code::invalid_argument,
                         "init of key " + std::to_string(msg.key) + ": " + added.error().message));
    if (entry.init_assembly->bytes_received() == 0)
      keys_.erase(found); // nothing of it arrived: as if never begun
    return;
  }
  if (*added) {
    entry.initialized = true;
    entry.init_assembly.reset();
    entry.worker_bytes.assign(options_.num_workers, 0);
    entry.worker_done.assign(options_.num_workers, false);
    reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
  }
}

void shard_core::on_push(std::uint64_t request_id, std::uint64_t key, std::uint32_t sender,
                         std::uint64_t round, const wire::tensor_chunk& tensor, bool then_pull,
                         envelope& request, const reply_function& reply) {
  auto found = keys_.find(key);
  if (found == keys_.end() || !found->second.initialized) {
    reply(error_envelope(request_id, key, wire::error_code::unknown_key,
                         "push of key " + std::to_string(key) + ", which was never initialised"));
    return;
  }
  auto& entry = found->second;
  auto declared_type = to_wire(entry.stored.dtype());
  const auto& declared_shape = entry.stored.shape();
  if (tensor.type != declared_type) {
    reply(error_envelope(request_id, key, wire::error_code::dtype_mismatch,
                         "push of key " + std::to_string(key) + ": dtype " +
                             std::string{wire::to_string(tensor.type)} + ", init declared " +
                             std::string{wire::to_string(declared_type)}));
    return;
  }
  if (!std::equal(tensor.shape.begin(), tensor.shape.end(), declared_shape.begin(),
                  declared_shape.end())) {
    reply(error_envelope(request_id, key, wire::error_code::shape_mismatch,
                         "push of key " + std::to_string(key) + ": shape " +
                             shape_text(tensor.shape) + ", init declared " +
                             shape_to_string(declared_shape)));
    return;
  }
  if (sender >= options_.num_workers) {
    reply(error_envelope(request_id, key, wire::error_code::invalid_argument,
                         "push of key " + std::to_string(key) + " from worker rank " +
                             std::to_string(sender) + "; the job has " +
                             std::to_string(options_.num_workers) + " workers"));
    return;
  }
  auto total = entry.stored.nbytes();
  auto* data = tensor.data.data();
  auto length = tensor.data.size();

  auto on_complete = [&](std::uint64_t completed_round) {
    if (then_pull)
      entry.pulls.push_back({request_id, completed_round, reply});
    else
      reply(envelope{wire::ack{request_id}, nullptr, 0});
  };

  if (options_.mode == consistency::async) {
    auto& slot = entry.async_pushes[sender];
    if (slot.bytes == 0)
      make_writable(slot.buffer, entry.stored);
    if (tensor.offset + length > total || slot.bytes + length > total) {
      reply(error_envelope(request_id, key, wire::error_code::invalid_argument,
                           "push of key " + std::to_string(key) + ": more bytes than the value's " +
                               std::to_string(total)));
      return;
    }
    if (length > 0)
      std::memcpy(static_cast<std::byte*>(slot.buffer.raw_data()) + tensor.offset, data, length);
    slot.bytes += length;
    if (slot.bytes == total) {
      slot.bytes = 0;
      apply(key, entry, slot.buffer);
      ++entry.completed;
      on_complete(entry.completed);
      answer_pulls(key, entry);
    }
    return;
  }

  // dist_sync
  if (round < entry.completed) {
    reply(error_envelope(request_id, key, wire::error_code::stale_round,
                         "push of key " + std::to_string(key) + " for round " +
                             std::to_string(round) + " from worker " + std::to_string(sender) +
                             ", but " + std::to_string(entry.completed) + " rounds are complete"));
    return;
  }
  if (round > entry.completed || entry.worker_done[sender]) {
    if (round == entry.completed) {
      reply(error_envelope(request_id, key, wire::error_code::invalid_argument,
                           "worker " + std::to_string(sender) + " pushed round " +
                               std::to_string(round) + " of key " + std::to_string(key) +
                               " twice"));
      return;
    }
    entry.later_rounds.push_back({std::move(request), reply});
    return;
  }
  if (tensor.offset + length > total || entry.worker_bytes[sender] + length > total) {
    reply(error_envelope(request_id, key, wire::error_code::invalid_argument,
                         "push of key " + std::to_string(key) + ": more bytes than the value's " +
                             std::to_string(total)));
    return;
  }
  auto& chunk = entry.chunks[tensor.offset];
  if (chunk.contributors > 0 && chunk.length != length) {
    reply(error_envelope(request_id, key, wire::error_code::invalid_argument,
                         "push of key " + std::to_string(key) + ": chunk at byte " +
                             std::to_string(tensor.offset) + " has " + std::to_string(length) +
                             " bytes, other workers sent " + std::to_string(chunk.length)));
    return;
  }
  if (!entry.round_open) {
    make_writable(entry.merge, entry.stored);
    entry.round_open = true;
  }
  auto* merged = static_cast<std::byte*>(entry.merge.raw_data()) + tensor.offset;
  if (chunk.contributors == 0) {
    chunk.length = length;
    if (length > 0)
      std::memcpy(merged, data, length);
  } else if (length > 0) {
    accumulate(merged, data, length, declared_type);
  }
  ++chunk.contributors;
  entry.worker_bytes[sender] += length;
  if (entry.worker_bytes[sender] == total) {
    entry.worker_done[sender] = true;
    ++entry.workers_done;
    on_complete(round + 1);
  }
  if (entry.workers_done == options_.num_workers)
    finish_round(key, entry);
}

void shard_core::apply(std::uint64_t key, key_entry& entry, ndarray& received) {
  if (updater_) {
    if (entry.stored.storage_is_shared())
      entry.stored = entry.stored.copy();
    (*updater_)(static_cast<std::int64_t>(key), received, entry.stored);
  } else {
    // Replace: the received buffer becomes the value; the old value's buffer is reused for the
    // next round unless a reply still reads it (make_writable checks).
    std::swap(entry.stored, received);
  }
}

void shard_core::finish_round(std::uint64_t key, key_entry& entry) {
  apply(key, entry, entry.merge);
  ++entry.completed;
  std::fill(entry.worker_bytes.begin(), entry.worker_bytes.end(), 0);
  std::fill(entry.worker_done.begin(), entry.worker_done.end(), false);
  entry.workers_done = 0;
  entry.round_open = false;
  entry.chunks.clear();
  answer_pulls(key, entry);
  // Pushes that arrived early for the round now open go in, in arrival order.
  auto waiting = std::move(entry.later_rounds);
  entry.later_rounds.clear();
  for (auto& deferred : waiting)
    handle(std::move(deferred.request), std::move(deferred.reply));
}

void shard_core::answer_pulls(std::uint64_t key, key_entry& entry) {
  std::vector<pending_pull> still_waiting;
  for (auto& pull : entry.pulls) {
    if (options_.mode == consistency::async || pull.round <= entry.completed)
      send_value(key, entry, pull.request_id, pull.reply);
    else
      still_waiting.push_back(std::move(pull));
  }
  entry.pulls = std::move(still_waiting);
}

void shard_core::on_pull(const wire::pull_request& msg, const reply_function& reply) {
  auto found = keys_.find(msg.key);
  if (found == keys_.end() || !found->second.initialized) {
    reply(
        error_envelope(msg.request_id, msg.key, wire::error_code::unknown_key,
                       "pull of key " + std::to_string(msg.key) + ", which was never initialised"));
    return;
  }
  auto& entry = found->second;
  if (options_.mode == consistency::async || msg.round <= entry.completed)
    send_value(msg.key, entry, msg.request_id, reply);
  else
    entry.pulls.push_back({msg.request_id, msg.round, reply});
}

void shard_core::send_value(std::uint64_t key, const key_entry& entry, std::uint64_t request_id,
                            const reply_function& reply) const {
  const auto& value = entry.stored;
  wire::tensor_chunk tensor;
  tensor.type = to_wire(value.dtype());
  tensor.shape.assign(value.shape().begin(), value.shape().end());
  tensor.total_bytes = value.nbytes();
  tensor.data = std::span{static_cast<const std::byte*>(value.raw_data()), value.nbytes()};
  wire::chunker chunks{wire::pull_reply{request_id, key, entry.completed, std::move(tensor)},
                       options_.chunk_bytes};
  auto keepalive = value.keepalive();
  for (std::size_t i = 0; i < chunks.chunk_count(); ++i)
    reply(envelope{chunks.chunk(i), keepalive, 0});
}

void shard_core::on_set_optimizer(const wire::set_optimizer& msg, const reply_function& reply) {
  optimizer_params params;
  for (const auto& param : msg.params)
    params[param.name] = param.value;
  auto created = optimizer::create(msg.name, params);
  if (!created) {
    reply(error_envelope(msg.request_id, std::nullopt, wire::error_code::invalid_argument,
                         created.error().message()));
    return;
  }
  updater_ = std::make_unique<updater>(std::move(*created));
  reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
}

std::string shard_core::checkpoint_path(const std::string& base) const {
  return base + ".shard" + std::to_string(options_.shard_index);
}

void shard_core::on_command(const wire::command& msg, const reply_function& reply) {
  auto fail = [&](const error& err) {
    reply(error_envelope(msg.request_id, std::nullopt, wire::error_code::invalid_argument,
                         err.message()));
  };
  if (msg.kind == wire::command_kind::stop) {
    reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
    return;
  }
  if (msg.kind == wire::command_kind::sync_mode || msg.kind == wire::command_kind::async_mode) {
    options_.mode =
        msg.kind == wire::command_kind::sync_mode ? consistency::sync : consistency::async;
    reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
    return;
  }
  if (!updater_) {
    fail(error{errc::invalid_argument,
               "optimizer states live on the servers only after set_optimizer"});
    return;
  }
  auto path = checkpoint_path(msg.path);
  if (msg.kind == wire::command_kind::save_checkpoint) {
    if (auto written = write_file(path, updater_->save_states(true)); !written) {
      fail(written.error());
      return;
    }
  } else {
    auto bytes = read_file(path);
    if (!bytes) {
      fail(bytes.error());
      return;
    }
    if (auto loaded = updater_->load_states(*bytes); !loaded) {
      fail(error{loaded.error().code(), path + ": " + loaded.error().message()});
      return;
    }
  }
  reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
}

std::uint64_t shard_core::completed_rounds(std::uint64_t ps_key) const {
  auto found = keys_.find(ps_key);
  return found == keys_.end() ? 0 : found->second.completed;
}

ndarray shard_core::value(std::uint64_t ps_key) const {
  auto found = keys_.find(ps_key);
  return found == keys_.end() ? ndarray{} : found->second.stored;
}

namespace {

struct shard_actor_state {
  std::unique_ptr<shard_core> core;
  static inline const char* name = "troupe.server_shard";
};

caf::behavior shard_behavior(caf::stateful_actor<shard_actor_state>* self, shard_options options) {
  self->state.core = std::make_unique<shard_core>(options);
  return {
      [self](envelope& request, const caf::actor& reply_to) {
        self->state.core->handle(std::move(request), [self, reply_to](envelope out) {
          self->send(reply_to, std::move(out));
        });
      },
  };
}

} // namespace

caf::actor spawn_server_shard(caf::actor_system& system, shard_options options) {
  return system.spawn(shard_behavior, options);
}

} // namespace troupe
