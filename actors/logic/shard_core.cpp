#include "actors/logic/shard_core.hpp"

#include <algorithm>
#include <exception>
#include <limits>
#include <sys/mman.h>
#include <utility>

#include "actors/logic/job_trace.hpp"
#include "actors/logic/key_placement.hpp"
#include "actors/logic/wire_conversions.hpp"
#include "engine/serialize.hpp"
#include "schema/codec.hpp"

namespace troupe {
namespace {

envelope error_envelope(std::uint64_t request_id, std::optional<std::uint64_t> key,
                        wire::error_code code, std::string message) {
  return envelope{wire::error_reply{request_id, key, code, std::move(message)}, nullptr, 0};
}

std::string shape_text(const wire::tensor_shape& shape) {
  return shape_to_string(shape_vector(shape.begin(), shape.end()));
}

std::string describe(const sync_policy& policy, std::uint32_t num_workers) {
  if (policy.mode == consistency::async)
    return policy.max_staleness < 0
               ? std::string{"dist_async"}
               : "dist_async with max_staleness " + std::to_string(policy.max_staleness);
  return "dist_sync, quorum " + std::to_string(policy.quorum) + " of " +
         std::to_string(num_workers) + (policy.rescale_quorum ? " rescaled" : "") +
         ", max_rounds_ahead " + std::to_string(policy.max_rounds_ahead);
}

/// The policy a sync_settings message asks for, or why a job of `num_workers` cannot have it.
result<sync_policy> policy_from(const wire::sync_settings& msg, std::uint32_t num_workers) {
  auto refused = [](std::string why) {
    return error{errc::invalid_argument, "sync_settings: " + why};
  };
  if (msg.quorum < 1 || msg.quorum > num_workers)
    return refused("quorum " + std::to_string(msg.quorum) + " for a job of " +
                   std::to_string(num_workers) + " workers (1.." + std::to_string(num_workers) +
                   ")");
  if (msg.max_rounds_ahead < 1)
    return refused("max_rounds_ahead 0 (at least 1)");
  if (msg.max_staleness < -1)
    return refused("max_staleness " + std::to_string(msg.max_staleness) + " (-1 or >= 0)");
  if (msg.mode == consistency::sync && msg.max_staleness >= 0)
    return refused("max_staleness " + std::to_string(msg.max_staleness) +
                   " with dist_sync (it bounds dist_async)");
  return sync_policy{msg.mode, msg.quorum, msg.rescale_quorum, msg.max_staleness,
                     msg.max_rounds_ahead};
}

/// Values that arrive in several chunks from this size on are received into memory filled on
/// demand; smaller ones into pooled memory (committed whole, but small), so that a job of many
/// small keys does not make as many mappings.
constexpr std::uint64_t filled_on_demand_min_bytes = std::uint64_t{64} << 10;

/// Memory for a value of `bytes` bytes that arrives in chunks: a fresh private anonymous mapping,
/// whose pages the system commits one by one as chunks are first copied into them (an untouched
/// page reads as zeros), unmapped when the last handle goes. Pooled memory (ndarray::empty) is
/// committed whole at once: the pool pre-faults its new blocks and keeps freed ones. Falls back
/// to the pool when no mapping can be made (address space, the map count).
/// What a tensor that reached the shard by an in-process link is checked against: the codec's
/// rules, with no size limit (the key's declaration bounds it).
wire::decode_limits in_process_limits() {
  wire::decode_limits limits;
  limits.max_tensor_bytes = std::numeric_limits<std::uint64_t>::max();
  return limits;
}

ndarray filled_on_demand(const shape_vector& shape, dtype type, std::uint64_t bytes) {
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (at == MAP_FAILED)
    return ndarray::empty(shape, context::cpu(), type);
  std::shared_ptr<const void> mapping(
      at, [bytes](const void* pages) { ::munmap(const_cast<void*>(pages), bytes); });
  return ndarray::borrow(at, shape, type, std::move(mapping));
}

} // namespace

std::uint64_t shard_core::key_entry::completed() const noexcept {
  if (sync)
    return sync->completed();
  if (sparse)
    return sparse->completed();
  return async ? async->applied() : 0;
}

std::uint64_t shard_core::key_entry::durable_for(std::uint32_t worker) const noexcept {
  if (!async)
    return durable;
  return worker < durable_pushes.size() ? durable_pushes[worker] : 0;
}

std::uint64_t shard_core::durable_for(const key_entry& entry, std::uint32_t worker) const {
  if (!options_.checkpoint.dir.empty())
    return entry.durable_for(worker);
  // No files: what the shard has applied is what a hand-over of the key carries.
  return entry.async ? entry.async->pushes_of(worker) : entry.completed();
}

shard_core::shard_core(shard_options options)
    : options_(std::move(options)), policy_(options_.policy) {
  live_.assign(capacity(), false);
  member_.assign(capacity(), false);
  for (std::uint32_t w = 0; w < options_.num_workers; ++w)
    live_[w] = member_[w] = true;
  left_.assign(capacity(), false);
  sender_connection_.assign(capacity(), 0);
  moved_ranges_.assign(num_ranges(), false);
  if (policy_.quorum == 0)
    policy_.quorum = options_.num_workers;
  last_checkpoint_ = now();
}

shard_core::~shard_core() {
  // A shard that checkpoints leaves its last state on disk when it stops.
  try {
    (void)finish_checkpoint();
    if (options_.checkpoint.periodic() && changed_since_checkpoint_)
      (void)write_checkpoint();
  } catch (...) {
    // Nothing more can be done for the file; the shard is going away.
  }
}

// --- requests ------------------------------------------------------------------------------------

void shard_core::handle(envelope request, reply_function reply) noexcept {
  try {
    // Replies leave by the connection the request came in on.
    const reply_route routed{std::move(reply), request.connection};
    auto failed = [&](const char* what) {
      auto id = wire::request_id_of(request.msg);
      auto key = wire::key_of(request.msg);
      refuse(routed, id, key, wire::error_code::internal,
             std::string{wire::kind_name(request.msg)} + " request " + std::to_string(id) +
                 (key ? " of key " + std::to_string(*key) : std::string{}) +
                 " failed on server shard " + std::to_string(options_.shard_index) + ": " + what);
    };
    try {
      const auto updates_before = stats_.updates;
      dispatch(request, routed);
      if (stats_.updates != updates_before)
        after_update();
    } catch (const std::exception& e) {
      failed(e.what());
    } catch (...) {
      failed("an exception of unknown type");
    }
  } catch (...) {
    // Not even the error reply could be made (memory is exhausted): the request goes unanswered
    // and expires at its sender, but the shard keeps serving.
  }
}

void shard_core::dispatch(envelope& request, const reply_route& reply) {
  auto& msg = request.msg;
  if (ranges_away_ > 0)
    if (auto key = wire::key_of(msg))
      if (auto why = moved_away(*key)) {
        refuse(reply, wire::request_id_of(msg), key, wire::error_code::moved, std::move(*why));
        return;
      }
  if (auto* init = std::get_if<wire::init>(&msg)) {
    on_init(*init, reply);
  } else if (auto* push = std::get_if<wire::push>(&msg)) {
    on_push(
        {push->request_id, push->key, push->sender_rank, push->round, false, 0, {}, push->resent},
        push->tensor, reply);
  } else if (auto* pushpull = std::get_if<wire::pushpull>(&msg)) {
    on_push({pushpull->request_id, pushpull->key, pushpull->sender_rank, pushpull->round, true,
             pushpull->timeout_ms, now(), pushpull->resent, from_wire(pushpull->reply_compression)},
            pushpull->tensor, reply);
  } else if (auto* pull = std::get_if<wire::pull_request>(&msg)) {
    on_pull(*pull, reply);
  } else if (auto* optimizer = std::get_if<wire::set_optimizer>(&msg)) {
    on_set_optimizer(*optimizer, reply);
  } else if (auto* settings = std::get_if<wire::sync_settings>(&msg)) {
    on_sync_settings(*settings, reply);
  } else if (auto* compression = std::get_if<wire::set_gradient_compression>(&msg)) {
    on_set_gradient_compression(*compression, reply);
  } else if (auto* command = std::get_if<wire::command>(&msg)) {
    on_command(*command, reply);
  } else if (auto* moved = std::get_if<wire::range_data>(&msg)) {
    on_range_data(*moved, reply);
  } else {
    refuse(reply, wire::request_id_of(msg), std::nullopt, wire::error_code::unsupported,
           "a server shard does not take " + std::string{wire::kind_name(msg)} + " messages");
  }
}

void shard_core::refuse(const reply_route& reply, std::uint64_t request_id,
                        std::optional<std::uint64_t> key, wire::error_code code,
                        std::string message) {
  ++stats_.requests_refused;
  options_.log.debug([&] { return "refused: " + message; });
  reply(error_envelope(request_id, key, code, std::move(message)));
}

void shard_core::on_init(const wire::init& msg, const reply_route& reply) {
  auto& tensor = msg.tensor;
  auto name = [&] { return "init of key " + std::to_string(msg.key); };
  if (tensor.compression.type != wire::compression_type::none) {
    refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
           name() + ": " + std::string{wire::to_string(tensor.compression.type)} +
               " compressed; an init carries the value itself");
    return;
  }
  auto found = keys_.find(msg.key);
  if (found != keys_.end() && found->second.initialized()) {
    refuse(reply, msg.request_id, msg.key, wire::error_code::already_initialized,
           name() + ", which is initialised");
    return;
  }
  if (found == keys_.end()) {
    // Checked before anything is allocated: the value's size is the peer's to choose.
    wire::decode_limits limits;
    limits.max_tensor_bytes = options_.max_value_bytes;
    if (auto invalid = wire::validate_tensor(tensor, limits)) {
      refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
             name() + ": " + invalid->message + " (data.max_value_bytes)");
      return;
    }
    if (auto over = reserve_store(tensor.total_bytes)) {
      refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
             name() + ": " + *over);
      return;
    }
    try {
      // Its index entry first: a key in keys_ is always in index_.
      auto& indexed = index_[msg.key];
      try {
        found = keys_.emplace(msg.key, begin_init(tensor, reply.connection)).first;
      } catch (...) {
        index_.erase(msg.key);
        throw;
      }
      indexed = &found->second;
    } catch (...) {
      release_store(tensor.total_bytes);
      throw;
    }
    unfinished_inits_.insert(msg.key);
  } else if (found->second.init_connection != reply.connection) {
    const auto& under_way = *found->second.init_assembly;
    refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
           name() + ": another connection began it (" + std::to_string(under_way.bytes_received()) +
               " of " + std::to_string(under_way.destination().size()) +
               " bytes arrived); only that one may continue it");
    return;
  }
  auto& entry = found->second;
  if (tensor.offset == 0 && entry.init_assembly->bytes_received() == 0)
    entry.row_sparse = msg.row_sparse;
  if (msg.row_sparse != entry.row_sparse || (msg.row_sparse && tensor.shape.empty())) {
    refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
           name() + (msg.row_sparse ? (tensor.shape.empty() ? ": row-sparse, of a scalar"
                                                            : ": row-sparse in one chunk only")
                                    : ": dense in one chunk, row-sparse in another"));
    if (entry.init_assembly->bytes_received() == 0)
      forget_init(found);
    return;
  }
  auto& assembly = *entry.init_assembly;
  // In order, like a push's: so the pages committed are those the arrived bytes fill.
  auto added = tensor.offset == assembly.bytes_received()
                   ? assembly.add(tensor)
                   : wire::result<bool>{wire::decode_error{
                         wire::decode_error::code::chunk_out_of_range,
                         "chunk at byte " + std::to_string(tensor.offset) + ", expected byte " +
                             std::to_string(assembly.bytes_received()) +
                             " (an init's chunks come in order, once)"}};
  if (!added) {
    refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
           name() + ": " + added.error().message);
    if (assembly.bytes_received() == 0)
      forget_init(found); // nothing of it arrived: as if never begun
    return;
  }
  entry.init_progress = now();
  if (!*added)
    return;
  open_rounds(entry, msg.key, 0);
  if (entry.sparse)
    entry.sparse->merge_in_float32(multi_precision());
  if (entry.sync)
    entry.sync->merge_in_float32(multi_precision());
  entry.init_assembly.reset();
  unfinished_inits_.erase(msg.key);
  reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
}

