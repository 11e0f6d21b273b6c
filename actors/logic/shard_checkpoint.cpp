#include "actors/logic/shard_checkpoint.hpp"

#include <array>
#include <limits>
#include <openssl/evp.h>

#include "engine/serialize.hpp"

namespace troupe {
namespace {

constexpr std::string_view snapshot_magic = "troupe shard checkpoint";
/// Version 2 adds each key's row_sparse flag after its completed count; version 1 files (no
/// row_sparse keys) still load. Version 3 adds the layout's key ranges after its workers; older
/// files had one range per server. Version 4 adds the key ranges of a hand-over after the policy,
/// and each key's joined and left workers after its sequence numbers.
constexpr std::uint64_t snapshot_version = 4;
constexpr std::size_t digest_bytes = 32;

std::array<std::byte, digest_bytes> sha256(std::span<const std::byte> bytes) {
  std::array<std::byte, digest_bytes> digest{};
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), reinterpret_cast<unsigned char*>(digest.data()), &length,
             EVP_sha256(), nullptr);
  return digest;
}

error corrupt(std::string_view what, const std::string& why) {
  return error{errc::corrupt_data, std::string{what} + ": " + why};
}

/// A u64 that must fit a u32 field.
result<std::uint32_t> read_u32(byte_reader& in, std::string_view field) {
  auto value = in.u64(field);
  if (!value)
    return value.error();
  if (*value > std::numeric_limits<std::uint32_t>::max())
    return error{errc::corrupt_data,
                 std::string{field} + " " + std::to_string(*value) + " is out of range"};
  return static_cast<std::uint32_t>(*value);
}

} // namespace

std::string layout_differences(const shard_layout& saved, const shard_layout& here) {
  std::string out;
  auto compare = [&](const char* name, std::uint32_t then, std::uint32_t now) {
    if (then == now)
      return;
    if (!out.empty())
      out += ", ";
    out += std::string{name} + " " + std::to_string(then) + " (here " + std::to_string(now) + ")";
  };
  compare("num_servers", saved.num_servers, here.num_servers);
  compare("server rank", saved.server_rank, here.server_rank);
  compare("shards_per_server", saved.shards_per_server, here.shards_per_server);
  compare("shard", saved.shard_index, here.shard_index);
  compare("num_workers", saved.num_workers, here.num_workers);
  compare("key ranges (job.max_servers)", saved.num_ranges, here.num_ranges);
  return out;
}

std::vector<std::byte> encode_snapshot(const shard_snapshot& snapshot) {
  byte_writer out;
  std::size_t size = 256 + digest_bytes;
  for (const auto& key : snapshot.keys)
    size += 64 + 8 * (key.shape.size() + key.applied_per_worker.size()) +
            (key.value.is_none() ? 0 : key.value.nbytes());
  if (snapshot.optimizer_states)
    size += snapshot.optimizer_states->size();
  out.reserve(size);
  out.string(snapshot_magic);
  out.u64(snapshot_version);
  out.u8(static_cast<std::uint8_t>(snapshot.kind));
  const auto& layout = snapshot.layout;
  for (auto field : {layout.num_servers, layout.server_rank, layout.shards_per_server,
                     layout.shard_index, layout.num_workers, layout.num_ranges})
    out.u64(field);
  const auto& policy = snapshot.policy;
  out.u8(static_cast<std::uint8_t>(policy.mode));
  out.u64(policy.quorum);
  out.u8(policy.rescale_quorum ? 1 : 0);
  out.i64(policy.max_staleness);
  out.u64(policy.max_rounds_ahead);
  out.u64(snapshot.ranges.size());
  for (auto range : snapshot.ranges)
    out.u64(range);
  out.u64(snapshot.keys.size());
  for (const auto& key : snapshot.keys) {
    out.u64(key.ps_key);
    out.u8(static_cast<std::uint8_t>(key.type));
    out.u64(key.shape.size());
    for (auto extent : key.shape)
      out.i64(extent);
    out.u64(key.completed);
    out.u8(key.row_sparse ? 1 : 0);
    out.u64(key.applied_per_worker.size());
    for (auto applied : key.applied_per_worker)
      out.u64(applied);
    for (const auto* facts : {&key.joined, &key.left}) {
      out.u64(facts->size());
      for (const auto& fact : *facts) {
        out.u64(fact.worker);
        out.u64(fact.round);
      }
    }
    if (snapshot.kind == snapshot_kind::checkpoint)
      out.array(key.value);
  }
  out.u8(snapshot.optimizer_states ? 1 : 0);
  if (snapshot.optimizer_states) {
    out.u64(snapshot.optimizer_states->size());
    out.raw(snapshot.optimizer_states->data(), snapshot.optimizer_states->size());
  }
  auto bytes = out.take();
  auto digest = sha256(bytes);
  bytes.insert(bytes.end(), digest.begin(), digest.end());
  return bytes;
}

