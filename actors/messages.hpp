#pragma once
// Every message the actors of troupe exchange, in one place (STYLE.md §3): the atoms, and the
// envelope that carries a wire message between actors of one process.
//
// Two transports, one message form. Between processes every message is a Cap'n Proto frame
// (schema/codec.hpp): the brokers of actors/data_link decode a frame into an `envelope` whose
// tensor spans point into the pooled frame buffer it keeps alive, and encode an outgoing envelope
// into a frame. Within one process the same envelope passes from actor to actor without any
// encoding: the tensor spans point into an ndarray's storage, which `keepalive` holds. So a shard
// runs one code path whether its worker is a thread away or a network away.
//
// Handlers, one line each:
//   shard, node:       (envelope, caf::actor reply_to)  a request; replies go to reply_to as
//                                                       (envelope) with the same connection id
//   worker:            (envelope)                       a reply (pull_reply, ack, error_reply...)
//   data_link client:  (envelope)                       send this message to the server
//   data_link server:  (envelope)                       send on connection `envelope.connection`
//   anyone linked:     (link_down_atom, std::string)    the data connection is gone, and why

#include <cstdint>
#include <memory>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include "schema/messages.hpp"

namespace troupe {

/// A wire message inside one process, with whatever keeps its tensor bytes alive.
struct envelope {
  wire::message msg;
  /// Owner of the memory that msg's tensor_chunk::data views (a frame buffer, an ndarray's
  /// storage); null when the message carries no tensor.
  std::shared_ptr<const void> keepalive;
  /// The data connection the message arrived on, or must leave by (a server broker's id for
  /// one worker's connection); 0 within one process.
  std::uint64_t connection = 0;
};

// Atoms: at most 10 characters (CAF 0.17).
using link_down_atom = caf::atom_constant<caf::atom("link_down")>;
using peer_lost_atom = caf::atom_constant<caf::atom("peer_lost")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using frame_atom = caf::atom_constant<caf::atom("frame")>;
using control_atom = caf::atom_constant<caf::atom("control")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;

} // namespace troupe

// Envelopes never leave the process as CAF messages (frames do, through the brokers), so they need
// no serializer.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::envelope)