void shard_core::open_rounds(key_entry& entry, std::uint64_t key, std::uint64_t completed,
                             const round_membership* known) {
  const sync_round_options rounds{key, options_.num_workers, policy_.quorum,
                                  policy_.max_rounds_ahead, capacity()};
  if (policy_.mode == consistency::async) {
    entry.async.emplace(key, entry.stored, capacity());
    return;
  }
  if (entry.row_sparse)
    entry.sparse.emplace(entry.stored, rounds);
  else
    entry.sync.emplace(entry.stored, rounds);
  entry.with_rounds([&](auto& opened) {
    opened.resume_after(completed);
    if (known != nullptr)
      opened.take_membership(*known);
    // Workers that joined before the key existed (or, for a key taken over, since it left its
    // old server) count from its first round open; those that left count in none of its rounds.
    for (std::uint32_t worker = options_.num_workers; worker < member_.size(); ++worker)
      if (member_[worker])
        opened.admit(worker);
    for (std::uint32_t worker = 0; worker < left_.size(); ++worker)
      if (left_[worker])
        opened.retire(worker);
  });
}

void shard_core::retire_worker(std::uint32_t worker) {
  left_[worker] = true;
  std::optional<std::uint64_t> earliest;
  std::uint64_t latest = 0;
  std::size_t closed = 0;
  for (auto& [key, entry] : keys_) {
    if (!entry.initialized() || entry.async)
      continue;
    const auto end = entry.with_rounds([&](auto& rounds) { return rounds.retire(worker); });
    earliest = std::min(earliest.value_or(end), end);
    latest = std::max(latest, end);
    // The round being collected may have waited for this worker only.
    if (entry.with_rounds([](auto& rounds) { return rounds.quorum_reached(); })) {
      (void)close_round(entry, key); // a failed update is logged; no push waits for its answer
      admit_deferred(entry, key);
      ++closed;
    }
  }
  options_.log.info(
      "worker " + std::to_string(worker) + " left the job" +
      (!earliest
           ? std::string{}
           : ": its keys' rounds close without it from round " +
                 (*earliest == latest ? std::to_string(latest)
                                      : std::to_string(*earliest) + ".." + std::to_string(latest)) +
                 " on") +
      (closed > 0 ? " (" + std::to_string(closed) + " rounds that waited only for it closed)"
                  : std::string{}));
}

void shard_core::admit_worker(std::uint32_t worker) {
  member_[worker] = true;
  std::optional<std::uint64_t> earliest;
  std::uint64_t latest = 0;
  for (auto& [key, entry] : keys_) {
    if (!entry.initialized())
      continue;
    if (entry.async) {
      // Bounded staleness counts its pushes from the slowest other worker's.
      const auto slowest = entry.async->slowest(live_);
      entry.async->admit(worker,
                         slowest == std::numeric_limits<std::uint64_t>::max() ? 0 : slowest);
      continue;
    }
    const auto first = entry.with_rounds([&](auto& rounds) { return rounds.admit(worker); });
    earliest = std::min(earliest.value_or(first), first);
    latest = std::max(latest, first);
  }
  live_[worker] = true;
  options_.log.info("worker " + std::to_string(worker) + " joined the job" +
                    (!earliest ? std::string{}
                               : ": its keys' rounds count it from round " +
                                     (*earliest == latest ? std::to_string(latest)
                                                          : std::to_string(*earliest) + ".." +
                                                                std::to_string(latest)) +
                                     " on"));
}

std::optional<std::string> shard_core::not_a_member(std::uint32_t sender) const {
  if (sender >= capacity())
    return "worker rank " + std::to_string(sender) + " is beyond the job's " +
           std::to_string(capacity()) + " worker ranks" +
           (capacity() > options_.num_workers ? std::string{" (job.max_workers)"} : std::string{});
  if (!member_[sender])
    return "worker rank " + std::to_string(sender) +
           " is not a member of the job (it has not joined, or this server has not heard so yet)";
  return std::nullopt;
}

shard_core::key_entry shard_core::begin_init(const wire::tensor_chunk& first,
                                             std::uint64_t connection) {
  key_entry entry;
  shape_vector shape(first.shape.begin(), first.shape.end());
  const auto type = from_wire(first.type);
  // A value that comes whole in its first chunk is copied at once: pooled memory, as any array.
  const bool whole = first.offset == 0 && first.data.size() == first.total_bytes;
  entry.stored = whole || first.total_bytes < filled_on_demand_min_bytes
                     ? ndarray::empty(shape, context::cpu(), type)
                     : filled_on_demand(shape, type, first.total_bytes);
  auto bytes = std::span{static_cast<std::byte*>(entry.stored.raw_data()), entry.stored.nbytes()};
  entry.init_assembly.emplace(bytes, first.type, first.shape);
  entry.init_connection = connection;
  entry.init_progress = now();
  return entry;
}

void shard_core::forget_init(std::map<std::uint64_t, key_entry>::iterator entry) noexcept {
  release_store(entry->second.init_assembly->destination().size());
  unfinished_inits_.erase(entry->first);
  index_.erase(entry->first);
  last_found_ = nullptr;
  keys_.erase(entry); // the last handle of its memory
}

void shard_core::drop_init(std::map<std::uint64_t, key_entry>::iterator entry,
                           const char* why) noexcept {
  const auto key = entry->first;
  const auto received = entry->second.init_assembly->bytes_received();
  const auto declared = entry->second.init_assembly->destination().size();
  forget_init(entry);
  ++stats_.inits_dropped;
  try {
    options_.log.info("init of key " + std::to_string(key) + " dropped after " +
                      std::to_string(received) + " of " + std::to_string(declared) +
                      " bytes: " + why);
  } catch (...) {
    // The line could not be made (memory is exhausted); the init is gone all the same.
  }
}

std::size_t shard_core::drop_stalled_inits() noexcept {
  if (options_.stalled_init.count() <= 0)
    return 0;
  std::size_t dropped = 0;
  const auto at = now();
  for (auto key = unfinished_inits_.begin(); key != unfinished_inits_.end();) {
    auto entry = keys_.find(*key++); // drop_init erases the key from the set
    if (entry != keys_.end() && at - entry->second.init_progress >= options_.stalled_init) {
      drop_init(entry, "none of its chunks came for timeouts.stalled_frame");
      ++dropped;
    }
  }
  return dropped;
}

std::size_t shard_core::on_connection_closed(std::uint64_t connection) noexcept {
  if (connection == 0)
    return 0; // in-process links never close as connections do
  incoming_.erase(connection);
  std::size_t dropped = 0;
  for (auto key = unfinished_inits_.begin(); key != unfinished_inits_.end();) {
    auto entry = keys_.find(*key++); // drop_init erases the key from the set
    if (entry != keys_.end() && entry->second.init_connection == connection) {
      drop_init(entry, "its connection closed");
      ++dropped;
    }
  }
  for (std::uint32_t worker = 0; worker < sender_connection_.size(); ++worker) {
    if (sender_connection_[worker] != connection)
      continue;
    sender_connection_[worker] = 0;
    for (auto& [key, entry] : keys_) {
      // A row-sparse push comes whole: nothing of it is ever unfinished.
      if (entry.sync)
        entry.sync->forget_unfinished(worker);
      else if (entry.async)
        entry.async->forget_unfinished(worker);
    }
  }
  return dropped;
}