result<shard_snapshot> decode_snapshot(std::span<const std::byte> bytes, std::string_view what) {
  // The checksum first: nothing of a torn or altered file is believed.
  if (bytes.size() < digest_bytes)
    return corrupt(what, "too short to be a troupe shard checkpoint (" +
                             std::to_string(bytes.size()) + " bytes)");
  auto body = bytes.first(bytes.size() - digest_bytes);
  auto digest = sha256(body);
  if (!std::equal(digest.begin(), digest.end(), bytes.end() - digest_bytes))
    return corrupt(what, "checksum mismatch: the file is torn, truncated or altered");

  byte_reader in{body};
  auto fail = [&](const error& e) { return corrupt(what, e.message()); };
  auto magic = in.string("header");
  if (!magic)
    return fail(magic.error());
  if (*magic != snapshot_magic)
    return corrupt(what, "not a troupe shard checkpoint (header '" + magic->substr(0, 40) + "')");
  auto version = in.u64("format version");
  if (!version)
    return fail(version.error());
  if (*version < 1 || *version > snapshot_version)
    return corrupt(what, "format version " + std::to_string(*version) +
                             " is not supported (this is " + std::to_string(snapshot_version) +
                             ")");
  shard_snapshot out;
  auto kind = in.u8("kind");
  if (!kind)
    return fail(kind.error());
  if (*kind > static_cast<std::uint8_t>(snapshot_kind::optimizer_states))
    return corrupt(what, "unknown kind " + std::to_string(*kind));
  out.kind = static_cast<snapshot_kind>(*kind);

  std::uint32_t* layout_fields[] = {&out.layout.num_servers, &out.layout.server_rank,
                                    &out.layout.shards_per_server, &out.layout.shard_index,
                                    &out.layout.num_workers};
  for (auto* field : layout_fields) {
    auto value = read_u32(in, "layout");
    if (!value)
      return fail(value.error());
    *field = *value;
  }
  out.layout.num_ranges = out.layout.num_servers;
  if (*version >= 3) {
    auto ranges = read_u32(in, "layout");
    if (!ranges)
      return fail(ranges.error());
    out.layout.num_ranges = *ranges;
  }
  auto mode = in.u8("consistency");
  auto quorum = read_u32(in, "quorum");
  auto rescale = in.u8("rescale_quorum");
  auto staleness = in.i64("max_staleness");
  auto ahead = read_u32(in, "max_rounds_ahead");
  if (!mode || !quorum || !rescale || !staleness || !ahead)
    return corrupt(what, "truncated sync policy");
  if (*mode > static_cast<std::uint8_t>(wire::consistency_mode::async))
    return corrupt(what, "unknown consistency " + std::to_string(*mode));
  out.policy = {static_cast<wire::consistency_mode>(*mode), *quorum, *rescale != 0, *staleness,
                *ahead};
  if (*version >= 4) {
    auto ranges = in.u64("hand-over ranges");
    if (!ranges)
      return fail(ranges.error());
    if (*ranges > in.remaining() / 8 || *ranges > out.layout.num_ranges)
      return corrupt(what, std::to_string(*ranges) + " key ranges handed over, of " +
                               std::to_string(out.layout.num_ranges));
    for (std::uint64_t i = 0; i < *ranges; ++i) {
      auto range = read_u32(in, "hand-over range");
      if (!range)
        return fail(range.error());
      if (*range >= out.layout.num_ranges)
        return corrupt(what, "key range " + std::to_string(*range) + " handed over, of " +
                                 std::to_string(out.layout.num_ranges));
      out.ranges.push_back(*range);
    }
  }

  auto count = in.u64("key count");
  if (!count)
    return fail(count.error());
  // Each key takes at least 41 bytes: a count that the input cannot hold is a lie, caught before
  // reserving anything.
  if (*count > in.remaining() / 41)
    return corrupt(what, std::to_string(*count) + " keys do not fit in the file");
  out.keys.reserve(*count);
  for (std::uint64_t i = 0; i < *count; ++i) {
    key_snapshot key;
    auto ps_key = in.u64("ps-key");
    auto type = in.u8("dtype");
    auto ndim = in.u64("ndim");
    if (!ps_key || !type || !ndim)
      return corrupt(what, "truncated key " + std::to_string(i));
    key.ps_key = *ps_key;
    if (*type > static_cast<std::uint8_t>(dtype::float64))
      return corrupt(what, "key " + std::to_string(key.ps_key) + ": unknown dtype code " +
                               std::to_string(*type));
    key.type = static_cast<dtype>(*type);
    if (*ndim > in.remaining() / 8)
      return corrupt(what, "key " + std::to_string(key.ps_key) + ": " + std::to_string(*ndim) +
                               " dimensions do not fit in the file");
    for (std::uint64_t axis = 0; axis < *ndim; ++axis) {
      auto extent = in.i64("extent");
      if (!extent)
        return fail(extent.error());
      if (*extent < 0)
        return corrupt(what, "key " + std::to_string(key.ps_key) + ": negative extent");
      key.shape.push_back(*extent);
    }
    auto completed = in.u64("completed");
    if (!completed)
      return corrupt(what, "truncated key " + std::to_string(key.ps_key));
    if (*version >= 2) {
      auto row_sparse = in.u8("row_sparse flag");
      if (!row_sparse || *row_sparse > 1)
        return corrupt(what, "key " + std::to_string(key.ps_key) + ": bad row_sparse flag");
      key.row_sparse = *row_sparse == 1;
    }
    auto workers = in.u64("worker count");
    if (!workers)
      return corrupt(what, "truncated key " + std::to_string(key.ps_key));
    key.completed = *completed;
    if (*workers > in.remaining() / 8)
      return corrupt(what, "key " + std::to_string(key.ps_key) + ": " + std::to_string(*workers) +
                               " workers do not fit in the file");
    for (std::uint64_t w = 0; w < *workers; ++w) {
      auto applied = in.u64("applied pushes");
      if (!applied)
        return fail(applied.error());
      key.applied_per_worker.push_back(*applied);
    }
    if (*version >= 4)
      for (auto* facts : {&key.joined, &key.left}) {
        auto count = in.u64("worker facts");
        if (!count)
          return fail(count.error());
        if (*count > in.remaining() / 16)
          return corrupt(what, "key " + std::to_string(key.ps_key) + ": " + std::to_string(*count) +
                                   " joined or left workers do not fit");
        for (std::uint64_t i = 0; i < *count; ++i) {
          auto worker = in.u64("worker");
          if (!worker)
            return fail(worker.error());
          auto round = in.u64("round");
          if (!round)
            return fail(round.error());
          if (*worker > std::numeric_limits<std::uint32_t>::max())
            return corrupt(what, "key " + std::to_string(key.ps_key) + ": worker rank " +
                                     std::to_string(*worker) + " out of range");
          facts->push_back({static_cast<std::uint32_t>(*worker), *round});
        }
      }
    if (out.kind == snapshot_kind::checkpoint) {
      auto value = in.array("value of key " + std::to_string(key.ps_key));
      if (!value)
        return fail(value.error());
      if (value->dtype() != key.type || !std::equal(value->shape().begin(), value->shape().end(),
                                                    key.shape.begin(), key.shape.end()))
        return corrupt(what, "key " + std::to_string(key.ps_key) +
                                 ": the value's dtype or shape differs from the key's");
      key.value = std::move(*value);
    }
    out.keys.push_back(std::move(key));
  }
  auto has_states = in.u8("optimizer flag");
  if (!has_states)
    return fail(has_states.error());
  if (*has_states != 0) {
    auto size = in.u64("optimizer states size");
    if (!size)
      return fail(size.error());
    auto states = in.raw(*size, "optimizer states");
    if (!states)
      return fail(states.error());
    out.optimizer_states.emplace(states->begin(), states->end());
  }
  if (in.remaining() != 0)
    return corrupt(what, std::to_string(in.remaining()) + " bytes after the end");
  return out;
}

