#pragma once
// A server shard as an actor: a shard_core (actors/logic/shard_core.hpp, where the shard's contract
// is written down) behind a thin shard_actor (actors/protocols.hpp). The actor replies to each
// request's reply_sink, sweeps expired pulls and stalled inits on a tick it sends itself, and
// hears of the data server's closed connections (closed_atom).

#include <caf/actor_system.hpp>

#include "actors/logic/shard_core.hpp"
#include "actors/protocols.hpp"

namespace troupe {

/// A shard_actor running a shard_core: replies go to each request's reply_sink; it sends itself
/// a tick every options.sweep_interval to expire pulls and drop stalled inits (ticks from anyone
/// else are ignored).
shard_actor spawn_server_shard(caf::actor_system& system, shard_options options);

} // namespace troupe