std::optional<std::string> shard_core::reserve_store(std::uint64_t bytes) {
  if (!options_.store_bytes)
    return std::nullopt;
  auto& used = *options_.store_bytes;
  auto before = used.load(std::memory_order_relaxed);
  do {
    if (bytes > options_.max_store_bytes || before > options_.max_store_bytes - bytes)
      return "its " + std::to_string(bytes) + " bytes would take this server's keys from " +
             std::to_string(before) + " to more than their budget of " +
             std::to_string(options_.max_store_bytes) + " bytes (data.max_store_bytes)";
  } while (!used.compare_exchange_weak(before, before + bytes, std::memory_order_relaxed));
  return std::nullopt;
}

void shard_core::release_store(std::uint64_t bytes) noexcept {
  if (options_.store_bytes)
    options_.store_bytes->fetch_sub(bytes, std::memory_order_relaxed);
}

bool shard_core::multi_precision() const noexcept {
  return updater_ && updater_->optimizer().multi_precision();
}

/// Under multi_precision the rounds of float16 keys sum in float32 from their next round, as
/// MXNet's server does (kSetMultiPrecision), so that the update sees the exact sum.
void shard_core::sum_in_optimizer_precision() noexcept {
  for (auto& [key, entry] : keys_) {
    if (entry.sync)
      entry.sync->merge_in_float32(multi_precision());
    if (entry.sparse)
      entry.sparse->merge_in_float32(multi_precision());
  }
}

shard_core::key_entry* shard_core::find_key(std::uint64_t key) const noexcept {
  if (last_found_ != nullptr && last_found_key_ == key)
    return last_found_;
  auto found = index_.find(key);
  if (found == index_.end())
    return nullptr;
  last_found_ = found->second;
  last_found_key_ = key;
  return last_found_;
}

shard_core::key_entry* shard_core::usable_key(std::uint64_t key, std::uint64_t request_id,
                                              const char* what, const reply_route& reply) {
  auto* entry = find_key(key);
  if (entry == nullptr || !entry->initialized()) {
    refuse(reply, request_id, key, wire::error_code::unknown_key,
           std::string{what} + " of key " + std::to_string(key) + ", which was never initialised");
    return nullptr;
  }
  return entry;
}

// --- pushes --------------------------------------------------------------------------------------

void shard_core::on_push(const push_request& push, const wire::tensor_chunk& tensor,
                         const reply_route& reply) {
  const char* what = push.then_pull ? "pushpull" : "push";
  auto* entry = usable_key(push.key, push.request_id, what, reply);
  if (entry == nullptr)
    return;
  // Built only for an error: a push that passes costs no string.
  auto name = [&] { return std::string{what} + " of key " + std::to_string(push.key); };
  auto declared_type = to_wire(entry->stored.dtype());
  const auto& declared_shape = entry->stored.shape();
  if (tensor.type != declared_type) {
    refuse(reply, push.request_id, push.key, wire::error_code::dtype_mismatch,
           name() + ": dtype " + std::string{wire::to_string(tensor.type)} + ", init declared " +
               std::string{wire::to_string(declared_type)});
    return;
  }
  if (tensor.row_sparse != entry->row_sparse) {
    refuse(reply, push.request_id, push.key, wire::error_code::invalid_argument,
           entry->row_sparse
               ? name() + ": the key is row_sparse (init said so) and takes row-sparse pushes only"
               : name() +
                     ": row-sparse, but the key is dense (init did not declare it row_sparse)");
    return;
  }
  if (auto outsider = not_a_member(push.sender)) {
    refuse(reply, push.request_id, push.key, wire::error_code::invalid_argument,
           name() + ": " + *outsider);
    return;
  }
  if (tensor.row_sparse) {
    if (push.then_pull) {
      refuse(reply, push.request_id, push.key, wire::error_code::invalid_argument,
             name() + ": row-sparse; a row_sparse key is pushed, then pulled by rows");
      return;
    }
    on_sparse_push(*entry, push, tensor, reply);
    return;
  }
  if (!std::equal(tensor.shape.begin(), tensor.shape.end(), declared_shape.begin(),
                  declared_shape.end())) {
    refuse(reply, push.request_id, push.key, wire::error_code::shape_mismatch,
           name() + ": shape " + shape_text(tensor.shape) + ", init declared " +
               shape_to_string(declared_shape));
    return;
  }
  // A pushpull's pull half counts among the sender's waiting pulls: refused whole, up front.
  if (push.then_pull && tensor.offset == 0 &&
      entry->pulls.count_from(push.sender) >= pull_limit()) {
    refuse(reply, push.request_id, push.key, wire::error_code::invalid_argument,
           name() + " from worker " + std::to_string(push.sender) + ": " +
               std::to_string(pull_limit()) +
               " of its pulls of the key are waiting already (max_rounds_ahead + 1)");
    return;
  }
  sender_connection_[push.sender] = reply.connection;
  push_chunk chunk{push.request_id, push.sender, push.round, tensor.offset, tensor.data};
  if (tensor.compression.type != wire::compression_type::none) {
    // The declaration is the key's; the packing is checked against it here as well as by the
    // codec, for in-process links: the dense chunk then lies inside the key's value, so the
    // buffer stays within the key's size.
    if (auto invalid = wire::validate_tensor(tensor, in_process_limits())) {
      refuse(reply, push.request_id, push.key, wire::error_code::invalid_argument,
             name() + ": " + invalid->message);
      return;
    }
    const auto dense = static_cast<std::size_t>(tensor.dense_bytes());
    if (unpacked_.size() < dense)
      unpacked_.resize(dense);
    dequantize(from_wire(tensor.compression), entry->stored.dtype(), tensor.data.data(),
               unpacked_.data(), static_cast<std::size_t>(tensor.compression.elements));
    chunk.data = std::span<const std::byte>(unpacked_.data(), dense);
  }
  entry->traffic.push_bytes += tensor.data.size();
  if (tensor.offset == 0) {
    ++entry->traffic.pushes;
    trace_push_begins(*entry, push.sender);
  }
  if (entry->sync)
    on_sync_push(*entry, push, chunk, reply);
  else
    on_async_push(*entry, push, chunk, reply);
}

template <class Update>
void shard_core::apply_async_push(key_entry& entry, const push_request& push,
                                  const reply_route& reply, Update&& update) {
  auto& pushes = *entry.async;
  trace_push_merged(entry, push);
  // Bounded staleness's instrument: how many pushes the sender is ahead of the slowest live
  // worker as this push arrives (the sender's count before it).
  auto slowest = pushes.slowest(live_);
  auto own = pushes.pushes_of(push.sender) - 1;
  const std::uint64_t lead =
      slowest != std::numeric_limits<std::uint64_t>::max() && own > slowest ? own - slowest : 0;
  stats_.max_lead = std::max(stats_.max_lead, lead);
  ++stats_.lead_counts[std::min<std::uint64_t>(lead, stats_.lead_counts.size() - 1)];
  const auto traced_since = trace_start_time();
  auto failure = update();
  if (traced_since != 0)
    job_trace::process().record({"update", push.key, push.round, push.sender, entry.stored.nbytes(),
                                 traced_since, job_trace::now_us()});
  if (failure) {
    refuse(reply, push.request_id, push.key, wire::error_code::internal,
           "update of key " + std::to_string(push.key) + " with a push of worker " +
               std::to_string(push.sender) + " failed: " + *failure);
    return;
  }
  pushes.count_applied();
  ++stats_.updates;
  answer_push(entry, push, {}, reply);
  answer_pulls(push.key, entry);
}

void shard_core::on_sparse_push(key_entry& entry, const push_request& push,
                                const wire::tensor_chunk& tensor, const reply_route& reply) {
  auto name = [&] { return "push of key " + std::to_string(push.key); };
  const auto& declared = entry.stored.shape();
  // Checked here as well as by the codec, for in-process links: the rows then lie inside the key.
  if (auto invalid = wire::validate_tensor(tensor, in_process_limits())) {
    refuse(reply, push.request_id, push.key, wire::error_code::invalid_argument,
           name() + ": " + invalid->message);
    return;
  }
  if (tensor.shape.size() != declared.size() ||
      !std::equal(tensor.shape.begin() + 1, tensor.shape.end(), declared.begin() + 1)) {
    refuse(reply, push.request_id, push.key, wire::error_code::shape_mismatch,
           name() + ": rows of shape " + shape_text(tensor.shape) + ", init declared " +
               shape_to_string(declared) + " (its rows keep every axis but the first)");
    return;
  }
  if (auto wrong = check_row_ids(tensor.row_ids, declared[0])) {
    refuse(reply, push.request_id, push.key, wire::error_code::invalid_argument,
           name() + " from worker " + std::to_string(push.sender) + ": " + *wrong);
    return;
  }
  sender_connection_[push.sender] = reply.connection;
  entry.traffic.push_bytes += tensor.data.size() + tensor.row_ids.size();
  ++entry.traffic.pushes;
  trace_push_begins(entry, push.sender);
  if (entry.sparse) {
    auto& round = *entry.sparse;
    if (push.resent && push.round < round.completed()) {
      // Applied once, before this server restarted from a checkpoint that holds its round.
      answer_push(entry, push, push_outcome{false, std::nullopt}, reply);
      return;
    }
    deferred_answer answer;
    if (push.round > round.completed())
      answer = [this, push, reply](const push_outcome& how) {
        answer_push(*find_key(push.key), push, how, reply);
      };
    auto outcome = round.add(
        sparse_push{push.request_id, push.sender, push.round, tensor.row_ids, tensor.data},
        std::move(answer));
    on_round_outcome(entry, push, std::move(outcome), true, reply);
    return;
  }
  auto& pushes = *entry.async;
  const push_chunk chunk{push.request_id, push.sender, push.round, 0, tensor.data};
  if (push.resent && pushes.had(chunk)) {
    answer_push(entry, push, push_outcome{false, std::nullopt}, reply);
    return;
  }
  // Its rows, copied out of the frame before the push counts: a failed allocation changes
  // nothing.
  const auto count = tensor.row_ids.size() / sizeof(std::int64_t);
  std::vector<std::int64_t> rows(count);
  for (std::size_t i = 0; i < count; ++i)
    rows[i] = row_id_at(tensor.row_ids, i);
  shape_vector shape(tensor.shape.begin(), tensor.shape.end());
  auto data = ndarray::empty(shape, context::cpu(), entry.stored.dtype());
  if (!tensor.data.empty())
    std::memcpy(data.raw_data(), tensor.data.data(), tensor.data.size());
  auto grad = row_sparse_array::from_rows(data, rows, declared).value();
  auto outcome = pushes.take_whole(chunk);
  if (outcome.refused()) {
    refuse(reply, push.request_id, push.key, outcome.code, std::move(outcome.problem));
    return;
  }
  apply_async_push(entry, push, reply, [&] { return apply_rows(push.key, entry, grad); });
}

