#include "actors/logic/worker_core.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>

#include "actors/logic/job_trace.hpp"
#include "actors/logic/scheduler_core.hpp"
#include "actors/logic/wire_conversions.hpp"

namespace troupe {
namespace {

/// "830 us", "12.4 ms" or "1.52 s".
std::string describe_us(double us) {
  char text[32];
  if (us < 1'000)
    std::snprintf(text, sizeof text, "%.0f us", us);
  else if (us < 1'000'000)
    std::snprintf(text, sizeof text, "%.3g ms", us / 1'000);
  else
    std::snprintf(text, sizeof text, "%.3g s", us / 1'000'000);
  return text;
}

/// "5 s" for whole seconds, "250 ms" otherwise.
std::string describe(std::chrono::milliseconds duration) {
  if (duration.count() % 1000 == 0)
    return std::to_string(duration.count() / 1000) + " s";
  return std::to_string(duration.count()) + " ms";
}

/// The flattened bytes [begin, end) elements of host array `array`.
std::span<std::byte> element_bytes(const ndarray& array, std::int64_t begin, std::int64_t end) {
  const auto size = size_of(array.dtype());
  return {static_cast<std::byte*>(const_cast<void*>(array.raw_data())) + begin * size,
          static_cast<std::size_t>(end - begin) * size};
}

wire::tensor_chunk slice_tensor(const ndarray& array, const key_slice& slice, bool whole) {
  wire::tensor_chunk tensor;
  tensor.type = to_wire(array.dtype());
  if (whole)
    tensor.shape.assign(array.shape().begin(), array.shape().end());
  else
    tensor.shape = {slice.size()};
  tensor.data = element_bytes(array, slice.begin, slice.end);
  tensor.total_bytes = tensor.data.size();
  return tensor;
}

const char* verb(kv_call call) {
  switch (call) {
  case kv_call::init:
    return "init";
  case kv_call::push:
    return "push";
  case kv_call::pushpull:
    return "pushpull";
  case kv_call::pull:
    return "pull";
  case kv_call::every_server:
    break;
  }
  return "request";
}

/// The last of `spares`, taken out of it; null when there is none.
template <class T>
std::shared_ptr<T> take_spare(std::vector<std::shared_ptr<T>>& spares) noexcept {
  if (spares.empty())
    return nullptr;
  auto spare = std::move(spares.back());
  spares.pop_back();
  return spare;
}

enum class answer_kind : std::size_t { push, pull, pushpull };
constexpr std::array<const char*, 3> kind_names{"push", "pull", "pushpull"};

} // namespace

worker_core::worker_core(worker_core_options options, output& out)
    : options_(std::move(options)), out_(out) {}

worker_core::~worker_core() {
  error gone{errc::peer_lost, "the KVStore worker stopped"};
  for (auto& [id, waiting] : parts_)
    waiting->call->end(gone);
  for (auto& [key, ps] : keys_)
    for (auto& waiting : ps.waiting)
      waiting->call->end(gone);
  if (finalizing_)
    finalizing_->deliver(std::uint64_t{0});
}

worker_clock::time_point worker_core::now() const {
  return options_.clock ? options_.clock() : worker_clock::now();
}

std::chrono::milliseconds worker_core::tick_interval() const noexcept {
  return std::clamp(options_.request_timeout / 8, std::chrono::milliseconds{10},
                    std::chrono::milliseconds{250});
}

bool worker_core::keeps_pushes() const {
  return recovery() || !options_.range_owner.empty();
}

bool worker_core::recovery() const {
  return options_.server_rejoin.count() > 0 && options_.can_relink;
}

std::size_t worker_core::waiting_for_credit(std::uint64_t ps_key) const {
  auto found = keys_.find(ps_key);
  return found == keys_.end() ? 0 : found->second.waiting.size();
}

// --- setup and calls
// ------------------------------------------------------------------------------

void worker_core::on_links(std::vector<std::string> names) {
  names_ = std::move(names);
  servers_.assign(names_.size(), server_state{});
  for (std::size_t s = 0; s < names_.size(); ++s)
    if (names_[s].empty())
      names_[s] = "server " + std::to_string(s);
}

void worker_core::on_call(kv_operation& op) {
  auto call = take_spare(spare_calls_);
  if (call)
    call->done = op.done;
  else
    call = std::make_shared<call_state>(op.done);
  if (failure_) {
    call->end(error{failure_->code(), op.what + ": " + failure_->message()});
    return;
  }
  if (names_.size() != options_.num_servers) {
    call->end(error{errc::internal, op.what + ": the worker has " + std::to_string(names_.size()) +
                                        " server links for " +
                                        std::to_string(options_.num_servers) + " servers"});
    return;
  }
  switch (op.call) {
  case kv_call::every_server:
    for (std::uint32_t server = 0; server < options_.num_servers; ++server) {
      if (servers_[server].left)
        continue; // it holds nothing any more
      auto p = new_part(call, kv_call::every_server, server, op.what);
      const auto id = next_request_id_++;
      sent(id, p);
      enqueue(p, op.message_for(id, server), nullptr);
    }
    break;
  case kv_call::init:
  case kv_call::push:
  case kv_call::pushpull:
  case kv_call::pull:
    if (op.keys.size() > 1) {
      // The keys' requests gather in the send queues, to leave fused (pump).
      begin_gathering();
      try {
        for (auto& work : op.keys)
          add_key(call, op, work);
      } catch (...) {
        end_gathering();
        throw;
      }
      end_gathering();
    } else {
      for (auto& work : op.keys)
        add_key(call, op, work);
    }
    break;
  }
  if (call->remaining == 0)
    call->end(ok());
}

void worker_core::end_gathering() {
  if (gathering_ == 0 || --gathering_ > 0)
    return;
  for (std::uint32_t server = 0; server < servers_.size(); ++server)
    if (servers_[server].gathered > 0)
      pump(server);
}

bool worker_core::sends_at_once(const kv_operation& op, std::size_t max_bytes) const {
  return sends_at_once_to(op, max_bytes).has_value();
}

bool worker_core::small_enough_to_send_at_once(const kv_operation& op, std::size_t max_bytes) {
  if (op.keys.size() != 1 ||
      (op.call != kv_call::push && op.call != kv_call::pushpull && op.call != kv_call::pull))
    return false;
  const auto& work = op.keys.front();
  if (work.row_sparse)
    return false;
  const auto elements = work.value.is_none() ? element_count(work.shape) : work.value.size();
  return static_cast<std::size_t>(elements) * size_of(work.type) <= max_bytes;
}

std::uint32_t worker_core::num_ranges() const noexcept {
  return options_.range_owner.empty() ? options_.num_servers
                                      : static_cast<std::uint32_t>(options_.range_owner.size());
}

key_slices worker_core::to_owners(key_slices slices) const {
  if (!options_.range_owner.empty())
    for (auto& slice : slices)
      slice.server = options_.range_owner[slice.server];
  return slices;
}

std::optional<std::uint32_t> worker_core::sends_at_once_to(const kv_operation& op,
                                                           std::size_t max_bytes) const {
  if (failure_ || names_.size() != options_.num_servers ||
      !small_enough_to_send_at_once(op, max_bytes))
    return std::nullopt;
  const auto& work = op.keys.front();
  const auto elements = work.value.is_none() ? element_count(work.shape) : work.value.size();
  const auto max_slice_elements =
      static_cast<std::int64_t>(options_.slice_bytes / size_of(work.type));
  const auto slices =
      to_owners(place_key(static_cast<std::uint64_t>(work.index), elements, num_ranges(),
                          options_.bigarray_bound, max_slice_elements));
  if (slices.size() != 1 || slices.front().server >= servers_.size())
    return std::nullopt;
  const auto& server = servers_[slices.front().server];
  if (server.down || !server.ready.empty() ||
      (options_.send_window_bytes != 0 && server.with_link >= options_.send_window_bytes))
    return std::nullopt;
  const std::uint32_t to = slices.front().server;
  auto found = keys_.find(slices.front().ps_key);
  if (found == keys_.end())
    return to;
  const auto& ps = found->second;
  if (!ps.waiting.empty() || ps.head_ready)
    return std::nullopt;
  if (options_.sync && op.call != kv_call::pull &&
      ps.next_round >= ps.completed + options_.max_rounds_ahead)
    return std::nullopt;
  return to;
}

std::shared_ptr<worker_core::part> worker_core::new_part(const std::shared_ptr<call_state>& call,
                                                         kv_call kind, std::uint32_t server,
                                                         std::string name) {
  auto p = take_spare(spare_parts_);
  if (!p)
    p = std::make_shared<part>();
  p->call = call;
  p->kind = kind;
  p->server = server;
  p->name = std::move(name);
  ++call->remaining;
  return p;
}

/// How errors name a request: "pull of key 3 from server 1 (node 10) at 127.0.0.1:40123",
/// "set_optimizer sgd on server 0". Built only when something is reported.
std::string worker_core::what_of(const part& p) const {
  if (p.kind == kv_call::every_server)
    return p.name + " on " + names_[p.server];
  return std::string{verb(p.kind)} + " of key " + p.name +
         (p.kind == kv_call::pull ? " from " : " to ") + names_[p.server];
}

/// The requests of one key of a call: one per slice, each queued behind the key's earlier
/// requests when those are still waiting for credit.
void worker_core::add_key(const std::shared_ptr<call_state>& call, const kv_operation& op,
                          kv_key_work& work) {
  if (work.row_sparse) {
    add_rows(call, op, work);
    return;
  }
  const auto kind = op.call;
  const bool compressed = (kind == kv_call::push || kind == kv_call::pushpull) &&
                          op.compression.enabled() && compressible(work.type);
  const bool packed_reply = (kind == kv_call::pull || kind == kv_call::pushpull) &&
                            op.compression.enabled() && op.compression.pulls &&
                            compressible(work.type);
  const auto elements = work.value.is_none() ? element_count(work.shape) : work.value.size();
  const auto max_slice_elements =
      static_cast<std::int64_t>(options_.slice_bytes / size_of(work.type));
  auto slices = to_owners(place_key(static_cast<std::uint64_t>(work.index), elements, num_ranges(),
                                    options_.bigarray_bound, max_slice_elements));
  // Slice credit: the slices of this key on one server are a group of their own when there are
  // several (every server the key uses holds as many: key_slice::slot).
  const bool several_per_server = slices.back().slot > 0;
  std::shared_ptr<pull_target> target;
  if (kind == kv_call::pull || kind == kv_call::pushpull) {
    target = take_spare(spare_targets_);
    if (!target)
      target = std::make_shared<pull_target>();
    target->slices_left = slices.size();
    const bool direct = work.outputs.size() == 1 && work.outputs[0].ctx().is_cpu();
    if (direct) {
      target->buffer = std::move(work.outputs[0]);
    } else {
      target->buffer = ndarray::empty(work.shape, context::cpu(), work.type);
      target->copies = work.outputs;
    }
  }
  for (const auto& slice : slices) {
    auto p = new_part(call, kind, slice.server, work.name);
    p->slice = slice;
    p->whole = slices.size() == 1;
    // The last slice takes the caller's handle: copying an ndarray allocates its shape.
    if (&slice == &slices.back())
      p->value = std::move(work.value);
    else
      p->value = work.value;
    p->priority = op.priority;
    if (compressed)
      p->compression = op.compression;
    p->sliced = several_per_server;
    p->group = static_cast<std::uint64_t>(work.index) * options_.num_servers + slice.server;
    if (target) {
      auto bytes = element_bytes(target->buffer, slice.begin, slice.end);
      p->copy_off_thread = bytes.size() >= copy_off_thread_bytes;
      p->out_bytes = bytes;
      p->out_type = to_wire(work.type);
      if (p->whole)
        p->out_shape.assign(work.shape.begin(), work.shape.end());
      else
        p->out_shape.assign(1, slice.size());
      p->target = target;
      if (packed_reply)
        p->reply_compression = op.compression;
      open_assembly(*p);
    }
    if (kind == kv_call::init)
      send_keyed(p, keys_[p->slice.ps_key]);
    else
      submit(p);
  }
}

void worker_core::add_rows(const std::shared_ptr<call_state>& call, const kv_operation& op,
                           kv_key_work& work) {
  const auto kind = op.call;
  const std::int64_t num_rows = work.shape.empty() ? 0 : work.shape[0];
  std::int64_t row_elements = 1;
  for (std::size_t axis = 1; axis < work.shape.size(); ++axis)
    row_elements *= work.shape[axis];
  const auto slices = to_owners(place_rows(static_cast<std::uint64_t>(work.index), num_rows,
                                           row_elements, num_ranges(), options_.bigarray_bound));
  const auto row_bytes = static_cast<std::uint64_t>(row_elements) * size_of(work.type);
  std::shared_ptr<pull_target> target;
  if (kind == kv_call::pull) {
    target = take_spare(spare_targets_);
    if (!target)
      target = std::make_shared<pull_target>();
    target->slices_left = slices.size();
    target->buffer = std::move(work.outputs.at(0));
  }
  // The rows of the call that each part's server holds: [from[i], from[i + 1]) of work.rows.
  std::vector<std::int64_t> from(slices.size() + 1, 0);
  for (std::size_t i = 0; i < slices.size(); ++i)
    from[i + 1] =
        std::lower_bound(work.rows.begin(), work.rows.end(), slices[i].end_row) - work.rows.begin();
  if (kind == kv_call::push)
    for (std::size_t i = 0; i < slices.size(); ++i) {
      // One frame carries a part (a row-sparse tensor is never split): it must fit the servers'
      // frames. Checked for every part before any leaves, so that no server gets a round the
      // others miss.
      const auto count = static_cast<std::uint64_t>(from[i + 1] - from[i]);
      const auto bytes = count * (row_bytes + 8);
      if (bytes + 4096 > options_.max_frame_bytes || count * row_bytes > wire::max_chunk_bytes) {
        call->end(error{
            errc::invalid_argument,
            "push of key " + work.name + ": its rows for " + names_[slices[i].server] + " take " +
                std::to_string(bytes) + " bytes, more than one frame holds (data.max_frame_bytes " +
                std::to_string(options_.max_frame_bytes) + "); push fewer rows per call"});
        return;
      }
    }
  for (std::size_t i = 0; i < slices.size(); ++i) {
    const auto& slice = slices[i];
    auto p = new_part(call, kind, slice.server, work.name);
    p->row_sparse = true;
    p->priority = op.priority;
    p->slice = slice;
    p->whole = slices.size() == 1;
    p->part_shape.assign(work.shape.begin(), work.shape.end());
    if (kind == kv_call::init) {
      p->part_shape[0] = slice.end_row - slice.first_row;
      p->value = work.value;
      send_keyed(p, keys_[slice.ps_key]);
      continue;
    }
    auto rows = std::make_shared<std::vector<std::int64_t>>();
    rows->reserve(static_cast<std::size_t>(from[i + 1] - from[i]));
    for (auto at = from[i]; at < from[i + 1]; ++at)
      rows->push_back(work.rows[static_cast<std::size_t>(at)] - slice.first_row);
    p->slice.begin = from[i] * row_elements;
    p->slice.end = from[i + 1] * row_elements;
    p->part_shape[0] = from[i + 1] - from[i];
    p->rows = std::move(rows);
    if (kind == kv_call::push) {
      p->value = work.value;
    } else {
      auto bytes = element_bytes(target->buffer, p->slice.begin, p->slice.end);
      p->copy_off_thread = bytes.size() >= copy_off_thread_bytes;
      p->out_bytes = bytes;
      p->out_type = to_wire(work.type);
      p->out_shape = p->part_shape;
      p->assembly.emplace(bytes, p->out_type, p->out_shape);
      p->target = target;
    }
    submit(p);
  }
}

// --- credit and sending
// ---------------------------------------------------------------------------

bool worker_core::has_credit(const ps_key_state& ps, const part& p) const {
  if (!options_.sync || p.kind == kv_call::pull)
    return true;
  const auto round = p.resend ? p.round : ps.next_round;
  return round < ps.completed + options_.max_rounds_ahead;
}

bool worker_core::needs_slice_credit(const part& p) const {
  return options_.slice_credit > 0 && options_.sync && options_.num_workers > 1 && p.sliced &&
         !p.resend && (p.kind == kv_call::push || p.kind == kv_call::pushpull);
}

/// Whether a push among the ps-key's waiting requests needs slice credit (so the key belongs in
/// its group's turn).
bool worker_core::wants_slice_credit(const ps_key_state& ps) const {
  return std::any_of(ps.waiting.begin(), ps.waiting.end(),
                     [&](const auto& p) { return needs_slice_credit(*p); });
}

/// Whether request `p`, the next of its ps-key, may go as far as slice credit goes: it needs
/// none, or one is free and no push of its group asked before it.
bool worker_core::slice_credit_free(const part& p) const {
  if (!needs_slice_credit(p))
    return true;
  auto found = slice_groups_.find(p.group);
  if (found == slice_groups_.end())
    return true;
  const auto& group = found->second;
  return group.taken < options_.slice_credit &&
         (group.turn.empty() || group.turn.front() == p.slice.ps_key);
}

/// After the waiting requests of `ps_key` changed: it joins its group's turn when a push of it
/// now needs slice credit (behind the pushes that asked before), leaves the turn when none does,
/// and the group's next pushes go as far as credit allows.
void worker_core::settle_turn(std::uint64_t ps_key, ps_key_state& ps) {
  if (!ps.group || options_.slice_credit == 0)
    return;
  auto& group = slice_groups_[*ps.group];
  const bool wants = wants_slice_credit(ps);
  if (wants && !ps.in_turn) {
    group.turn.push_back(ps_key);
    ps.in_turn = true;
  } else if (!wants && ps.in_turn) {
    std::erase(group.turn, ps_key);
    ps.in_turn = false;
  }
  advance_turn(*ps.group);
}

/// Sends the pushes of `group` whose turn it is while it has credits free.
void worker_core::advance_turn(std::uint64_t id) {
  auto found = slice_groups_.find(id);
  if (found == slice_groups_.end() || found->second.advancing || turns_held_)
    return;
  auto& group = found->second;
  group.advancing = true;
  while (group.taken < options_.slice_credit && !group.turn.empty()) {
    const auto ps_key = group.turn.front();
    release_waiting(ps_key, keys_[ps_key]);
    // Still first: its push waits for sync credit, and goes when an answer of its key brings it.
    if (!group.turn.empty() && group.turn.front() == ps_key)
      break;
  }
  group.advancing = false;
}

/// Request `p` was answered, or ended without an answer: the slice credit it took is free.
void worker_core::give_back_slice_credit(part& p) {
  if (!p.holds_slice_credit)
    return;
  p.holds_slice_credit = false;
  auto found = slice_groups_.find(p.group);
  if (found == slice_groups_.end())
    return;
  if (found->second.taken > 0)
    --found->second.taken;
  advance_turn(p.group);
}

std::uint32_t worker_core::slice_credits_taken(std::uint64_t key, std::uint32_t server) const {
  auto found = slice_groups_.find(key * options_.num_servers + server);
  return found == slice_groups_.end() ? 0 : found->second.taken;
}

void worker_core::submit(const std::shared_ptr<part>& p) {
  const auto ps_key = p->slice.ps_key;
  auto& ps = keys_[ps_key];
  ps.server = p->server;
  if (p->sliced)
    ps.group = p->group;
  if (ps.waiting.empty() && has_credit(ps, *p) && slice_credit_free(*p)) {
    send_keyed(p, ps);
  } else {
    ps.waiting.push_back(p);
    settle_turn(ps_key, ps);
  }
}

/// Sends what sync credit and slice credit now allow of the key's waiting requests, in order;
/// those whose call is over go nowhere.
void worker_core::release_waiting(std::uint64_t ps_key, ps_key_state& ps) {
  while (!ps.waiting.empty()) {
    const auto& head = *ps.waiting.front();
    if (!head.call->over() && (!has_credit(ps, head) || !slice_credit_free(head)))
      break;
    auto p = std::move(ps.waiting.front());
    ps.waiting.pop_front();
    if (!p->call->over())
      send_keyed(p, ps);
  }
  settle_turn(ps_key, ps);
}

/// Sends request `p` of the ps-key whose state is `ps`.
void worker_core::send_keyed(const std::shared_ptr<part>& p, ps_key_state& ps) {
  const auto id = next_request_id_++;
  const auto ps_key = p->slice.ps_key;
  ps.server = p->server;
  const bool pushes = p->kind == kv_call::push || p->kind == kv_call::pushpull;
  if (needs_slice_credit(*p)) {
    ++slice_groups_[p->group].taken;
    p->holds_slice_credit = true;
    // Its turn came (slice_credit_free): the group's next push is first now.
    if (ps.in_turn) {
      std::erase(slice_groups_[p->group].turn, ps_key);
      ps.in_turn = false;
    }
  }
  if (!p->resend) {
    ps.pushed = ps.pushed || pushes;
    p->round = pushes ? ps.next_round++ : ps.next_round;
    // Here, in the order the ps-key's pushes leave, so that its residual takes them in order.
    if (pushes && p->compression.enabled())
      pack(*p, ps);
    if (pushes && keeps_pushes() && p->row_sparse) {
      // Its rows' values and the rows: the caller may reuse its arrays once the push is acked.
      const auto tensor = part_tensor(*p);
      shape_vector shape(tensor.shape.begin(), tensor.shape.end());
      auto copy = ndarray::empty(shape, context::cpu(), p->value.dtype());
      if (!tensor.data.empty())
        std::memcpy(copy.raw_data(), tensor.data.data(), tensor.data.size());
      ps.kept.push_back(kept_push{p->round, std::move(copy), p->rows});
    } else if (pushes && keeps_pushes()) {
      // The values push `p` sends, copied: the caller may reuse its array once the push is acked.
      // A compressed push keeps what its packed bytes stand for, and is sent again dense: the
      // same values, without taking from the residual twice.
      const auto tensor = slice_tensor(p->value, p->slice, p->whole);
      shape_vector shape(tensor.shape.begin(), tensor.shape.end());
      auto copy = ndarray::empty(shape, context::cpu(), p->value.dtype());
      if (p->packed.is_none())
        std::memcpy(copy.raw_data(), tensor.data.data(), tensor.data.size());
      else
        dequantize(p->compression, p->value.dtype(),
                   static_cast<const std::byte*>(p->packed.raw_data()), copy.raw_data(),
                   static_cast<std::size_t>(p->slice.size()));
      ps.kept.push_back(kept_push{p->round, std::move(copy)});
    }
  }
  const auto timeout_ms = static_cast<std::uint32_t>(std::min<std::int64_t>(
      options_.request_timeout.count(), std::numeric_limits<std::uint32_t>::max()));
  wire::message whole;
  switch (p->kind) {
  case kv_call::init:
    if (p->row_sparse) {
      auto tensor = slice_tensor(p->value, p->slice, true);
      tensor.shape = p->part_shape;
      whole = wire::init{id, ps_key, std::move(tensor), true};
    } else {
      whole = wire::init{id, ps_key, slice_tensor(p->value, p->slice, p->whole)};
    }
    break;
  case kv_call::push:
    whole = wire::push{id, ps_key, options_.rank, p->round, part_tensor(*p), p->resend};
    break;
  case kv_call::pushpull: {
    wire::pushpull request{id,         ps_key,   options_.rank, p->round, part_tensor(*p),
                           timeout_ms, p->resend};
    request.reply_compression = {to_wire(p->reply_compression.type),
                                 p->reply_compression.threshold};
    whole = std::move(request);
    break;
  }
  case kv_call::pull: {
    wire::pull_request request{id, ps_key, options_.rank, p->round, timeout_ms};
    if (p->row_sparse) {
      request.row_sparse = true;
      request.row_ids = std::as_bytes(std::span{*p->rows});
    }
    request.reply_compression = {to_wire(p->reply_compression.type),
                                 p->reply_compression.threshold};
    whole = request;
    break;
  }
  case kv_call::every_server:
    return;
  }
  sent(id, p);
  enqueue(p, std::move(whole), &ps);
}

void worker_core::pack(part& p, ps_key_state& ps) {
  const auto elements = static_cast<std::size_t>(p.slice.size());
  if (ps.residual.size() != elements)
    ps.residual.assign(elements, 0.0f);
  const auto bytes = packed_bytes(p.compression.type, elements);
  p.packed = ndarray::empty({static_cast<std::int64_t>(bytes / 4)}, context::cpu(), dtype::int32);
  quantize(p.compression, p.value.dtype(),
           element_bytes(p.value, p.slice.begin, p.slice.end).data(), ps.residual.data(),
           static_cast<std::byte*>(p.packed.raw_data()), elements);
}

/// The tensor request `p` sends: its slice of the value, or, once packed, the packed bytes.
wire::tensor_chunk worker_core::part_tensor(const part& p) const {
  if (p.row_sparse) {
    wire::tensor_chunk tensor;
    tensor.type = to_wire(p.value.dtype());
    tensor.shape = p.part_shape;
    tensor.data = element_bytes(p.value, p.slice.begin, p.slice.end);
    tensor.total_bytes = tensor.data.size();
    tensor.row_sparse = true;
    tensor.row_ids = std::as_bytes(std::span{*p.rows});
    return tensor;
  }
  auto tensor = slice_tensor(p.value, p.slice, p.whole);
  if (!p.packed.is_none()) {
    tensor.data = {static_cast<const std::byte*>(p.packed.raw_data()), p.packed.nbytes()};
    tensor.compression = {to_wire(p.compression.type), p.compression.threshold,
                          static_cast<std::uint64_t>(p.slice.size())};
  }
  return tensor;
}

void worker_core::sent(std::uint64_t id, const std::shared_ptr<part>& p) {
  p->sent_at = now();
  p->traced_since_us = trace_start_time();
  remember(id, p);
}

/// Request `id` is under way as `p`.
void worker_core::remember(std::uint64_t id, const std::shared_ptr<part>& p) {
  if (spare_part_nodes_.empty()) {
    parts_.emplace(id, p);
    return;
  }
  auto node = std::move(spare_part_nodes_.back());
  spare_part_nodes_.pop_back();
  node.key() = id;
  node.mapped() = p;
  parts_.insert(std::move(node));
}

/// Request `id` is no longer under way (answered, failed or dropped).
void worker_core::forget(std::uint64_t id) {
  auto node = parts_.extract(id);
  if (node.empty())
    return;
  node.mapped().reset();
  if (spare_part_nodes_.size() < max_spares)
    spare_part_nodes_.push_back(std::move(node));
}

/// `p` was answered and nothing else holds it (no copy job, no queue): it and its pull target
/// serve the next requests.
void worker_core::recycle(std::shared_ptr<part> p) {
  if (p.use_count() != 1 || spare_parts_.size() >= max_spares)
    return;
  if (p->target && p->target.use_count() == 1 && spare_targets_.size() < max_spares) {
    auto target = std::move(p->target);
    target->buffer = ndarray{};
    target->copies.clear();
    target->slices_left = 0;
    spare_targets_.push_back(std::move(target));
  }
  if (p->call.use_count() == 1 && spare_calls_.size() < max_spares) {
    auto call = std::move(p->call);
    call->done = idle_completion_;
    call->remaining = 0;
    call->ended = false;
    spare_calls_.push_back(std::move(call));
  }
  *p = part{};
  spare_parts_.push_back(std::move(p));
}

/// Puts `o` among the ready requests of `state`.
void worker_core::make_ready(server_state& state, outgoing o) {
  if (spare_queue_nodes_.empty()) {
    state.ready.emplace(o.order, std::move(o));
    return;
  }
  auto node = std::move(spare_queue_nodes_.back());
  spare_queue_nodes_.pop_back();
  node.key() = o.order;
  node.mapped() = std::move(o);
  state.ready.insert(std::move(node));
}

// --- the send queue
// -------------------------------------------------------------------------------

/// Puts request `p` (of the ps-key whose state is `ps`; null: keyless) in its server's send queue:
/// among the ready requests when nothing of its ps-key is queued, else behind the key's last.
void worker_core::enqueue(const std::shared_ptr<part>& p, wire::message request, ps_key_state* ps) {
  auto& server = servers_[p->server];
  outgoing o;
  o.p = p;
  o.keepalive = !p->packed.is_none() ? p->packed.keepalive()
                : p->value.is_none() ? nullptr
                                     : p->value.keepalive();
  if (p->rows)
    // Its frame views the row ids too, which must outlive the request's part (a failed call
    // recycles it while the frame may still be queued on the link).
    o.keepalive = std::make_shared<
        std::pair<std::shared_ptr<const void>, std::shared_ptr<const std::vector<std::int64_t>>>>(
        std::move(o.keepalive), p->rows);
  o.frames.emplace(std::move(request), options_.chunk_bytes);
  o.order = send_order{server.epoch, ps == nullptr, p->priority, server.next_sequence++};
  if (ps == nullptr) {
    // Everything queued after a keyless request leaves after it.
    ++server.epoch;
    make_ready(server, std::move(o));
  } else if (ps->head_ready) {
    ps->queued.push_back(std::move(o));
  } else {
    ps->head_ready = true;
    make_ready(server, std::move(o));
  }
  if (gathering_ > 0 && options_.fuse_frame_bytes > 0) {
    // Gathered until a fused frame's worth is ready (or the call has been taken: on_call); a
    // pull counts as if it carried its value.
    // At least 1: a request without a tensor (a command) must be pumped too.
    server.gathered +=
        std::max<std::size_t>({1, p->out_bytes.size(),
                               p->value.is_none() ? 0
                                                  : static_cast<std::size_t>(p->slice.size()) *
                                                        size_of(p->value.dtype())});
    if (server.gathered < options_.fuse_frame_bytes)
      return;
  }
  pump(p->server);
}

/// Hands the link of `server` the next frames of its ready requests, best first, while its
/// window has room; a frame larger than the window goes when nothing else is with the link.
void worker_core::pump(std::uint32_t server) {
  auto& state = servers_[server];
  state.gathered = 0;
  const auto window = options_.send_window_bytes;
  auto window_open = [&](std::uint64_t more) {
    return window == 0 || state.with_link + more < window;
  };
  // A server being recovered: its requests wait, and are queued afresh once it is back.
  while (!state.down && !state.ready.empty() && window_open(0)) {
    auto head = state.ready.begin();
    auto& o = head->second;
    if (fuses_with_next(state, head)) {
      // The small requests at the head of the queue, in its order, in one frame.
      // Room for as many requests as the head's size suggests the frame takes: one allocation
      // each, not one per doubling (a guess: requests of other sizes may grow them).
      const auto most =
          std::min({state.ready.size(), wire::max_batch_messages,
                    options_.fuse_frame_bytes / std::max<std::size_t>(tensor_bytes(o), 64)});
      wire::batch fused;
      fused.messages.reserve(most);
      auto keepalives = std::make_shared<std::vector<std::shared_ptr<const void>>>();
      keepalives->reserve(most);
      std::uint64_t bytes = 0;
      do {
        auto& one = head->second;
        auto msg = one.frames->chunk(0);
        bytes += wire::tensor_of(msg) == nullptr ? 0 : wire::tensor_of(msg)->data.size();
        fused.messages.push_back(*wire::to_batched(std::move(msg)));
        if (one.keepalive)
          keepalives->push_back(one.keepalive);
        ++one.next;
        took_frame(state, head);
        head = state.ready.begin();
      } while (head != state.ready.end() && fusable(head->second) &&
               fused.messages.size() < wire::max_batch_messages &&
               bytes + tensor_bytes(head->second) <= options_.fuse_frame_bytes &&
               window_open(bytes));
      envelope frame{wire::message{std::move(fused)}, nullptr, server + 1};
      if (!keepalives->empty())
        frame.keepalive = std::move(keepalives);
      const send_receipt receipt{server, state.link, bytes};
      state.with_link += receipt.bytes;
      out_.send(server, std::move(frame), receipt);
      continue;
    }
    envelope frame{o.frames->chunk(o.next), o.keepalive, server + 1};
    ++o.next;
    const auto* tensor = wire::tensor_of(frame.msg);
    const send_receipt receipt{server, state.link, tensor == nullptr ? 0 : tensor->data.size()};
    took_frame(state, head);
    state.with_link += receipt.bytes;
    out_.send(server, std::move(frame), receipt);
  }
}

/// A request that may leave fused (see "Fusion"): a push, pull or pushpull in one frame, none of
/// it sent yet, whose tensor holds at most fuse_item_bytes.
bool worker_core::fusable(const outgoing& o) const {
  if (options_.fuse_frame_bytes == 0 || o.next != 0 || o.frames->chunk_count() != 1 ||
      o.p->row_sparse)
    return false;
  const auto kind = o.p->kind;
  if (kind != kv_call::push && kind != kv_call::pull && kind != kv_call::pushpull)
    return false;
  return tensor_bytes(o) <= options_.fuse_item_bytes;
}

/// Whether the request at `head` leaves fused with the one after it (else alone, as it is).
bool worker_core::fuses_with_next(const server_state& state, send_queue::iterator head) const {
  if (!fusable(head->second))
    return false;
  auto second = std::next(head);
  if (second == state.ready.end() || !fusable(second->second))
    return false;
  const auto first_bytes = tensor_bytes(head->second);
  const auto window = options_.send_window_bytes;
  return first_bytes + tensor_bytes(second->second) <= options_.fuse_frame_bytes &&
         (window == 0 || state.with_link + first_bytes < window);
}

/// Bytes of tensor a request sends (its slice of the value; none for a pull).
std::size_t worker_core::tensor_bytes(const outgoing& o) {
  return o.p->value.is_none()
             ? 0
             : static_cast<std::size_t>(o.p->slice.size()) * size_of(o.p->value.dtype());
}

/// The frame of `head` that was just taken (o.next advanced): when it was the request's last, the
/// request leaves the queue and its key's next request becomes ready, in its own place.
void worker_core::took_frame(server_state& state, send_queue::iterator head) {
  auto& o = head->second;
  if (o.next != o.frames->chunk_count())
    return;
  const bool keyed = o.p->kind != kv_call::every_server;
  const auto ps_key = o.p->slice.ps_key;
  auto node = state.ready.extract(head);
  node.mapped() = outgoing{};
  if (spare_queue_nodes_.size() < max_spares)
    spare_queue_nodes_.push_back(std::move(node));
  if (!keyed)
    return;
  auto& ps = keys_[ps_key];
  if (ps.queued.empty()) {
    ps.head_ready = false;
  } else {
    auto next = std::move(ps.queued.front());
    ps.queued.pop_front();
    make_ready(state, std::move(next));
  }
}

void worker_core::frame_left(const send_receipt& receipt) {
  if (receipt.server >= servers_.size())
    return;
  auto& state = servers_[receipt.server];
  // A receipt of a server's old link: its frames are gone with it, and counted out already.
  if (receipt.link != state.link)
    return;
  state.with_link -= std::min(state.with_link, receipt.bytes);
  pump(receipt.server);
}

std::uint64_t worker_core::bytes_with_link(std::uint32_t server) const {
  return server < servers_.size() ? servers_[server].with_link : 0;
}

/// Empties the send queue of `server`: its requests go again afresh (a restarted server), or
/// nothing goes any more (the worker failed).
void worker_core::drop_send_queue(std::uint32_t server) {
  servers_[server].ready.clear();
  for (auto& [ps_key, ps] : keys_)
    if (ps.server == server) {
      ps.queued.clear();
      ps.head_ready = false;
    }
}

// --- the summary
// ----------------------------------------------------------------------------------

/// What the summary and the job trace note of an answered push, pull or pushpull.
void worker_core::note_answered(const part& p) {
  if (p.kind == kv_call::init || p.kind == kv_call::every_server)
    return;
  // Every answer passes here: without a summary to print or a trace to record, nothing is
  // counted.
  const bool summarised = options_.summary_log.enabled(log_level::info);
  if (!summarised && p.traced_since_us == 0)
    return;
  const auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(now() - p.sent_at);
  const auto element = static_cast<std::uint64_t>(p.value.is_none() ? 0 : size_of(p.value.dtype()));
  const std::uint64_t pushed =
      p.kind == kv_call::pull ? 0 : static_cast<std::uint64_t>(p.slice.size()) * element;
  const std::uint64_t pulled = p.kind == kv_call::push ? 0 : p.out_bytes.size();
  if (traffic_.size() < names_.size())
    traffic_.resize(names_.size());
  if (p.server < traffic_.size()) {
    auto& to = traffic_[p.server];
    ++to.requests;
    to.bytes_pushed += pushed;
    to.bytes_pulled += pulled;
  }
  const auto kind = static_cast<std::size_t>(p.kind == kv_call::push   ? answer_kind::push
                                             : p.kind == kv_call::pull ? answer_kind::pull
                                                                       : answer_kind::pushpull);
  answer_times_[kind].record(elapsed);
  if (p.traced_since_us != 0)
    job_trace::process().record({kind_names[kind], p.slice.ps_key, p.round, p.server,
                                 pushed + pulled, p.traced_since_us, job_trace::now_us()});
}

void worker_core::log_summary() const {
  if (!options_.summary_log.enabled(log_level::info))
    return;
  for (std::size_t s = 0; s < traffic_.size(); ++s)
    options_.summary_log.info("to " + names_[s] + ": " + std::to_string(traffic_[s].requests) +
                              " requests, " + std::to_string(traffic_[s].bytes_pushed) +
                              " bytes pushed, " + std::to_string(traffic_[s].bytes_pulled) +
                              " bytes pulled");
  for (std::size_t k = 0; k < answer_times_.size(); ++k)
    if (answer_times_[k].count() > 0)
      options_.summary_log.info(std::string{kind_names[k]} + " times over " +
                                std::to_string(answer_times_[k].count()) + " requests: p50 " +
                                describe_us(answer_times_[k].quantile_us(0.5)) + ", p99 " +
                                describe_us(answer_times_[k].quantile_us(0.99)));
  if (options_.summary_footer)
    options_.summary_log.info(options_.summary_footer());
}

// --- replies
// --------------------------------------------------------------------------------------

void worker_core::on_reply(envelope& reply) {
  if (auto* fused = std::get_if<wire::batch>(&reply.msg)) {
    // Each answer as if it had come alone, in order.
    for (auto& one : fused->messages) {
      envelope each{wire::unbatched(std::move(one)), reply.keepalive, reply.connection};
      on_reply(each);
    }
    return;
  }
  const auto id = wire::request_id_of(reply.msg);
  auto found = parts_.find(id);
  if (found == parts_.end()) {
    if (const auto* err = std::get_if<wire::error_reply>(&reply.msg); err && id == 0)
      options_.log.error("a server refused a frame: " + err->message);
    else
      options_.log.debug([&] {
        return "dropped a late " + std::string{wire::kind_name(reply.msg)} + " for request " +
               std::to_string(id);
      });
    return;
  }
  auto p = found->second;
  if (const auto* ack = std::get_if<wire::ack>(&reply.msg)) {
    if (p->kind == kv_call::push)
      learn_round(p->slice.ps_key, ack->round, ack->dropped, ack->durable);
    finish(id, p, ok());
  } else if (std::holds_alternative<wire::pull_reply>(reply.msg)) {
    on_value(id, p, reply);
  } else if (const auto* err = std::get_if<wire::error_reply>(&reply.msg)) {
    if (err->code == wire::error_code::moved && p->kind != kv_call::every_server) {
      // Its key range left that server: it goes again once a table names the new one.
      options_.log.debug([&] { return what_of(*p) + ": " + err->message; });
      return;
    }
    forget_failed_push(*p);
    finish(id, p, from_wire(*err, what_of(*p) + ": "));
  } else {
    finish(id, p,
           error{errc::malformed_message, what_of(*p) + ": unexpected " +
                                              std::string{wire::kind_name(reply.msg)} + " reply"});
  }
  recycle(std::move(p));
}

/// What an answer says of the server's rounds of a key: more credit. A push dropped because
/// its round closed with a quorum of other workers leaves this worker's round numbers as they
/// are: every worker pushes every round, so every round reaches its quorum and no pull waits
/// forever. Moving a straggler forward to the round being collected would make it skip rounds
/// and push, at the end, a round the others never push.
void worker_core::learn_round(std::uint64_t ps_key, std::uint64_t completed, bool dropped,
                              std::uint64_t durable) {
  auto& ps = keys_[ps_key];
  ps.durable = std::max(ps.durable, durable);
  while (!ps.kept.empty() && ps.kept.front().round < ps.durable)
    ps.kept.pop_front();
  if (!options_.sync)
    return;
  ps.completed = std::max(ps.completed, completed);
  if (dropped)
    ++dropped_pushes_;
  release_waiting(ps_key, ps);
}

/// dist_async: a push the server refused was not applied, and the caller hears so; sent again
/// after a restart, it could be. (In dist_sync a round whose update failed closed all the same,
/// and a restored server needs every worker's push of it again.)
void worker_core::forget_failed_push(const part& p) {
  if (options_.sync || (p.kind != kv_call::push && p.kind != kv_call::pushpull))
    return;
  auto& kept = keys_[p.slice.ps_key].kept;
  std::erase_if(kept, [&](const kept_push& push) { return push.round == p.round; });
}

void worker_core::open_assembly(part& p) {
  p.assembly.emplace(p.out_bytes, p.out_type, p.out_shape);
  if (p.reply_compression.enabled())
    p.assembly->accept_packed([](const wire::tensor_chunk& chunk, std::byte* out) {
      // copy_chunk has checked that the chunk's rule is the one asked for.
      dequantize(from_wire(chunk.compression), from_wire(chunk.type), chunk.data.data(), out,
                 static_cast<std::size_t>(chunk.compression.elements));
    });
}

/// Copies one reply chunk into its request's output, unless the caller has stopped waiting.
/// Touches only `p.assembly` and the call's completion, so it may run on another thread.
std::pair<chunk_copy, std::string> worker_core::copy_chunk(part& p, const wire::pull_reply& value) {
  if (const auto& packing = value.tensor.compression; packing.type != wire::compression_type::none)
    if (const auto rule = from_wire(packing); !p.reply_compression.enabled() ||
                                              rule.type != p.reply_compression.type ||
                                              rule.threshold != p.reply_compression.threshold)
      return {chunk_copy::failed,
              "a reply packed by " + std::string{wire::to_string(packing.type)} +
                  " with threshold " + std::to_string(packing.threshold) + ", where " +
                  (p.reply_compression.enabled() ? p.reply_compression.describe()
                                                 : std::string{"a dense value"}) +
                  " was asked for"};
  std::optional<wire::result<bool>> added;
  // The caller's output is written only while the call is live (completion::while_live).
  if (!p.call->done.while_live([&] { added.emplace(p.assembly->add(value.tensor)); }))
    return {chunk_copy::cancelled, {}};
  if (!*added)
    return {chunk_copy::failed, added->error().message};
  return {added->value() ? chunk_copy::complete : chunk_copy::more, {}};
}

void worker_core::on_value(std::uint64_t id, const std::shared_ptr<part>& p, envelope& reply) {
  const auto& value = std::get<wire::pull_reply>(reply.msg);
  if (!p->assembly) {
    finish(id, p, error{errc::malformed_message, what_of(*p) + ": unexpected pull reply"});
    return;
  }
  if (!p->reply_seen) {
    p->reply_seen = true;
    if (options_.joined && options_.sync) {
      // The value its first round starts from: the server counts this worker from there.
      auto& ps = keys_[p->slice.ps_key];
      if (!ps.pushed)
        ps.next_round = std::max(ps.next_round, value.round);
    }
    learn_round(p->slice.ps_key, value.round, false, value.durable);
    // The round closed: the value's remaining chunks need no credit.
    give_back_slice_credit(*p);
  }
  if (!p->copy_off_thread) {
    auto [how, problem] = copy_chunk(*p, value);
    on_chunk_copied(id, p, how, problem);
    return;
  }
  // The envelope travels with the copy: it keeps the received bytes (and their receive
  // credit) until they are copied.
  out_.copy_elsewhere(id, [p, chunk = std::move(reply)] {
    return copy_chunk(*p, std::get<wire::pull_reply>(chunk.msg));
  });
}

void worker_core::on_copied(std::uint64_t id, chunk_copy how, const std::string& problem) {
  auto found = parts_.find(id);
  // Gone: the request failed or timed out while its chunks were being copied.
  if (found == parts_.end() || how > chunk_copy::failed)
    return;
  auto p = found->second;
  on_chunk_copied(id, p, how, problem);
}

void worker_core::on_chunk_copied(std::uint64_t id, const std::shared_ptr<part>& p, chunk_copy how,
                                  const std::string& problem) {
  switch (how) {
  case chunk_copy::more:
    return;
  case chunk_copy::cancelled:
    give_back_slice_credit(*p);
    forget(id);
    return;
  case chunk_copy::failed:
    finish(id, p, error{errc::malformed_message, what_of(*p) + ": " + problem});
    return;
  case chunk_copy::complete:
    break;
  }
  auto& target = *p->target;
  status outcome;
  if (--target.slices_left == 0 && !target.copies.empty())
    outcome = status_of([&]() -> status {
      p->call->done.while_live([&] {
        for (auto& out : target.copies)
          target.buffer.copy_to(out);
      });
      return ok();
    });
  finish(id, p, std::move(outcome));
}

void worker_core::finish(std::uint64_t id, const std::shared_ptr<part>& p, status outcome) {
  if (outcome)
    note_answered(*p);
  forget(id);
  auto& call = *p->call;
  if (!outcome)
    call.end(std::move(outcome));
  else if (call.remaining > 0 && --call.remaining == 0)
    call.end(ok());
  // After the call's end: the slices of a call that failed, waiting for this credit, go nowhere.
  give_back_slice_credit(*p);
  maybe_finalized();
}

// --- failures and server recovery
// -----------------------------------------------------------------

void worker_core::on_link_down(std::uint64_t tag, const std::string& why, bool current) {
  if (tag == 0 || tag > names_.size() || (tag <= servers_.size() && servers_[tag - 1].left))
    return;
  if (recovery() && tag <= servers_.size()) {
    // Only the server's current link counts: an old one may close after the new one opened.
    if (!current)
      return;
    hold_server(static_cast<std::uint32_t>(tag - 1), why);
    return;
  }
  // The scheduler's notice naming the node that was really lost usually arrives within a
  // moment; a server may only be closing because the job already failed.
  out_.report_lost_later(tag, names_[tag - 1] + " was lost: " + why);
}

void worker_core::on_lost_report(std::uint64_t tag, const std::string& why) {
  if (tag > 0 && tag <= servers_.size() && servers_[tag - 1].left)
    return;
  fail_everything(error{errc::peer_lost, why});
}

void worker_core::on_refused(std::uint64_t tag, const std::string& words) {
  if (tag == 0 || tag > names_.size())
    return;
  // A server that refused this worker's handshake (its node key, its token) was not lost: it
  // said no, and will say it again.
  fail_everything(
      error{errc::invalid_argument, names_[tag - 1] + " refused this worker: " + words});
}

void worker_core::fail_everything(error why) {
  if (failure_)
    return;
  failure_ = why;
  options_.log.error(why.message());
  for (std::uint32_t server = 0; server < servers_.size(); ++server)
    drop_send_queue(server);
  auto failed = std::move(parts_);
  parts_.clear();
  for (auto& [id, p] : failed)
    p->call->end(error{why.code(), what_of(*p) + ": " + why.message()});
  for (auto& [key, ps] : keys_) {
    for (auto& p : ps.waiting)
      p->call->end(error{why.code(), what_of(*p) + ": " + why.message()});
    ps.waiting.clear();
    ps.in_turn = false;
  }
  slice_groups_.clear();
  maybe_finalized();
}

void worker_core::on_membership(const wire::membership& table) {
  for (const auto& node : table.nodes)
    if (node.node_role == wire::role::worker && !node.alive)
      options_.log.info(wire::describe(node) + " is gone; the job goes on");
  if (!failure_) {
    follow_servers(table);
    follow_key_ranges(table);
  }
  if (!recovery() || failure_)
    return;
  for (const auto& node : table.nodes) {
    if (node.node_role != wire::role::server || node.rank >= servers_.size())
      continue;
    auto& server = servers_[node.rank];
    if (!node.alive) {
      server.seen_lost = true;
      hold_server(node.rank, "the scheduler lists it lost");
    } else if (server.seen_lost && !server.relinking) {
      server.seen_lost = false;
      server.relinking = true;
      out_.relink(node);
    }
  }
}

/// Server recovery: requests to `server` wait (bounded) for it to come back.
void worker_core::hold_server(std::uint32_t server, const std::string& why) {
  auto& state = servers_[server];
  if (state.down)
    return;
  state.down = true;
  state.down_since = now();
  options_.log.error(names_[server] + " was lost: " + why + "; waiting up to " +
                     describe(options_.server_rejoin + options_.request_timeout) +
                     " for it to come back from its checkpoint");
}

worker_core::relink_step worker_core::on_relink(std::uint32_t server, bool linked,
                                                const std::string& name,
                                                const std::string& problem) {
  if (server >= servers_.size())
    return linked ? relink_step::close_new_link : relink_step::ignore;
  servers_[server].relinking = false;
  if (failure_)
    return linked ? relink_step::close_new_link : relink_step::ignore;
  if (!linked) {
    fail_everything(error{errc::peer_lost, name + " came back from its checkpoint, but " +
                                               "the worker cannot reach it: " + problem});
    return relink_step::ignore;
  }
  return relink_step::install;
}

void worker_core::server_back(std::uint32_t server, std::string name) {
  names_[server] = std::move(name);
  auto& state = servers_[server];
  state.down = false;
  ++state.link;
  state.with_link = 0;
  if (state.joining) {
    // Nothing went to it before: what waits for it leaves now.
    state.joining = false;
    options_.log.info("linked to " + names_[server] + ", which joined the job");
    pump(server);
    return;
  }
  const auto [kept, under_way] = resend(server);
  options_.log.info(names_[server] + " is back from its checkpoint: sent again " +
                    std::to_string(kept) + " kept pushes and " + std::to_string(under_way) +
                    " other requests under way");
}

/// After `server` restarted from its checkpoint: every kept push of its ps-keys (those its
/// checkpoint holds are acked without being applied) and every request under way to it, per
/// ps-key in round order, with the credit counted from the durable round. Returns how many
/// kept pushes and how many other requests go again.
std::pair<std::size_t, std::size_t> worker_core::resend(std::uint32_t server) {
  std::pair<std::size_t, std::size_t> counts;
  // What the old link did not send goes again with the rest, from its first frame.
  drop_send_queue(server);
  // No slice credit freed below may send a request of a ps-key before the requests that go
  // again: the groups' turns advance once every ps-key of the server is in order again.
  turns_held_ = true;
  std::unordered_map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::shared_ptr<part>>>>
      under_way;
  std::vector<std::pair<std::uint64_t, std::shared_ptr<part>>> lost;
  for (auto it = parts_.begin(); it != parts_.end();) {
    if (it->second->server != server) {
      ++it;
      continue;
    }
    auto& p = it->second;
    const bool keyed =
        p->kind == kv_call::push || p->kind == kv_call::pushpull || p->kind == kv_call::pull;
    // A reply being copied elsewhere cannot be started afresh here.
    if (!keyed || (p->reply_seen && p->copy_off_thread))
      lost.emplace_back(it->first, p);
    else
      under_way[p->slice.ps_key].emplace_back(it->first, p);
    it = parts_.erase(it);
  }
  for (auto& [id, p] : lost)
    finish(id, p,
           error{errc::peer_lost, what_of(*p) + ": " + names_[server] +
                                      " restarted from its checkpoint while it was under way"});
  for (auto& [ps_key, ps] : keys_) {
    if (ps.server != server)
      continue;
    const auto [kept, others] = requeue(ps_key, ps, std::move(under_way[ps_key]), server);
    counts.first += kept;
    counts.second += others;
  }
  turns_held_ = false;
  std::vector<std::uint64_t> groups;
  for (const auto& [ps_key, ps] : keys_)
    if (ps.server == server && ps.group)
      groups.push_back(*ps.group);
  for (auto group : groups)
    advance_turn(group);
  return counts;
}

void worker_core::follow_servers(const wire::membership& table) {
  for (const auto& node : table.nodes)
    if (node.node_role == wire::role::server && node.left && node.rank < servers_.size() &&
        !servers_[node.rank].left) {
      servers_[node.rank].left = true;
      options_.log.info(names_[node.rank] + " left the job, its key ranges handed over");
    }
  if (!options_.can_relink || servers_.empty())
    return;
  for (const auto& node : table.nodes) {
    if (node.node_role != wire::role::server || node.rank < servers_.size() || !node.alive ||
        node.left || node.rank >= max_nodes_per_role)
      continue;
    const auto first_new = servers_.size();
    servers_.resize(node.rank + 1);
    names_.resize(node.rank + 1);
    for (auto s = first_new; s < servers_.size(); ++s)
      names_[s] = "server " + std::to_string(s);
    auto& state = servers_[node.rank];
    state.down = true;
    state.down_since = now();
    state.joining = true;
    state.relinking = true;
    options_.num_servers = static_cast<std::uint32_t>(servers_.size());
    options_.log.info(wire::describe(node) + " joined the job; linking to it at " + node.host +
                      ":" + std::to_string(node.data_port));
    out_.relink(node);
  }
}

void worker_core::follow_key_ranges(const wire::membership& table) {
  // A table of one range per server keeps MXNet's placement, which never changes.
  if (options_.range_owner.empty() || table.key_ranges.size() != options_.range_owner.size())
    return;
  std::vector<std::uint32_t> moved_to(table.key_ranges.size(), 0);
  bool any = false;
  for (std::size_t r = 0; r < table.key_ranges.size(); ++r) {
    const auto owner = table.key_ranges[r].server_rank;
    if (owner == options_.range_owner[r] || owner >= servers_.size())
      continue;
    any = true;
    moved_to[r] = owner + 1;
    options_.log.info("key range " + std::to_string(r) + " moved from " +
                      names_[options_.range_owner[r]] + " to " + names_[owner]);
    options_.range_owner[r] = owner;
  }
  if (!any)
    return;
  std::size_t again = 0;
  for (auto& [ps_key, ps] : keys_)
    if (const auto to = moved_to[key_range_of(ps_key, num_ranges())]; to != 0)
      again += move_ps_key(ps_key, ps, to - 1);
  if (again > 0)
    options_.log.info("sent " + std::to_string(again) +
                      " requests under way again to the new servers of their key ranges");
}

std::pair<std::size_t, std::size_t>
worker_core::requeue(std::uint64_t ps_key, ps_key_state& ps,
                     std::vector<std::pair<std::uint64_t, std::shared_ptr<part>>> sent,
                     std::uint32_t server) {
  // In round order, and in the order they left within a round (ids grow as requests leave).
  std::sort(sent.begin(), sent.end(), [](const auto& a, const auto& b) {
    return std::pair{a.second->round, a.first} < std::pair{b.second->round, b.first};
  });
  std::vector<std::shared_ptr<part>> requests;
  requests.reserve(sent.size());
  for (auto& [id, p] : sent)
    requests.push_back(std::move(p));
  std::deque<std::shared_ptr<part>> again;
  for (const auto& kept : ps.kept) {
    auto match = std::find_if(requests.begin(), requests.end(), [&](const auto& p) {
      return (p->kind == kv_call::push || p->kind == kv_call::pushpull) && p->round == kept.round;
    });
    std::shared_ptr<part> p;
    if (match != requests.end()) {
      p = *match;
      requests.erase(match);
    } else {
      // Acked before: its call is over, only the server needs it again.
      auto replay = std::make_shared<call_state>();
      p = new_part(replay, kv_call::push, server, std::to_string(ps_key));
    }
    p->value = kept.copy;
    p->packed = ndarray{};
    p->compression = {};
    p->slice = key_slice{server, ps_key, 0, kept.copy.size()};
    p->whole = true;
    p->row_sparse = kept.rows != nullptr;
    p->rows = kept.rows;
    if (kept.rows)
      p->part_shape.assign(kept.copy.shape().begin(), kept.copy.shape().end());
    p->round = kept.round;
    again.push_back(std::move(p));
  }
  const std::pair<std::size_t, std::size_t> counts{again.size(), requests.size()};
  for (auto& p : requests) // pulls, which wait for the pushes before them, and unkept requests
    again.push_back(p);
  for (auto& p : again) {
    p->resend = true;
    p->reply_seen = false;
    p->server = server;
    p->slice.server = server;
    if (p->assembly)
      open_assembly(*p);
  }
  ps.server = server;
  for (auto& p : ps.waiting) {
    p->server = server;
    p->slice.server = server;
  }
  ps.completed = std::min(ps.completed, ps.durable);
  for (auto it = again.rbegin(); it != again.rend(); ++it)
    ps.waiting.push_front(*it);
  release_waiting(ps_key, ps);
  return counts;
}

std::size_t worker_core::move_ps_key(std::uint64_t ps_key, ps_key_state& ps, std::uint32_t to) {
  const auto from = ps.server;
  // What of the key's requests is still in the old server's send queue goes from the new one.
  if (ps.head_ready) {
    auto& ready = servers_[from].ready;
    for (auto it = ready.begin(); it != ready.end();)
      if (!it->second.order.keyless && it->second.p->slice.ps_key == ps_key)
        it = ready.erase(it);
      else
        ++it;
  }
  ps.queued.clear();
  ps.head_ready = false;
  std::vector<std::pair<std::uint64_t, std::shared_ptr<part>>> unanswered;
  for (const auto& [id, p] : parts_)
    if (p->kind != kv_call::every_server && p->slice.ps_key == ps_key && !p->reply_seen)
      unanswered.emplace_back(id, p);
  for (auto& [id, p] : unanswered) {
    forget(id);
    // Slice credit is counted per server: none of the old one's is held on the new one.
    give_back_slice_credit(*p);
  }
  const auto [kept, others] = requeue(ps_key, ps, std::move(unanswered), to);
  return kept + others;
}

// --- time
// -----------------------------------------------------------------------------------------

void worker_core::on_tick() {
  const auto at = now();
  for (std::uint32_t server = 0; server < servers_.size(); ++server)
    if (servers_[server].down &&
        at - servers_[server].down_since > options_.server_rejoin + options_.request_timeout) {
      fail_everything(
          error{errc::peer_lost, names_[server] + " was lost and did not come back within " +
                                     describe(options_.server_rejoin + options_.request_timeout)});
      return;
    }
  std::vector<std::uint64_t> overdue;
  for (const auto& [id, p] : parts_)
    if (p->call->done.cancelled() || (at - p->sent_at > options_.request_timeout &&
                                      (servers_.size() <= p->server || !servers_[p->server].down)))
      overdue.push_back(id);
  for (auto id : overdue) {
    auto found = parts_.find(id);
    if (found == parts_.end())
      continue;
    auto p = found->second;
    if (p->call->done.cancelled()) {
      parts_.erase(found);
      give_back_slice_credit(*p);
      continue;
    }
    error why{errc::timeout, what_of(*p) + " not answered within " +
                                 describe(options_.request_timeout) + " of being sent"};
    if (p->kind != kv_call::every_server)
      fail_waiting(p->slice.ps_key, why);
    finish(id, p, why);
  }
  if (finalizing_ && at > finalize_deadline_) {
    finalizing_->deliver(error{errc::timeout, "finalize: requests still under way after " +
                                                  describe(options_.request_timeout)});
    finalizing_.reset();
  }
}

/// The requests of a key queued behind one that failed can never go out in order.
void worker_core::fail_waiting(std::uint64_t ps_key, const error& why) {
  auto found = keys_.find(ps_key);
  if (found == keys_.end())
    return;
  for (auto& p : found->second.waiting)
    p->call->end(error{why.code(),
                       what_of(*p) + ": waiting behind a request that failed: " + why.message()});
  found->second.waiting.clear();
  settle_turn(ps_key, found->second);
}

void worker_core::on_finalize(completion<result<std::uint64_t>> done) {
  finalizing_ = std::move(done);
  finalize_deadline_ = now() + options_.request_timeout;
  maybe_finalized();
}

void worker_core::maybe_finalized() {
  if (!finalizing_ || !parts_.empty())
    return;
  for (const auto& [key, ps] : keys_)
    if (!ps.waiting.empty())
      return;
  if (dropped_pushes_ > 0)
    options_.log.info(std::to_string(dropped_pushes_) +
                      " pushes arrived after their round had closed and were dropped");
  log_summary();
  // A key's slices advance together, so the most pushes of one ps-key are the worker's rounds.
  std::uint64_t rounds = 0;
  for (const auto& [key, ps] : keys_)
    rounds = std::max(rounds, ps.next_round);
  finalizing_->deliver(rounds);
  finalizing_.reset();
}

} // namespace troupe
