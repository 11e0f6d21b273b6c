#pragma once
// The form every message takes between troupe's actors (actors/protocols.hpp): a wire message
// with whatever keeps its tensor bytes alive. Plain data, no CAF, so that the logic the actors run
// (a shard_core, the link framing) can take and produce envelopes without an actor system.

#include <cstdint>
#include <memory>

#include "schema/messages.hpp"

namespace troupe {

/// A wire message inside one process, with whatever keeps its tensor bytes alive.
struct envelope {
  wire::message msg;
  /// Owner of the memory that msg's tensor_chunk::data views (a frame buffer, an ndarray's
  /// storage); null when the message carries no tensor, except that a frame received from a link
  /// always has one: it also holds the frame's receive credit, returned to the sender when the
  /// last copy goes (so do not keep received envelopes longer than needed: actors/data_link.hpp).
  std::shared_ptr<const void> keepalive;
  /// Which connection: on a listening side, the connection the message arrived on or must leave
  /// by (a server broker's id for one peer's connection); on a connecting side, the tag the link
  /// was opened with (data_link_options::tag); 0 within one process.
  std::uint64_t connection = 0;
};

} // namespace troupe