std::optional<std::string> shard_core::apply_rows(std::uint64_t key, key_entry& entry,
                                                  const row_sparse_array& grad) {
  try {
    // Updated on the host: a row_sparse key takes only row-sparse pushes, so a copy of it on an
    // update device would never be used.
    entry.on_device = ndarray{};
    if (updater_) {
      if (entry.stored.storage_is_shared())
        entry.stored = entry.stored.copy();
      updater_->update_rows(static_cast<std::int64_t>(key), grad, entry.stored);
    } else {
      auto dense = grad.to_dense();
      entry.stored =
          dense.dtype() == entry.stored.dtype() ? dense : dense.as_type(entry.stored.dtype());
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string{e.what()};
  } catch (...) {
    return std::string{"an exception of unknown type"};
  }
}

void shard_core::on_sync_push(key_entry& entry, const push_request& push, const push_chunk& chunk,
                              const reply_route& reply) {
  auto& round = *entry.sync;
  if (push.resent && chunk.round < round.completed()) {
    // A push sent again after this server restarted from a checkpoint that already holds its
    // round: applied once, before the restart. Acknowledged, once its last chunk is in.
    if (chunk.offset + chunk.data.size() >= entry.stored.nbytes())
      answer_push(entry, push, push_outcome{false, std::nullopt}, reply);
    return;
  }
  chunk_outcome outcome;
  if (chunk.round > round.completed()) {
    // The round keeps the answer of a push's first chunk only (sync_round::defer).
    deferred_answer answer;
    if (chunk.offset == 0)
      answer = [this, push, reply](const push_outcome& how) {
        answer_push(*find_key(push.key), push, how, reply);
      };
    outcome = round.defer(chunk, std::move(answer));
  } else {
    outcome = round.add(chunk);
  }
  on_round_outcome(entry, push, std::move(outcome),
                   chunk.offset + chunk.data.size() >= entry.stored.nbytes(), reply);
}

void shard_core::on_round_outcome(key_entry& entry, const push_request& push, chunk_outcome outcome,
                                  bool last_chunk, const reply_route& reply) {
  switch (outcome.fate) {
  case chunk_fate::refused:
    refuse(reply, push.request_id, push.key, outcome.code, std::move(outcome.problem));
    return;
  case chunk_fate::deferred:
    if (last_chunk)
      trace_push_merged(entry, push);
    return;
  case chunk_fate::taken:
  case chunk_fate::late:
    return;
  case chunk_fate::dropped:
    answer_push(entry, push, push_outcome{true, std::nullopt}, reply);
    return;
  case chunk_fate::completed: {
    trace_push_merged(entry, push);
    // Deferred pushes can enter only a round that opened: none while this one stays open.
    push_outcome how;
    const bool closes = entry.with_rounds([](auto& rounds) { return rounds.quorum_reached(); });
    if (closes)
      how.failure = close_round(entry, push.key);
    answer_push(entry, push, how, reply);
    if (closes)
      admit_deferred(entry, push.key);
    return;
  }
  }
}

std::optional<std::string> shard_core::close_round(key_entry& entry, std::uint64_t key) {
  auto closing = entry.completed();
  // The round's own members and quorum: workers that left count in neither.
  const auto members = entry.with_rounds([](auto& rounds) { return rounds.round_members(); });
  const auto quorum = entry.with_rounds([](auto& rounds) { return rounds.round_quorum(); });
  auto scale =
      policy_.rescale_quorum && quorum < members ? static_cast<double>(members) / quorum : 1.0;
  const auto traced_since = trace_start_time();
  std::optional<std::string> failure;
  if (entry.sparse) {
    try {
      failure = apply_rows(key, entry, entry.sparse->sum(scale));
    } catch (const std::exception& e) {
      failure = e.what();
    }
  } else {
    failure = apply(key, entry, entry.sync->sum(), scale);
  }
  if (traced_since != 0)
    job_trace::process().record(
        {"update", key, closing, -1, entry.stored.nbytes(), traced_since, job_trace::now_us()});
  if (entry.sparse)
    entry.sparse->close();
  else
    entry.sync->close();
  answer_pulls(key, entry);
  if (failure) {
    auto what = "update of key " + std::to_string(key) + " with the sum of round " +
                std::to_string(closing) + " failed: " + *failure;
    options_.log.error(what);
    return what;
  }
  ++stats_.updates;
  options_.log.debug([&] {
    return "key " + std::to_string(key) + ": round " + std::to_string(closing) + " closed";
  });
  return std::nullopt;
}

void shard_core::admit_deferred(key_entry& entry, std::uint64_t key) {
  for (;;) {
    auto admitted = entry.with_rounds([](auto& rounds) { return rounds.admit_deferred(); });
    bool closes = entry.with_rounds([](auto& rounds) { return rounds.quorum_reached(); });
    push_outcome closed;
    if (closes)
      closed.failure = close_round(entry, key);
    // The last push that entered whole completed the quorum: it hears of a failed update.
    auto closer = admitted.size();
    if (closes)
      for (std::size_t i = admitted.size(); i-- > 0;)
        if (!admitted[i].dropped) {
          closer = i;
          break;
        }
    for (std::size_t i = 0; i < admitted.size(); ++i)
      admitted[i].answer(i == closer ? closed : push_outcome{admitted[i].dropped, std::nullopt});
    if (!closes)
      return;
  }
}

void shard_core::on_async_push(key_entry& entry, const push_request& push, const push_chunk& chunk,
                               const reply_route& reply) {
  auto& pushes = *entry.async;
  if (push.resent && pushes.had(chunk)) {
    // A push sent again after this server restarted from a checkpoint that holds it: applied
    // once, before the restart. Acknowledged, once its last chunk is in.
    if (chunk.offset + chunk.data.size() >= entry.stored.nbytes())
      answer_push(entry, push, push_outcome{false, std::nullopt}, reply);
    return;
  }
  auto outcome = pushes.add(chunk);
  if (outcome.refused()) {
    refuse(reply, push.request_id, push.key, outcome.code, std::move(outcome.problem));
    return;
  }
  if (outcome.fate != chunk_fate::completed)
    return;
  apply_async_push(entry, push, reply,
                   [&] { return apply(push.key, entry, pushes.received(push.sender), 1.0); });
}

void shard_core::answer_push(key_entry& entry, const push_request& push, const push_outcome& how,
                             const reply_route& reply) {
  if (how.failure) {
    refuse(reply, push.request_id, push.key, wire::error_code::internal, *how.failure);
    return;
  }
  if (how.dropped) {
    ++stats_.late_pushes_dropped;
    options_.log.debug([&] {
      return "key " + std::to_string(push.key) + ": late push of round " +
             std::to_string(push.round) + " from worker " + std::to_string(push.sender) +
             " dropped";
    });
  }
  if (!push.then_pull) {
    reply(envelope{
        wire::ack{push.request_id, entry.completed(), how.dropped, durable_for(entry, push.sender)},
        nullptr, 0});
    return;
  }
  // A dropped push's pull gets the value of the round that closed without it.
  const auto traced_since = trace_start_time();
  if (how.dropped || pull_ready(entry, push.round + 1)) {
    send_value(push.key, entry, push.request_id, push.sender, reply, push.round + 1, traced_since,
               nullptr, push.reply_packing);
    return;
  }
  entry.pulls.add(waiting_pull{push.request_id,
                               push.sender,
                               push.round + 1,
                               expiry(push.arrival, push.timeout_ms),
                               reply,
                               traced_since,
                               false,
                               {},
                               push.reply_packing});
}

std::optional<std::string> shard_core::apply(std::uint64_t key, key_entry& entry, ndarray& received,
                                             double scale) {
  try {
    if (scale != 1.0)
      received *= scale;
    if (updater_ && options_.update_device.is_gpu()) {
      const context device = options_.update_device;
      if (entry.on_device.is_none())
        entry.on_device = entry.stored.copy_to(device);
      (*updater_)(static_cast<std::int64_t>(key), received.copy_to(device), entry.on_device);
      if (entry.stored.storage_is_shared())
        entry.stored =
            ndarray::empty(entry.stored.shape(), entry.stored.ctx(), entry.stored.dtype());
      entry.on_device.copy_to(entry.stored);
    } else if (updater_) {
      if (entry.stored.storage_is_shared())
        entry.stored = entry.stored.copy();
      (*updater_)(static_cast<std::int64_t>(key), received, entry.stored);
    } else {
      // Replace: the received buffer becomes the value; the old value's buffer is reused for the
      // next push unless a reply still reads it (make_writable checks). A float32 sum of float16
      // pushes (an optimizer with multi_precision, replaced since) is rounded into a fresh value.
      if (received.dtype() != entry.stored.dtype())
        received = received.as_type(entry.stored.dtype());
      std::swap(entry.stored, received);
      entry.on_device = ndarray{}; // a later update starts from the replaced value
    }
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string{e.what()};
  } catch (...) {
    return std::string{"an exception of unknown type"};
  }
}

// --- pulls ---------------------------------------------------------------------------------------

void shard_core::on_pull(const wire::pull_request& msg, const reply_route& reply) {
  auto* entry = usable_key(msg.key, msg.request_id, "pull", reply);
  if (entry == nullptr)
    return;
  auto name = [&] { return "pull of key " + std::to_string(msg.key); };
  if (auto outsider = not_a_member(msg.sender_rank)) {
    refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
           name() + ": " + *outsider);
    return;
  }
  if (msg.row_sparse != entry->row_sparse) {
    refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
           entry->row_sparse
               ? name() + ": the key is row_sparse (init said so); ask for its rows "
                          "(row_sparse_pull)"
               : name() + ": rows asked for, but the key is dense (init did not declare it "
                          "row_sparse)");
    return;
  }
  std::vector<std::int64_t> rows;
  if (msg.row_sparse) {
    if (auto wrong = check_row_ids(msg.row_ids, entry->stored.shape()[0])) {
      refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
             "row_sparse_" + name() + ": " + *wrong);
      return;
    }
    rows.resize(msg.row_ids.size() / sizeof(std::int64_t));
    for (std::size_t i = 0; i < rows.size(); ++i)
      rows[i] = row_id_at(msg.row_ids, i);
  }
  const auto traced_since = trace_start_time();
  // A worker that joined the running job asks first for the value its first round starts from
  // (dist_sync), or is counted from the slowest worker's pushes when it joined (dist_async).
  auto round = msg.round;
  if (entry->async)
    round += entry->async->joined_at(msg.sender_rank);
  else if (auto first = entry->with_rounds(
               [&](auto& rounds) { return rounds.membership().first_of(msg.sender_rank); }))
    round = std::max(round, *first);
  if (pull_ready(*entry, round)) {
    send_value(msg.key, *entry, msg.request_id, msg.sender_rank, reply, round, traced_since,
               msg.row_sparse ? &rows : nullptr, from_wire(msg.reply_compression));
    return;
  }
  if (entry->pulls.count_from(msg.sender_rank) >= pull_limit()) {
    refuse(reply, msg.request_id, msg.key, wire::error_code::invalid_argument,
           name() + " for round " + std::to_string(msg.round) + " from worker " +
               std::to_string(msg.sender_rank) + ": " + std::to_string(pull_limit()) +
               " of its pulls of the key are waiting already (max_rounds_ahead + 1)");
    return;
  }
  entry->pulls.add(waiting_pull{msg.request_id, msg.sender_rank, round,
                                expiry(now(), msg.timeout_ms), reply, traced_since, msg.row_sparse,
                                std::move(rows), from_wire(msg.reply_compression)});
}