encoded_hand_over encode_hand_over(const shard_snapshot& keys) {
  encoded_hand_over out;
  out.words = encode_snapshot(keys);
  out.bytes = out.words.size();
  out.words.resize((out.words.size() + 7) / 8 * 8, std::byte{0});
  return out;
}

wire::range_data range_data_of(std::uint64_t request_id, std::uint32_t shard,
                               const encoded_hand_over& encoded) {
  wire::tensor_chunk tensor;
  tensor.type = wire::dtype::int64;
  tensor.shape = {static_cast<std::int64_t>(encoded.words.size() / 8)};
  tensor.total_bytes = encoded.words.size();
  tensor.data = encoded.words;
  return wire::range_data{request_id, shard, encoded.bytes, std::move(tensor)};
}

std::filesystem::path checkpoint_file(const std::filesystem::path& directory,
                                      const shard_layout& layout) {
  return directory / ("server" + std::to_string(layout.server_rank) + ".shard" +
                      std::to_string(layout.shard_index) + ".ckpt");
}

result<std::filesystem::path> states_file(const std::filesystem::path& directory,
                                          std::string_view name, const shard_layout& layout) {
  auto refused = [&](const std::string& why) {
    return error{errc::invalid_argument,
                 "optimizer states name '" + std::string{name.substr(0, 200)} + "': " + why};
  };
  if (directory.empty())
    return refused("this server has no checkpoint directory (checkpoint.dir, --checkpoint-dir), "
                   "so it writes and reads no files");
  if (name.empty())
    return refused("empty");
  if (name.find('\0') != std::string_view::npos)
    return refused("holds a NUL byte");
  std::filesystem::path relative{std::string{name}};
  if (relative.is_absolute())
    return refused("a server writes only inside its checkpoint directory; give a name relative "
                   "to it, not an absolute path");
  for (const auto& part : relative)
    if (part == "..")
      return refused("a '..' component would leave the server's checkpoint directory");
  auto file = directory / relative;
  file += ".server" + std::to_string(layout.server_rank) + ".shard" +
          std::to_string(layout.shard_index);
  return file;
}

} // namespace troupe