bool shard_core::pull_ready(const key_entry& entry, std::uint64_t round) const noexcept {
  if (entry.sync)
    return entry.sync->completed() >= round;
  if (entry.sparse)
    return entry.sparse->completed() >= round;
  if (policy_.max_staleness < 0)
    return true;
  return within_staleness(round, entry.async->slowest(live_));
}

bool shard_core::within_staleness(std::uint64_t round, std::uint64_t slowest) const noexcept {
  auto staleness = static_cast<std::uint64_t>(policy_.max_staleness);
  return round <= staleness || slowest >= round - staleness;
}

void shard_core::answer_pulls(std::uint64_t key, key_entry& entry) {
  if (entry.pulls.empty())
    return;
  // The shard's one vector for this, taken for the call (so a call nested in a reply would get
  // an empty one of its own rather than share it) and given back with its capacity.
  std::vector<waiting_pull> ready = std::move(ready_pulls_);
  ready.clear();
  if (entry.async && policy_.max_staleness >= 0) {
    // The slowest worker is the same for every waiting pull: found once, not once per pull.
    const auto slowest = entry.async->slowest(live_);
    entry.pulls.take_into(
        [&](const waiting_pull& pull) { return within_staleness(pull.round, slowest); }, ready);
  } else {
    entry.pulls.take_into([&](const waiting_pull& pull) { return pull_ready(entry, pull.round); },
                          ready);
  }
  for (auto& pull : ready)
    send_value(key, entry, pull.request_id, pull.sender, pull.reply, pull.round,
               pull.traced_since_us, pull.row_sparse ? &pull.rows : nullptr, pull.reply_packing);
  ready.clear();
  ready_pulls_ = std::move(ready);
}

void shard_core::trace_push_begins(key_entry& entry, std::uint32_t sender) {
  if (!job_trace::process().enabled())
    return;
  entry.merge_started_us.resize(capacity(), 0);
  entry.merge_started_us[sender] = job_trace::now_us();
}

void shard_core::trace_push_merged(key_entry& entry, const push_request& push) {
  if (push.sender >= entry.merge_started_us.size() || entry.merge_started_us[push.sender] == 0)
    return;
  job_trace::process().record({"merge", push.key, push.round, push.sender, entry.stored.nbytes(),
                               entry.merge_started_us[push.sender], job_trace::now_us()});
  entry.merge_started_us[push.sender] = 0;
}

std::vector<float>* shard_core::pull_residual(key_entry& entry, std::uint32_t sender,
                                              const gradient_compression& packing) {
  if (!packing.enabled() || !entry.sync || updater_ || !compressible(entry.stored.dtype()) ||
      sender >= capacity())
    return nullptr;
  if (entry.pull_residuals.size() != capacity())
    entry.pull_residuals.resize(capacity());
  auto& state = entry.pull_residuals[sender];
  // A round's sum feeds the residual once: a second pull of it (a retry, a pull after a
  // pushpull) gets the value itself.
  if (entry.completed() <= state.round)
    return nullptr;
  const auto elements = static_cast<std::size_t>(entry.stored.size());
  if (state.values.size() != elements) {
    if (auto refused = reserve_store(elements * sizeof(float))) {
      options_.log.debug([&] { return "packed pull replies go dense: " + *refused; });
      return nullptr;
    }
    state.values.assign(elements, 0.0f);
  }
  state.round = entry.completed();
  return &state.values;
}

void shard_core::send_value(std::uint64_t key, key_entry& entry, std::uint64_t request_id,
                            std::uint32_t sender, const reply_route& reply, std::uint64_t round,
                            std::int64_t traced_since_us, const std::vector<std::int64_t>* rows,
                            const gradient_compression& packing) {
  ndarray gathered;
  if (rows != nullptr)
    // The rows asked for, in their order, copied: the reply reads them on another thread while
    // the key's value may change.
    gathered = row_sparse_array::from_dense_rows(entry.stored, *rows).value().data();
  const auto& value = rows != nullptr ? gathered : entry.stored;
  wire::tensor_chunk tensor;
  tensor.type = to_wire(value.dtype());
  tensor.shape.assign(value.shape().begin(), value.shape().end());
  tensor.total_bytes = value.nbytes();
  tensor.data = std::span{static_cast<const std::byte*>(value.raw_data()), value.nbytes()};
  std::shared_ptr<const void> keepalive = value.keepalive();
  if (auto* residual = rows == nullptr ? pull_residual(entry, sender, packing) : nullptr) {
    // The value plus what earlier packed replies left out, quantized; the rest stays for the
    // next one (MXNet's rule for pushes, applied to the server's answer).
    const auto elements = static_cast<std::size_t>(value.size());
    auto packed = std::make_shared<std::vector<std::byte>>(packed_bytes(packing.type, elements));
    quantize(packing, value.dtype(), value.raw_data(), residual->data(), packed->data(), elements);
    tensor.data = *packed;
    tensor.compression = {to_wire(packing.type), packing.threshold, elements};
    keepalive = std::move(packed);
  }
  const auto sent_bytes = tensor.data.size();
  wire::chunker chunks{wire::pull_reply{request_id, key, entry.completed(), std::move(tensor),
                                        durable_for(entry, sender)},
                       options_.chunk_bytes};
  // The span ends as the reply leaves, not after: the worker may hold the whole reply before
  // this thread runs again, and its pull span must end after this one (the protocol's order).
  if (traced_since_us != 0)
    job_trace::process().record(
        {"pull", key, round, sender, value.nbytes(), traced_since_us, job_trace::now_us()});
  for (std::size_t i = 0; i < chunks.chunk_count(); ++i)
    reply(envelope{chunks.chunk(i), keepalive, 0});
  ++entry.traffic.pulls;
  entry.traffic.pull_bytes += sent_bytes;
}

shard_stats shard_core::stats() const {
  shard_stats out = stats_;
  out.keys.reserve(keys_.size());
  out.inits_under_way = unfinished_inits_.size();
  for (const auto& [key, entry] : keys_) {
    out.store_bytes += entry.stored.nbytes();
    if (!entry.initialized())
      continue;
    auto traffic = entry.traffic;
    traffic.key = key;
    out.keys.push_back(traffic);
  }
  return out;
}

shard_clock::time_point shard_core::expiry(shard_clock::time_point arrival,
                                           std::uint32_t timeout_ms) const {
  return arrival + (timeout_ms > 0 ? std::chrono::milliseconds{timeout_ms} : options_.pull_timeout);
}

std::size_t shard_core::expire_pulls() noexcept {
  std::size_t expired = 0;
  try {
    auto at = now();
    for (auto& [key, entry] : keys_)
      expired += entry.pulls.expire(at);
  } catch (...) {
    // An allocation failed while sweeping; the next sweep tries again.
  }
  stats_.pulls_expired += expired;
  if (expired > 0)
    options_.log.debug([&] { return std::to_string(expired) + " waiting pulls expired"; });
  return expired;
}

void shard_core::on_membership(const wire::membership& table) noexcept {
  try {
    std::vector<bool> live = member_;
    for (const auto& node : table.nodes) {
      if (node.node_role != wire::role::worker)
        continue;
      if (node.rank >= capacity()) {
        options_.log.error("membership epoch " + std::to_string(table.epoch) + " lists worker " +
                           std::to_string(node.rank) + ", beyond this server's " +
                           std::to_string(capacity()) + " worker ranks (job.max_workers)");
        continue;
      }
      // A worker new to the table joined the running job (one that joined and left between two
      // tables is admitted and retired at once: it counts in no round).
      if (!member_[node.rank] && node.alive) {
        admit_worker(node.rank);
        live[node.rank] = true;
      }
      if (!node.alive || node.left)
        live[node.rank] = false;
      if (node.left && member_[node.rank] && !left_[node.rank]) {
        retire_worker(node.rank);
        after_update();
      }
    }
    if (live == live_)
      return;
    live_ = std::move(live);
    options_.log.info("membership epoch " + std::to_string(table.epoch) + ": " +
                      std::to_string(std::count(live_.begin(), live_.end(), true)) + " of " +
                      std::to_string(std::count(member_.begin(), member_.end(), true)) +
                      " workers live");
    // Bounded staleness no longer waits for the workers that left.
    for (auto& [key, entry] : keys_)
      if (entry.async)
        answer_pulls(key, entry);
  } catch (...) {
    // Only an allocation can fail here; the pulls then wait for the next push or expire.
  }
}

// --- control -------------------------------------------------------------------------------------

void shard_core::on_set_optimizer(const wire::set_optimizer& msg, const reply_route& reply) {
  optimizer_params params;
  for (const auto& param : msg.params)
    params[param.name] = param.value;
  auto created = options_.make_optimizer ? options_.make_optimizer(msg.name, params)
                                         : optimizer::create(msg.name, params);
  if (!created) {
    refuse(reply, msg.request_id, std::nullopt, wire::error_code::invalid_argument,
           created.error().message());
    return;
  }
  updater_ = std::make_unique<updater>(std::move(*created));
  sum_in_optimizer_precision();
  reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
}

void shard_core::on_set_gradient_compression(const wire::set_gradient_compression& msg,
                                             const reply_route& reply) {
  // Every compressed chunk names its rule (troupe.capnp Tensor.compression), so a valid setting
  // changes nothing here: the ack tells the worker this server reads compressed pushes.
  auto rule = gradient_compression::make(msg.type, msg.threshold);
  if (!rule) {
    refuse(reply, msg.request_id, std::nullopt, wire::error_code::invalid_argument,
           rule.error().message());
    return;
  }
  reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
}

void shard_core::on_sync_settings(const wire::sync_settings& msg, const reply_route& reply) {
  auto wanted = policy_from(msg, options_.num_workers);
  if (!wanted) {
    refuse(reply, msg.request_id, std::nullopt, wire::error_code::invalid_argument,
           wanted.error().message());
    return;
  }
  set_policy(*wanted, msg.request_id, reply);
}

void shard_core::set_policy(const sync_policy& wanted, std::uint64_t request_id,
                            const reply_route& reply) {
  if (wanted != policy_) {
    // A key's rounds or counts are built for the policy it was initialised under.
    if (!keys_.empty()) {
      refuse(reply, request_id, std::nullopt, wire::error_code::invalid_argument,
             "sync settings " + describe(wanted, options_.num_workers) + " after key " +
                 std::to_string(keys_.begin()->first) + " was initialised under " +
                 describe(policy_, options_.num_workers) +
                 "; the settings change only before any init");
      return;
    }
    policy_ = wanted;
    options_.log.info("shard " + std::to_string(options_.shard_index) + ": " +
                      describe(policy_, options_.num_workers));
  }
  reply(envelope{wire::ack{request_id}, nullptr, 0});
}

void shard_core::on_command(const wire::command& msg, const reply_route& reply) {
  if (msg.kind == wire::command_kind::stop) {
    reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
    return;
  }
  if (msg.kind == wire::command_kind::sync_mode || msg.kind == wire::command_kind::async_mode) {
    // The older form of sync_settings: the mode, with every other setting at its default.
    sync_policy wanted;
    wanted.mode =
        msg.kind == wire::command_kind::sync_mode ? consistency::sync : consistency::async;
    wanted.quorum = options_.num_workers;
    set_policy(wanted, msg.request_id, reply);
    return;
  }
  if (msg.kind == wire::command_kind::save_checkpoint && any_round_collecting()) {
    // A save right after a push holds that push's round: it waits for the rounds being
    // collected to close (after_update runs it).
    if (waiting_saves_.size() >= max_waiting_saves) {
      refuse(reply, msg.request_id, std::nullopt, wire::error_code::invalid_argument,
             "save_optimizer_states '" + msg.path + "': " + std::to_string(max_waiting_saves) +
                 " saves already wait for the rounds being collected to close");
      return;
    }
    waiting_saves_.push_back({msg, reply});
    return;
  }
  on_states_command(msg, reply);
}

void shard_core::on_states_command(const wire::command& msg, const reply_route& reply) {
  const bool saving = msg.kind == wire::command_kind::save_checkpoint;
  auto fail = [&](const error& err) {
    refuse(reply, msg.request_id, std::nullopt, wire::error_code::invalid_argument,
           std::string{saving ? "save_optimizer_states" : "load_optimizer_states"} + ": " +
               err.message());
  };
  if (!updater_) {
    fail(error{errc::invalid_argument,
               "optimizer states live on the servers only after set_optimizer"});
    return;
  }
  auto path = states_file(options_.checkpoint.dir, msg.path, layout());
  if (!path) {
    fail(path.error());
    return;
  }
  if (saving) {
    auto bytes = encode_snapshot(snapshot(snapshot_kind::optimizer_states, msg.dump_optimizer));
    if (auto written = write_file(path->string(), bytes); !written) {
      fail(written.error());
      return;
    }
    options_.log.info("saved optimizer states to " + path->string());
  } else {
    auto bytes = read_file(path->string());
    if (!bytes) {
      fail(bytes.error());
      return;
    }
    auto saved = decode_snapshot(*bytes, path->string());
    if (!saved) {
      fail(saved.error());
      return;
    }
    if (saved->kind != snapshot_kind::optimizer_states || !saved->optimizer_states) {
      fail(error{errc::invalid_argument, path->string() + " holds no optimizer states"});
      return;
    }
    if (auto differs = layout_differences(saved->layout, layout()); !differs.empty()) {
      fail(error{errc::invalid_argument,
                 path->string() + " was saved by a job of another layout: " + differs +
                     "; a key's ps-key and shard depend on them, so load it into a job with "
                     "the same num_servers, node.shards and num_workers"});
      return;
    }
    auto shape_of = [this](std::int64_t index) -> std::optional<shape_vector> {
      auto found = keys_.find(static_cast<std::uint64_t>(index));
      if (found == keys_.end() || found->second.stored.is_none())
        return std::nullopt;
      return found->second.stored.shape();
    };
    if (auto loaded = updater_->load_states(*saved->optimizer_states, shape_of); !loaded) {
      fail(error{loaded.error().code(), path->string() + ": " + loaded.error().message()});
      return;
    }
    options_.log.info("loaded optimizer states from " + path->string());
  }
  reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
}

// --- checkpoints ---------------------------------------------------------------------------------

shard_layout shard_core::layout() const noexcept {
  return shard_layout{
      options_.num_servers,       options_.server_rank,
      options_.shards_per_server, options_.shard_index,
      options_.num_workers,       std::max(options_.num_ranges, options_.num_servers)};
}

std::uint64_t shard_core::slowest_key() const noexcept {
  std::uint64_t slowest = std::numeric_limits<std::uint64_t>::max();
  for (const auto& [key, entry] : keys_)
    if (entry.initialized())
      slowest = std::min(slowest, entry.completed());
  return slowest == std::numeric_limits<std::uint64_t>::max() ? 0 : slowest;
}

bool shard_core::any_round_collecting() const noexcept {
  return std::any_of(keys_.begin(), keys_.end(),
                     [](const auto& item) { return item.second.collecting(); });
}

void shard_core::checkpoint_by_rounds() {
  if (options_.checkpoint.every_rounds == 0 || options_.checkpoint.dir.empty())
    return;
  auto progress = slowest_key();
  if (progress >= checkpointed_progress_ + options_.checkpoint.every_rounds && start_checkpoint())
    checkpointed_progress_ = progress;
}

void shard_core::after_update() {
  changed_since_checkpoint_ = true;
  checkpoint_by_rounds();
  if (!waiting_saves_.empty() && !any_round_collecting()) {
    auto saves = std::move(waiting_saves_);
    waiting_saves_.clear();
    for (auto& save : saves)
      on_states_command(save.msg, save.reply);
  }
}

void shard_core::checkpoint_if_due() noexcept {
  try {
    if (checkpoint_in_flight_.valid() &&
        checkpoint_in_flight_.wait_for(std::chrono::seconds{0}) == std::future_status::ready)
      (void)finish_checkpoint();
    // A round trigger skipped while the previous write was under way is taken up here.
    checkpoint_by_rounds();
    if (options_.checkpoint.every.count() <= 0 || options_.checkpoint.dir.empty() ||
        !changed_since_checkpoint_ || now() - last_checkpoint_ < options_.checkpoint.every)
      return;
    (void)start_checkpoint();
  } catch (const std::exception& e) {
    options_.log.error(std::string{"checkpoint failed (tried again later): "} + e.what());
  }
}

bool shard_core::start_checkpoint() {
  if (checkpoint_in_flight_.valid()) {
    // One write at a time: a disk slower than the rounds skips checkpoints, it does not queue
    // them (the trigger stays, so the next update or sweep tries again).
    if (checkpoint_in_flight_.wait_for(std::chrono::seconds{0}) != std::future_status::ready)
      return false;
    (void)finish_checkpoint();
  }
  // The copy is taken here, between requests; the disk is written on another thread, so a shard
  // goes on serving while its checkpoint is written and synced.
  auto bytes = std::make_shared<const std::vector<std::byte>>(
      encode_snapshot(snapshot(snapshot_kind::checkpoint, true)));
  auto path = checkpoint_file(options_.checkpoint.dir, layout());
  checkpoint_description_ = std::to_string(keys_.size()) + " keys at round " +
                            std::to_string(slowest_key()) + ": " + std::to_string(bytes->size()) +
                            " bytes to " + path.string();
  for (auto& [key, entry] : keys_) {
    entry.writing = entry.initialized() ? entry.completed() : 0;
    if (entry.async) {
      entry.writing_pushes.resize(options_.num_workers);
      for (std::uint32_t w = 0; w < options_.num_workers; ++w)
        entry.writing_pushes[w] = entry.async->pushes_of(w);
    }
  }
  checkpoint_started_ = shard_clock::now();
  last_checkpoint_ = now();
  changed_since_checkpoint_ = false;
  checkpoint_in_flight_ = std::async(std::launch::async, [bytes, path]() -> status {
    try {
      return write_file(path.string(), *bytes);
    } catch (const std::exception& e) {
      return error{errc::io_error, "writing " + path.string() + ": " + e.what()};
    }
  });
  return true;
}

status shard_core::finish_checkpoint() {
  if (!checkpoint_in_flight_.valid())
    return ok();
  auto written = checkpoint_in_flight_.get();
  if (!written) {
    // What the failed file would have held is still to be written: the next trigger tries.
    changed_since_checkpoint_ = true;
    checkpointed_progress_ = 0;
    options_.log.error("checkpoint of " + checkpoint_description_ +
                       " failed (tried again at the next trigger): " + written.error().message());
    return written;
  }
  ++stats_.checkpoints_written;
  // What the workers may forget: the counts this file holds are on disk.
  for (auto& [key, entry] : keys_) {
    entry.durable = std::max(entry.durable, entry.writing);
    entry.durable_pushes.resize(entry.writing_pushes.size());
    for (std::size_t w = 0; w < entry.writing_pushes.size(); ++w)
      entry.durable_pushes[w] = std::max(entry.durable_pushes[w], entry.writing_pushes[w]);
  }
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(shard_clock::now() -
                                                                  checkpoint_started_);
  options_.log.info("checkpoint of " + checkpoint_description_ + " in " +
                    std::to_string(ms.count()) + " ms");
  return ok();
}

status shard_core::write_checkpoint() {
  if (options_.checkpoint.dir.empty())
    return error{errc::invalid_argument,
                 "this server has no checkpoint directory (checkpoint.dir, --checkpoint-dir)"};
  if (auto previous = finish_checkpoint(); !previous)
    return previous;
  start_checkpoint();
  return finish_checkpoint();
}

shard_snapshot shard_core::snapshot(snapshot_kind kind, bool dump_optimizer) const {
  shard_snapshot out;
  out.kind = kind;
  out.layout = layout();
  out.policy = policy_;
  for (const auto& [ps_key, entry] : keys_) {
    if (!entry.initialized())
      continue;
    key_snapshot key;
    key.ps_key = ps_key;
    key.type = entry.stored.dtype();
    key.shape.assign(entry.stored.shape().begin(), entry.stored.shape().end());
    key.completed = entry.completed();
    key.row_sparse = entry.row_sparse;
    if (entry.async)
      for (std::uint32_t w = 0; w < options_.num_workers; ++w)
        key.applied_per_worker.push_back(entry.async->pushes_of(w));
    if (kind == snapshot_kind::checkpoint)
      key.value = entry.stored;
    out.keys.push_back(std::move(key));
  }
  if (updater_)
    out.optimizer_states = updater_->save_states(dump_optimizer);
  return out;
}

status shard_core::restore(const shard_snapshot& saved) {
  auto refused = [](const std::string& why) {
    return error{errc::invalid_argument, "restore: " + why};
  };
  if (saved.kind != snapshot_kind::checkpoint)
    return refused("the file holds optimizer states, not a checkpoint");
  if (auto differs = layout_differences(saved.layout, layout()); !differs.empty())
    return refused("the checkpoint is of another layout: " + differs);
  if (!keys_.empty())
    return refused("the shard already holds keys");
  if (saved.policy.quorum < 1 || saved.policy.quorum > options_.num_workers ||
      saved.policy.max_rounds_ahead < 1)
    return refused("the checkpoint's sync policy does not fit a job of " +
                   std::to_string(options_.num_workers) + " workers");
  std::uint64_t total = 0;
  for (const auto& key : saved.keys) {
    if (key.value.is_none() || key.value.nbytes() > options_.max_value_bytes)
      return refused("key " + std::to_string(key.ps_key) + " has no value or one beyond " +
                     std::to_string(options_.max_value_bytes) + " bytes (data.max_value_bytes)");
    if (saved.policy.mode == consistency::async &&
        key.applied_per_worker.size() != options_.num_workers)
      return refused("key " + std::to_string(key.ps_key) + " counts pushes of " +
                     std::to_string(key.applied_per_worker.size()) + " workers");
    total += key.value.nbytes();
  }
  std::unique_ptr<updater> restored_updater;
  if (saved.optimizer_states) {
    // The states carry their optimizer (checkpoints dump it), which replaces this placeholder.
    auto placeholder = optimizer::create("sgd", {});
    if (!placeholder)
      return placeholder.error();
    restored_updater = std::make_unique<updater>(std::move(*placeholder));
    auto shape_of = [&saved](std::int64_t index) -> std::optional<shape_vector> {
      for (const auto& key : saved.keys)
        if (key.ps_key == static_cast<std::uint64_t>(index))
          return key.value.shape();
      return std::nullopt;
    };
    if (auto loaded = restored_updater->load_states(*saved.optimizer_states, shape_of); !loaded)
      return refused("optimizer states: " + loaded.error().message());
  }
  if (auto over = reserve_store(total))
    return refused("its keys: " + *over);
  policy_ = saved.policy;
  for (const auto& key : saved.keys) {
    key_entry entry;
    entry.stored = key.value.copy();
    entry.row_sparse = key.row_sparse;
    open_rounds(entry, key.ps_key, key.completed);
    if (entry.async) {
      entry.async->resume(key.applied_per_worker, key.completed);
      entry.durable_pushes = key.applied_per_worker;
    }
    entry.durable = key.completed;
    auto& indexed = index_[key.ps_key];
    indexed = &keys_.emplace(key.ps_key, std::move(entry)).first->second;
  }
  updater_ = std::move(restored_updater);
  sum_in_optimizer_precision();
  checkpointed_progress_ = slowest_key();
  options_.log.info("restored " + std::to_string(keys_.size()) + " keys at round " +
                    std::to_string(checkpointed_progress_) + " (" +
                    describe(policy_, options_.num_workers) + ")");
  return ok();
}

// --- elastic servers -----------------------------------------------------------------------------

std::optional<std::string> shard_core::moved_away(std::uint64_t key) const {
  const auto range = key_range_of(key, num_ranges());
  if (!moved_ranges_[range])
    return std::nullopt;
  return "key " + std::to_string(key) + ": its key range " + std::to_string(range) +
         " has left server " + std::to_string(options_.server_rank) +
         "; it is served by the server the next membership table names for the range";
}

result<shard_snapshot> shard_core::hand_over(std::vector<std::uint32_t> ranges) {
  std::sort(ranges.begin(), ranges.end());
  ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
  if (ranges.empty())
    return error{errc::invalid_argument, "hand-over of key ranges: no range named"};
  for (auto range : ranges)
    if (range >= num_ranges())
      return error{errc::invalid_argument, "hand-over of key range " + std::to_string(range) +
                                               ": the job has " + std::to_string(num_ranges()) +
                                               " (job.max_servers)"};
  shard_snapshot out;
  out.kind = snapshot_kind::checkpoint;
  out.layout = layout();
  out.policy = policy_;
  out.ranges = ranges;
  std::vector<std::map<std::uint64_t, key_entry>::iterator> leaving, unfinished;
  for (auto it = keys_.begin(); it != keys_.end(); ++it)
    if (std::binary_search(ranges.begin(), ranges.end(), key_range_of(it->first, num_ranges())))
      (it->second.initialized() ? leaving : unfinished).push_back(it);
  // An init under way goes again, whole, to the range's new server.
  for (auto it : unfinished)
    drop_init(it, "its key range is handed over to another server");
  std::set<std::int64_t> moving;
  for (auto it : leaving) {
    moving.insert(static_cast<std::int64_t>(it->first));
    out.keys.push_back(take_out(it));
  }
  if (updater_) {
    auto in_hand_over = [&](std::int64_t index) { return moving.contains(index); };
    out.optimizer_states = updater_->save_states(true, in_hand_over);
    updater_->forget_states(in_hand_over);
  }
  for (auto range : ranges)
    if (!moved_ranges_[range]) {
      moved_ranges_[range] = true;
      ++ranges_away_;
    }
  changed_since_checkpoint_ = true;
  std::string names;
  for (auto range : ranges)
    names += (names.empty() ? "" : ",") + std::to_string(range);
  options_.log.info("handed key ranges " + names + " over: " + std::to_string(out.keys.size()) +
                    " keys");
  return out;
}

key_snapshot shard_core::take_out(std::map<std::uint64_t, key_entry>::iterator found) {
  auto& entry = found->second;
  key_snapshot key;
  key.ps_key = found->first;
  key.type = entry.stored.dtype();
  key.shape.assign(entry.stored.shape().begin(), entry.stored.shape().end());
  key.completed = entry.completed();
  key.row_sparse = entry.row_sparse;
  if (entry.async) {
    for (std::uint32_t w = 0; w < capacity(); ++w)
      key.applied_per_worker.push_back(entry.async->pushes_of(w));
    for (std::uint32_t w = options_.num_workers; w < capacity(); ++w)
      if (member_[w])
        key.joined.push_back({w, entry.async->joined_at(w)});
  } else {
    entry.with_rounds([&](const auto& rounds) {
      for (const auto& came : rounds.membership().arrivals())
        key.joined.push_back({came.worker, came.first});
      for (const auto& gone : rounds.membership().departures())
        key.left.push_back({gone.worker, gone.end});
    });
  }
  key.value = entry.stored;
  std::uint64_t footprint = entry.stored.nbytes();
  for (const auto& residual : entry.pull_residuals)
    footprint += residual.values.size() * sizeof(float);
  options_.log.debug([&] {
    return "key " + std::to_string(found->first) + " leaves after round " +
           std::to_string(entry.completed()) + " (" + std::to_string(entry.pulls.size()) +
           " waiting pulls dropped, sent again by their workers)";
  });
  index_.erase(found->first);
  last_found_ = nullptr;
  // Waiting pulls, deferred pushes and the round being collected go unanswered or unapplied: the
  // workers send them again to the key's new server.
  keys_.erase(found);
  release_store(footprint);
  return key;
}

status shard_core::take_over(const shard_snapshot& moved) {
  auto refused = [](const std::string& why) {
    return error{errc::invalid_argument, "take-over of key ranges: " + why};
  };
  if (moved.kind != snapshot_kind::checkpoint || moved.ranges.empty())
    return refused("not a hand-over of key ranges");
  const auto here = layout();
  std::string differs;
  auto compare = [&](const char* what, std::uint32_t theirs, std::uint32_t ours) {
    if (theirs != ours)
      differs += (differs.empty() ? "" : ", ") + std::string{what} + " " + std::to_string(theirs) +
                 " (here " + std::to_string(ours) + ")";
  };
  compare("key ranges", moved.layout.num_ranges, here.num_ranges);
  compare("shards_per_server", moved.layout.shards_per_server, here.shards_per_server);
  compare("shard", moved.layout.shard_index, here.shard_index);
  compare("workers", moved.layout.num_workers, here.num_workers);
  if (!differs.empty())
    return refused("it comes from another placement: " + differs);
  if (!keys_.empty() && moved.policy != policy_)
    return refused("its sync policy (" + describe(moved.policy, options_.num_workers) +
                   ") differs from this shard's (" + describe(policy_, options_.num_workers) + ")");
  if (moved.policy.quorum < 1 || moved.policy.quorum > options_.num_workers ||
      moved.policy.max_rounds_ahead < 1)
    return refused("its sync policy does not fit a job of " + std::to_string(options_.num_workers) +
                   " workers");
  std::uint64_t total = 0;
  for (const auto& key : moved.keys) {
    const auto name = "key " + std::to_string(key.ps_key);
    const auto range = key_range_of(key.ps_key, num_ranges());
    if (!std::binary_search(moved.ranges.begin(), moved.ranges.end(), range))
      return refused(name + " lies in key range " + std::to_string(range) +
                     ", which the hand-over does not hold");
    if (keys_.contains(key.ps_key))
      return refused(name + " is held here already");
    if (key.value.is_none() || key.value.nbytes() > options_.max_value_bytes)
      return refused(name + " has no value or one beyond " +
                     std::to_string(options_.max_value_bytes) + " bytes (data.max_value_bytes)");
    if (key.applied_per_worker.size() > capacity())
      return refused(name + " counts pushes of " + std::to_string(key.applied_per_worker.size()) +
                     " workers, the job has " + std::to_string(capacity()) + " ranks");
    for (const auto* facts : {&key.joined, &key.left})
      for (const auto& fact : *facts)
        if (fact.worker >= capacity())
          return refused(name + " names worker " + std::to_string(fact.worker) +
                         ", beyond the job's " + std::to_string(capacity()) + " ranks");
    total += key.value.nbytes();
  }
  if (updater_ && !moved.optimizer_states && !moved.keys.empty())
    return refused("its keys come without optimizer states, and this shard runs " +
                   updater_->optimizer().name());
  if (auto over = reserve_store(total))
    return refused("its keys: " + *over);
  auto shape_of = [&moved](std::int64_t index) -> std::optional<shape_vector> {
    for (const auto& key : moved.keys)
      if (key.ps_key == static_cast<std::uint64_t>(index))
        return key.value.shape();
    return std::nullopt;
  };
  std::unique_ptr<updater> new_updater;
  if (moved.optimizer_states) {
    status loaded = ok();
    if (updater_) {
      loaded = updater_->load_states(*moved.optimizer_states, shape_of, true);
    } else {
      // The states carry their optimizer (a hand-over dumps it), which replaces this placeholder.
      auto placeholder = optimizer::create("sgd", {});
      if (!placeholder) {
        release_store(total);
        return placeholder.error();
      }
      new_updater = std::make_unique<updater>(std::move(*placeholder));
      loaded = new_updater->load_states(*moved.optimizer_states, shape_of);
    }
    if (!loaded) {
      release_store(total);
      return refused("optimizer states: " + loaded.error().message());
    }
  }
  // Nothing below refuses: the shard changes from here on.
  if (new_updater)
    updater_ = std::move(new_updater);
  policy_ = moved.policy;
  for (const auto& key : moved.keys) {
    key_entry entry;
    // A reply on its way from the old shard may still read the value: a value shared so is copied.
    entry.stored = key.value.storage_is_shared() ? key.value.copy() : key.value;
    entry.row_sparse = key.row_sparse;
    round_membership facts(options_.num_workers, policy_.quorum);
    for (const auto& came : key.joined)
      facts.admit(came.worker, came.round);
    for (const auto& gone : key.left)
      facts.retire(gone.worker, gone.round);
    open_rounds(entry, key.ps_key, key.completed, &facts);
    if (entry.async) {
      entry.async->resume(key.applied_per_worker, key.completed);
      for (const auto& came : key.joined)
        entry.async->admit(came.worker, came.round);
      entry.durable_pushes = key.applied_per_worker;
    }
    entry.durable = key.completed;
    auto& indexed = index_[key.ps_key];
    indexed = &keys_.emplace(key.ps_key, std::move(entry)).first->second;
  }
  for (auto range : moved.ranges)
    if (moved_ranges_[range]) {
      moved_ranges_[range] = false;
      --ranges_away_;
    }
  sum_in_optimizer_precision();
  changed_since_checkpoint_ = true;
  options_.log.info("took over " + std::to_string(moved.keys.size()) + " keys of " +
                    std::to_string(moved.ranges.size()) + " key ranges from server " +
                    std::to_string(moved.layout.server_rank));
  return ok();
}

void shard_core::on_range_data(const wire::range_data& msg, const reply_route& reply) {
  const auto& tensor = msg.tensor;
  auto refused = [&](const std::string& why) {
    incoming_.erase(reply.connection);
    refuse(reply, msg.request_id, std::nullopt, wire::error_code::invalid_argument,
           "range data " + std::to_string(msg.request_id) + " for shard " +
               std::to_string(options_.shard_index) + ": " + why);
  };
  if (msg.shard != options_.shard_index)
    return refused("it names shard " + std::to_string(msg.shard));
  auto& arriving = incoming_[reply.connection];
  if (tensor.offset == 0) {
    // A hand-over's first chunk: whatever the connection began before is dropped.
    const auto bound =
        options_.max_store_bytes > 0 ? options_.max_store_bytes : options_.max_value_bytes;
    if (tensor.total_bytes > bound)
      return refused(std::to_string(tensor.total_bytes) + " bytes, beyond the server's " +
                     std::to_string(bound) + " (data.max_store_bytes)");
    arriving = incoming_hand_over{msg.request_id, tensor.total_bytes, {}};
  } else if (arriving.request_id != msg.request_id || tensor.offset != arriving.bytes.size()) {
    return refused("a chunk at offset " + std::to_string(tensor.offset) +
                   " that does not continue what arrived");
  }
  if (tensor.total_bytes != arriving.total ||
      tensor.data.size() > arriving.total - arriving.bytes.size())
    return refused("chunks that do not add up to " + std::to_string(arriving.total) + " bytes");
  // Grown by what arrives, never by what a length field says.
  arriving.bytes.insert(arriving.bytes.end(), tensor.data.begin(), tensor.data.end());
  if (arriving.bytes.size() < arriving.total)
    return;
  auto whole = std::move(arriving.bytes);
  incoming_.erase(reply.connection);
  auto snapshot = decode_snapshot(std::span{whole}.first(msg.bytes), "range data");
  if (!snapshot)
    return refused(snapshot.error().message());
  if (auto taken = take_over(*snapshot); !taken)
    return refused(taken.error().message());
  reply(envelope{wire::ack{msg.request_id}, nullptr, 0});
}

// --- queries -------------------------------------------------------------------------------------

std::uint64_t shard_core::completed_rounds(std::uint64_t ps_key) const {
  auto found = keys_.find(ps_key);
  return found == keys_.end() ? 0 : found->second.completed();
}

std::uint64_t shard_core::dropped_pushes(std::uint64_t ps_key) const {
  auto found = keys_.find(ps_key);
  if (found == keys_.end())
    return 0;
  if (found->second.sparse)
    return found->second.sparse->dropped();
  return !found->second.sync ? 0 : found->second.sync->dropped();
}

std::size_t shard_core::waiting_pulls(std::uint64_t ps_key) const {
  auto found = keys_.find(ps_key);
  return found == keys_.end() ? 0 : found->second.pulls.size();
}

ndarray shard_core::value(std::uint64_t ps_key) const {
  auto found = keys_.find(ps_key);
  return found == keys_.end() ? ndarray{} : found->second.stored;
}

std::uint64_t shard_core::value_bytes(std::uint64_t ps_key) const noexcept {
  const auto* entry = find_key(ps_key);
  return entry == nullptr ? 0 : entry->stored.nbytes();
}

} // namespace troupe
