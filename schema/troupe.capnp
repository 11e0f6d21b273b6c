# troupe wire protocol, version 1.
#
# This file is the protocol document. Every frame exchanged between troupe processes (scheduler,
# server and worker nodes) carries exactly one `Message`. Only the codec in schema/codec.{hpp,cpp}
# reads or builds these types; the rest of troupe sees the plain structs of troupe::wire.
#
# Framing (one frame = one Message):
#   bytes [0, 8)   body length L as a little-endian uint64; L is a multiple of 8.
#   bytes [8, 8+L) the standard Cap'n Proto serialization of the Message: segment count - 1
#                  (uint32 LE), each segment's size in words (uint32 LE), zero padding to a word
#                  boundary, then the segments. Nothing follows the last segment.
#   A receiver reads the 8-byte prefix, checks L against its cap (data connections: 256 MiB by
#   default; control connections: far less) and against the receive window it granted (LinkHello)
#   before allocating anything, reads L bytes into an 8-byte-aligned buffer and decodes in place.
#
# Ordering guarantees (what a receiver may rely on, and what it may not):
#   - Frames on one connection are delivered in the order they were sent (FIFO per connection),
#     except that link-control frames (LinkCredit, ArenaRelease, the Error that closes a
#     connection) go ahead of frames still waiting for credit; nothing is promised across
#     connections, e.g. a membership update from the scheduler and a push from a worker may
#     arrive at a server in either order. On the scheduler's connections BarrierRelease frames
#     come from another actor than the rest, so they may pass a Membership or Error sent at the
#     same time.
#   - A worker sends the requests for one key in the order it issued them, on one connection, so
#     a server sees the pushes of round t of a key from a given worker before those of round t+1.
#   - The chunks of one tensor (same request id) travel on one connection, in increasing offset
#     order, without frames of another tensor of the same request in between. A server shard
#     relies on it for pushes: a push chunk that does not start at the byte after the last one
#     taken is refused. Init and PullReply chunks are reassembled in any order; every receiver
#     checks offsets (no overlaps, no bytes outside the tensor).
#   - Every request carries a request id chosen by its sender, unique among that sender's
#     outstanding requests; the reply (Admission, Ack, PullReply, BarrierRelease or Error) echoes
#     it. A chunked PullReply repeats the id in every chunk.
#   - Heartbeats, Membership updates, Errors and the scheduler's Command.stop to a server are not
#     acknowledged.
#
# Evolution: fields and union members are never renumbered or reused; new ones get the next
# ordinal. A receiver rejects a union member it does not know (error code badFrame) rather than
# guessing. Every enum starts with `unspecified @0`, the value a field has when the sender did not
# set it, and every union that must be set starts with `unset`, so a missing value is detected,
# not read as the first meaningful one (Error's key union defaults to noKey on purpose).
#
# Tensors: a tensor travels as one or more chunks (`Tensor` below). One Data field holds at most
# 2^29-1 bytes, and the receiver caps frames, so senders split tensors (default 1 MiB chunks).
# All integers are little-endian on the wire (Cap'n Proto's encoding).

@0xd20fc2d01fa682f5;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::wire_schema");

const protocolVersion :UInt32 = 1;
# The version this file describes; sent in Registration and compared by the scheduler.

enum Role {
  unspecified @0;  # not set; rejected
  scheduler @1;    # the one node per job that admits nodes and runs global barriers
  server @2;       # a process holding server shards (parameters of a set of key ranges)
  worker @3;       # a training process: the KVStore client
}

enum DType {
  unspecified @0;  # not set; rejected
  float32 @1;      # IEEE 754 binary32, 4 bytes
  float16 @2;      # IEEE 754 binary16, 2 bytes
  int32 @3;        # two's complement, 4 bytes
  int64 @4;        # two's complement, 8 bytes
  float64 @5;      # IEEE 754 binary64, 8 bytes
}

struct Tensor {
  # One chunk of a dense tensor, in row-major (C) order. A whole tensor is the single chunk with
  # offset 0 and data covering totalBytes.
  dtype @0 :DType;
  # Element type of the whole tensor; the same in every chunk.
  shape @1 :List(Int64);
  # Extent of each axis of the whole tensor, each >= 0; empty list = scalar (one element). At
  # most 32 axes. The same in every chunk.
  totalBytes @2 :UInt64;
  # Size of the whole tensor in bytes; must equal product(shape) * size(dtype).
  offset @3 :UInt64;
  # Byte offset of this chunk within the whole tensor; a multiple of size(dtype).
  data @4 :Data;
  # This chunk's bytes; size a multiple of size(dtype), offset + size <= totalBytes, and not empty
  # unless totalBytes is 0. At most 2^29-1 bytes (Cap'n Proto's Data limit).
  shm :group {
    # Same-host fast path (an extension of version 1; docs/data-path.md): when `bytes` is not 0,
    # the chunk's bytes are not in `data` (which must then be empty) but at [offset, offset +
    # bytes) of the shared-memory arena the sender offered on this data connection (ArenaOffer).
    # Only sent on a connection whose arena the receiver accepted; offset is a multiple of 8 and
    # the range lies inside the arena, else the frame is rejected (badFrame). The receiver answers
    # with an ArenaRelease of `offset` once it no longer reads the bytes; until then the sender
    # does not reuse them. A receiver without this extension sees an empty chunk and rejects it.
    offset @5 :UInt64;
    bytes @6 :UInt64;
  }
  compression :group {
    # Gradient compression (an extension of version 1; docs/protocol.md, "Compressed pushes"):
    # when `type` is not `none`, the chunk covers `elements` elements from byte `offset` of the
    # dense tensor, and `data` (or the arena's bytes) holds them packed, whole 32-bit words of 16
    # (twoBit) or 32 (oneBit) elements, MXNet's bit order: element i of the chunk in byte i / 4
    # at bits 7-6 for i % 4 == 0 down to bits 1-0 (11 = +threshold, 10 = -threshold, 00 and 01 =
    # 0), or in byte i / 8 at bit 7 - i % 8 (1 = +1, 0 = -1). Only float32 and float16 tensors,
    # only in Push, PushPull and (to a request that asked for one) PullReply; offset + elements * size(dtype) <= totalBytes, data is exactly
    # the packed size, elements > 0 unless totalBytes is 0, and the threshold is finite (> 0 for
    # twoBit, >= 0 for oneBit). Each chunk names its own rule, so a server needs no state to
    # read it; SetGradientCompression, sent by worker 0 before it compresses, makes a server
    # without this extension refuse the setting instead of misreading the packed bytes.
    type @7 :Compression;
    threshold @8 :Float32;
    elements @9 :UInt64;
  }
  rowSparse @10 :Bool;
  # Row-sparse push (an extension of version 1; docs/protocol.md, "Row-sparse keys"): the tensor
  # holds only some rows of the key, shape (n, d1, ...) for n rows of a key of shape (rows, d1,
  # ...), in the order of rowIds. Only in Push, to a key whose Init was rowSparse; always one
  # chunk (offset 0, data covering totalBytes: a sender never splits it), never compressed.
  rowIds @11 :Data;
  # With rowSparse: the n row indices, int64 little-endian, strictly increasing, each below the
  # key's first extent (8 * n bytes, n = shape[0]). Empty otherwise.
}

enum Compression {
  # Unlike the other enums, 0 is a value: an optional field, and a sender that did not set it
  # sends dense bytes.
  none @0;
  twoBit @1;
  oneBit @2;
}

struct Registration {
  # Node -> scheduler, the first message on the control connection after the link hellos.
  # Answered by Admission.
  requestId @0 :UInt64;
  # Chosen by the node; echoed by the Admission.
  protocolVersion @1 :UInt32;
  # The protocolVersion constant of the sender's build; a mismatch is rejected.
  role @2 :Role;
  # What the node wants to be; required.
  jobId @3 :Text;
  # Job the node belongs to (non-empty); a node of another job is rejected.
  authToken @4 :Data;
  # Unused, always empty: the connection proved the job token in its handshake (LinkHello.proof),
  # and the token itself never travels. A receiver ignores it.
  host @5 :Text;
  # Address (name or IP) where the node's data port listens; non-empty.
  port @6 :UInt16;
  # Data port of the node (server: where workers connect); 0 when the node accepts none.
  rankHint @7 :Int32 = -1;
  # Rank the node asks for (a launcher numbers its nodes so that its output prefixes are ranks);
  # granted when free and below the role's count, else the lowest free rank; -1: none.
  recovering @8 :Bool;
  # A server restarted from its checkpoint (troupe-node --recover) to take the place of the lost
  # server of rank rankHint: admitted for exactly that rank, and only while the scheduler keeps
  # it open for a recovering server (timeouts.server_rejoin); rejected otherwise.
  joinAtBarrier @9 :Bool;
  # A worker that joins the running job (job.join_at_barrier): it is counted only from the
  # workers' next barrier on. Once admitted it arrives at that barrier (Barrier group 4, id
  # Admitted.firstBarrier[4]) and is listed in no Membership until the barrier completes; then
  # the table that counts it goes to the servers, which ack, and to the workers, and only then
  # the barrier is released (its release to the joiner brings the others' gathered values). So
  # every key counts it from the round after that barrier. Ignored for a node admitted before
  # the job runs.
}

enum RejectReason {
  unspecified @0;      # not set; rejected
  protocolVersion @1;  # the node speaks another protocol version
  wrongJob @2;         # the job id is not this scheduler's
  badToken @3;         # unused: a wrong token now fails the connection's handshake (LinkHello)
  roleFull @4;         # all ranks of the requested role are taken
  duplicate @5;        # a node with this host and port is already registered
  shuttingDown @6;     # the job is ending and admits nobody
  wrongRole @7;        # under TLS: the role differs from the one the node's certificate names
}

struct Admission {
  # Scheduler -> node, the reply to Registration.
  requestId @0 :UInt64;
  # The Registration's request id.
  union {
    unset @1 :Void;
    # Never sent; rejected.
    admitted :group {
      # The node is part of the job; its peers learn of it from the next Membership.
      rank @2 :UInt32;
      # Rank within the node's role, 0-based (worker rank r is MXNet's kv.rank).
      nodeId @3 :UInt32;
      # Job-wide id of the node, unique across roles; used as `sender` in other messages.
      sealedSecret @6 :Data;
      # The node's own secret, sealed: AES-256-GCM under the control connection's session key
      # (LinkHello.keyShare), a 12-byte nonce, the 32 bytes of ciphertext and the 16-byte tag (60
      # bytes), with "troupe admission v1", the role, rank and node id as additional data. A
      # worker gets its node key K(worker, rank) = HMAC-SHA256(token, "troupe node key v1", the
      # job secret, role, rank), which its data connections prove (LinkHello.nodeProof); a server
      # gets the job secret M, 32 random bytes the scheduler draws at its start, from which it
      # derives every worker's key to check those proofs. Workers never learn M, and a new job
      # has a new one. Required: a node that cannot unseal it does not join.
      joined @7 :Bool;
      # A worker admitted into a job that is already running (job.max_workers): it takes no part
      # in the job's start (init values, set_optimizer and their barriers are the first workers'),
      # and learns each key's first round from its first pull (see Membership.requestId).
      firstBarrier @8 :List(UInt64);
      # A worker that joined: element g (a union of Barrier groups, 0..7) is the id its first
      # barrier of group g takes, the next one no member of the group had reached when it was
      # admitted (barriers before it do not wait for it). At most 8 elements; a group beyond the
      # list starts at 1, as for every node admitted before the job started.
    }
    rejected :group {
      # The node is not admitted and should exit with the reason.
      reason @4 :RejectReason;
      # Why; required.
      detail @5 :Text;
      # Human-readable detail for the node's log (may be empty).
    }
  }
}

struct NodeInfo {
  # One row of the membership table.
  nodeId @0 :UInt32;
  # Job-wide node id assigned at admission.
  role @1 :Role;
  # The node's role; required.
  rank @2 :UInt32;
  # Rank within the role.
  host @3 :Text;
  # Address of the node's data port.
  dataPort @4 :UInt16;
  # Data port (0: none).
  alive @5 :Bool;
  # False once the scheduler has declared the node lost (missed heartbeats or closed connection).
  left @6 :Bool;
  # A worker that left the job on its own (it closed its store, or called leave(), after every
  # request of it was answered): from the round after its last push of a key, that key's
  # dist_sync rounds close without it, and barriers no longer wait for it. Not a loss: alive
  # stays true.
}

struct KeyRange {
  # ps-keys [begin, end) belong to one server process (ps-lite's ranges of uint64 keys, one per
  # server); the server spreads them over its shard actors itself (ps_key % shards).
  begin @0 :UInt64;
  # First key of the range.
  end @1 :UInt64;
  # One past the last key; begin < end.
  serverRank @2 :UInt32;
  # Rank of the server process that owns the range; < numServers.
  shardIndex @3 :UInt32;
  # Index of a shard actor within that server process; the scheduler sends 0 (the whole range
  # belongs to the server).
}

struct Membership {
  # Scheduler -> every node still connected and not lost, once every node is admitted (epoch 1:
  # the job starts) and again, the whole table each time, after each worker lost within the
  # quorum, each worker that left (NodeInfo.left) and each worker that joined (to the servers
  # first: requestId). A loss that fails the job is announced by an Error instead.
  epoch @0 :UInt64;
  # Increases with every change; a node ignores a table older than the one it holds.
  numWorkers @1 :UInt32;
  # Number of workers of the job (the size of a dist_sync round).
  numServers @2 :UInt32;
  # Number of server processes.
  nodes @3 :List(NodeInfo);
  # Every admitted node, lost ones included (alive = false).
  keyRanges @4 :List(KeyRange);
  # Which shard owns which keys: sorted by begin, non-overlapping.
  requestId @5 :UInt64;
  # Non-zero on a table sent to the servers that admits a worker into the running job: each
  # server answers with Ack(requestId) once every shard holds the table, and only then does the
  # scheduler send the table to the workers (the joiner included). So every key has fixed the
  # round the joiner counts from (the first round no push has reached) before any worker learns
  # of it, and the joiner's first requests find it a member. 0: no answer wanted.
}

struct Init {
  # Worker (rank 0) -> server shard: declare a key and its initial value. Answered by Ack.
  requestId @0 :UInt64;
  # Echoed by the Ack or Error.
  key @1 :UInt64;
  # Numeric key (string keys are mapped to integers by the client).
  tensor @2 :Tensor;
  # Initial value (one chunk of it); required. Its dtype and shape become the key's declaration.
  rowSparse @3 :Bool;
  # The key is row-sparse (MXNet's row_sparse storage): it has at least one axis and takes only
  # row-sparse pushes (Tensor.rowSparse) and row-sparse pulls (PullRequest.rowSparse). The value
  # itself travels dense, every chunk of it with this flag alike.
}

struct Push {
  # Worker -> server shard: a gradient (or value) for one key. Answered by Ack once the whole
  # tensor has arrived.
  requestId @0 :UInt64;
  # Echoed by the Ack or Error.
  key @1 :UInt64;
  # Numeric key.
  senderRank @2 :UInt32;
  # Worker rank of the sender.
  round @3 :UInt64;
  # The sender's round (version) of this key, 0-based, increasing by one per push. dist_async: the
  # push's sequence number; a shard refuses a push (not resent) numbered below the sender's next
  # (one past its last push of the key), and takes one numbered above (those between were
  # refused before they reached the key).
  tensor @4 :Tensor;
  # The pushed value (one chunk of it); required.
  resent @5 :Bool;
  # The worker sends this push again after its server restarted from a checkpoint. A resent push
  # that the shard had already (dist_sync: of a round it has completed; dist_async: numbered below
  # the sender's next) is acknowledged (once its last chunk has arrived) without being applied
  # again; any other is taken as a push.
}

struct PullRequest {
  # Worker -> server shard: ask for a key's value. Answered by PullReply.
  requestId @0 :UInt64;
  # Echoed by the PullReply or Error.
  key @1 :UInt64;
  # Numeric key.
  senderRank @2 :UInt32;
  # Worker rank of the sender.
  round @3 :UInt64;
  # The number of pushes of this key the sender has sent. dist_sync: the reply waits until that
  # many rounds are complete (so it sees the sender's last push applied). dist_async: the current
  # value is returned at once, unless SyncSettings.maxStaleness s >= 0 bounds how far the sender
  # may run ahead: then the reply waits until every live worker has had at least round - s pushes
  # of the key applied.
  timeoutMs @4 :UInt32;
  # The sender gives up on the request this many milliseconds after sending it; a pull still
  # waiting at the shard then is dropped without a reply. 0: the shard's own bound.
  rowSparse @5 :Bool;
  # A row-sparse pull (MXNet's row_sparse_pull) of a rowSparse key: the reply's tensor holds only
  # the rows rowIds names, shape (n, d1, ...) in that order; n = 0 gives an empty tensor of shape
  # (0, d1, ...). A plain pull of a rowSparse key, and a row-sparse pull of another, are refused.
  rowIds @6 :Data;
  # With rowSparse: the rows asked for, int64 little-endian, strictly increasing, each below the
  # key's first extent. Empty otherwise.
  replyCompression @7 :Compression;
  replyThreshold @8 :Float32;
  # Compressed pulls (an extension of version 1; docs/protocol.md, "Compressed pulls"): the
  # sender reads a packed reply (Tensor.compression) of this rule, threshold as in a packed
  # chunk. The shard then may answer with the round's value plus its residual for this sender,
  # quantized, keeping what the packed bytes do not carry for the sender's next pull; it answers
  # dense where that has no meaning (a key an optimizer updates, dist_async, a row-sparse pull, a
  # round already sent to this sender). none: a dense reply, always. Not with rowSparse.
}

struct PullReply {
  # Server shard -> worker: a key's value, possibly in several chunks.
  requestId @0 :UInt64;
  # The PullRequest's (or PushPull's) request id, in every chunk.
  key @1 :UInt64;
  # Numeric key.
  round @2 :UInt64;
  # The key's completed rounds (dist_sync) or applied pushes (dist_async) when the value was
  # sent: the value is their result. The worker takes it as credit, like Ack.round.
  tensor @3 :Tensor;
  # The value (one chunk of it); required.
  durable @4 :UInt64;
  # As Ack.durable.
}

struct PushPull {
  # Worker -> server shard: push, then pull the result of the same round (MXNet's pushpull).
  # Answered by PullReply once round + 1 rounds are complete, or at once with the current value
  # when the push came after its round had closed (the reply's round then shows it).
  requestId @0 :UInt64;
  # Echoed by the PullReply or Error.
  key @1 :UInt64;
  # Numeric key.
  senderRank @2 :UInt32;
  # Worker rank of the sender.
  round @3 :UInt64;
  # The sender's round of this key.
  tensor @4 :Tensor;
  # The pushed value (one chunk of it); required.
  timeoutMs @5 :UInt32;
  # As PullRequest.timeoutMs, for the pull half.
  resent @6 :Bool;
  # As Push.resent.
  replyCompression @7 :Compression;
  replyThreshold @8 :Float32;
  # As PullRequest's, for the pull half.
}

struct Ack {
  # Reply to a request that returns no data (Init, Push, SetOptimizer, SyncSettings, a worker's
  # Command): it was applied (a Push: it is in its round, was applied, or was dropped).
  requestId @0 :UInt64;
  # The request's id.
  round @1 :UInt64;
  # Acks of a Push: the rounds of the key the shard had completed when it acked (dist_async: the
  # pushes of the key it had applied); in dist_sync the worker's credit (it sends a push of round
  # t only while t < round + SyncSettings.maxRoundsAhead). 0 for other requests.
  dropped @2 :Bool;
  # Acks of a Push: the push arrived after its round had closed with a quorum of other workers
  # and was not applied (dist_sync with quorum < numWorkers); the shard counts it.
  durable @3 :UInt64;
  # Acks of a Push (and every PullReply): what the shard's last checkpoint written to disk holds
  # of the key, 0 when none was written: its completed rounds (dist_sync), or the sequence number
  # of the receiving worker's next push of the key (dist_async). A worker keeps a copy of each
  # push from there on, to send it again (Push.resent) should the server restart from that
  # checkpoint.
}

struct Barrier {
  # Node -> scheduler: the sender has reached a barrier. Answered by BarrierRelease.
  requestId @0 :UInt64;
  # Echoed by the BarrierRelease or Error.
  barrierId @1 :UInt64;
  # Sequence number of the barrier within its group; every member sends the same id.
  group @2 :UInt8;
  # ps-lite group bitmask of the nodes taking part: 1 scheduler, 2 servers, 4 workers; 1..7.
  senderNodeId @3 :UInt32;
  # Node id of the sender.
  values @4 :List(Float64);
  # What the sender shares with the other members (KVStore::gather_at_barrier: a worker's
  # throughput, say): at most 64 numbers, usually none. Every member receives every member's in
  # BarrierRelease.gathered.
  start @5 :Bool;
  # The barrier that ends a worker's init or set_optimizer (the job's start): a worker that joins
  # at a barrier (Registration.joinAtBarrier) is never taken in there, since its own store skips
  # those barriers.
}

struct GatheredValues {
  # One member's Barrier.values, as BarrierRelease.gathered carries them.
  role @0 :Role;
  rank @1 :UInt32;
  values @2 :List(Float64);
  # At most 64.
}

struct BarrierRelease {
  # Scheduler -> each member of a barrier: every live member of the group has arrived (members
  # lost within the quorum are not waited for).
  requestId @0 :UInt64;
  # The receiving node's Barrier request id.
  barrierId @1 :UInt64;
  # The barrier released.
  group @2 :UInt8;
  # Its group bitmask, 1..7.
  gathered @3 :List(GatheredValues);
  # Every arrived member's Barrier.values (members with none left out), ordered by role, then
  # rank; members lost within the quorum are absent.
}

struct OptimizerParam {
  # One named hyper-parameter, MXNet's optimizer keyword arguments.
  name @0 :Text;
  # e.g. "learning_rate", "rescale_grad", "wd", "momentum"; non-empty.
  value @1 :Float64;
  # Its value.
}

struct SetOptimizer {
  # Worker (rank 0) -> every server: the optimizer servers apply to merged gradients
  # (update_on_kvstore). Answered by Ack.
  requestId @0 :UInt64;
  # Echoed by the Ack or Error.
  name @1 :Text;
  # MXNet optimizer name ("sgd", "test", "adam", ...); non-empty.
  params @2 :List(OptimizerParam);
  # Its parameters, in the order given by the user.
}

struct SetGradientCompression {
  # Worker (rank 0) -> every server: pushes are compressed from now on (MXNet's
  # set_gradient_compression, kSetGradientCompression). Answered by Ack once the server has
  # checked the setting; Error invalidArgument for an unknown type or a threshold the type does
  # not take. The rule travels in every compressed Tensor too (Tensor.compression), so a server
  # keeps nothing of it.
  requestId @0 :UInt64;
  # Echoed by the Ack or Error.
  type @1 :Text;
  # "2bit", "1bit" or "none"; non-empty.
  threshold @2 :Float64;
  # Finite; > 0 for "2bit" (MXNet's default 0.5), >= 0 for "1bit"; ignored by "none".
}

struct Command {
  # Job control. Worker -> scheduler: stop ("this worker is done"), answered by Ack. Scheduler
  # -> each server, once every live worker is done: stop, not acknowledged. Worker -> every
  # server: the checkpoint commands (and the older mode commands), answered by Ack.
  requestId @0 :UInt64;
  # Echoed by the Ack or Error.
  union {
    unset @1 :Void;
    # Never sent; rejected.
    stop @2 :Void;
    # From a worker to the scheduler: the worker is done. From a server to the scheduler
    # (elastic servers): the server asks to leave; acked at once, its key ranges move to the
    # other servers, then it is sent stop. From the scheduler to a server: shut down (MXNet's
    # kStopServer). Sent to a server on a data connection it is acked and changes
    # nothing.
    saveCheckpoint @3 :Text;
    # Write each shard's optimizer state (every key's state and update count, and the optimizer
    # when dumpOptimizer) to <checkpoint dir>/<name>.server<r>.shard<k> on the server's host: the
    # name (non-empty) is relative, without "..", and the directory is the server's own
    # (checkpoint.dir); a server without one refuses. Parameters are not saved. In dist_sync the
    # save waits until no round is being collected, so it holds a push acknowledged before it.
    loadCheckpoint @4 :Text;
    # Restore each shard's optimizer state from the file saveCheckpoint wrote under that name, as
    # saved by a job with the same number of servers, shards per server and workers (the refusal
    # names what differs).
    syncMode @5 :Void;
    # Apply pushes in rounds of all workers (dist_sync; MXNet's kSyncMode). Superseded by
    # SyncSettings, which troupe's workers send instead; still accepted as SyncSettings with mode
    # sync and the defaults.
    asyncMode @6 :Void;
    # Apply each push as it arrives (dist_async); superseded likewise.
  }
  dumpOptimizer @7 :Bool;
  # saveCheckpoint: write the optimizer (its name and parameters) with the states, so that a load
  # restores it too (MXNet's dump_optimizer). Ignored by the other commands.
  rounds @8 :UInt64;
  # stop from a worker: the most pushes it made of any one key (its rounds), which the
  # scheduler's end-of-job summary names for a worker that left before others. 0 otherwise.
}

enum Consistency {
  unspecified @0;  # not set; rejected
  sync @1;         # dist_sync: pushes are applied in rounds
  async @2;        # dist_async: each push is applied as it arrives
}

struct SyncSettings {
  # Worker rank 0 -> every server and the scheduler, before its first init: how the job applies
  # pushes (the scheduler takes the quorum only). Answered by Ack. A shard refuses settings that
  # differ from its own once it holds a key. Supersedes Command.syncMode / asyncMode (still
  # accepted: the mode with the defaults below).
  requestId @0 :UInt64;
  # Echoed by the Ack or Error.
  mode @1 :Consistency;
  # Required.
  quorum @2 :UInt32;
  # 1..numWorkers. dist_sync: a round closes as soon as this many distinct workers have pushed all
  # of its bytes; later pushes for it are dropped (Ack.dropped). Every mode: the job goes on while
  # at least this many workers are alive. Default numWorkers.
  rescaleQuorum @3 :Bool;
  # dist_sync with quorum < numWorkers: scale the sum of a round by numWorkers / quorum before the
  # update, so that it estimates the sum of a full round. Default false (MXNet's scaling).
  maxStaleness @4 :Int64;
  # dist_async only: -1 none (plain async). s >= 0: a pull for round t (PullRequest.round: the
  # sender's pushes) waits until every live worker has had at least t - s pushes of the key
  # applied (stale synchronous parallel).
  maxRoundsAhead @5 :UInt32;
  # >= 1. dist_sync: how many rounds beyond the one being collected a shard accepts pushes for
  # from one worker; a worker holds further pushes until Ack.round or PullReply.round lets them
  # go. Every mode: a worker may have at most maxRoundsAhead + 1 pulls of a key waiting at a
  # shard. Default 2.
}

struct HandOver {
  # Scheduler -> a server, on its control connection (elastic servers, job.max_servers): hand the
  # keys of key ranges `ranges` to server `toServer`, which the membership table the server holds
  # lists alive. Each shard hands its part over at once, with the rounds its keys completed
  # (actors/logic/shard_core.hpp, hand_over: the workers send again what a round not completed
  # held), and the server sends it as RangeData on a data connection to that server. Answered by Ack once every shard's part was taken there, or by Error naming why
  # not (the ranges then stay away from this server: the scheduler fails the job).
  requestId @0 :UInt64;
  ranges @1 :List(UInt32);
  # Each below the job's key ranges; at least one.
  toServer @2 :UInt32;
}

struct RangeData {
  # Server -> server, on a data connection whose handshake proved the sending server's node key
  # K(server, rank): one shard's hand-over of key ranges, the snapshot that
  # actors/logic/shard_checkpoint.hpp's encode_snapshot writes (checksummed), carried as the
  # int64 words of `tensor` (shape [words]), cut in chunks like any tensor; its first `bytes`
  # bytes are the snapshot, the rest pads its last word. Answered, once the last chunk is in, by
  # Ack when shard `shard` of the receiving server took the keys (shard_core::take_over), or by
  # Error naming why not (nothing changed there). A worker's connection may not send it.
  requestId @0 :UInt64;
  shard @1 :UInt32;
  bytes @2 :UInt64;
  tensor @3 :Tensor;
}

struct LinkCredit {
  # Either end of a data or control connection -> the other: the sender of this frame has released
  # `bytes` more bytes of the frames it received, which the peer may now send. Each end starts with
  # the window the other announced in its LinkHello. Sent once the released bytes reach
  # max(windowBytes / 8, 1). Link control: needs no credit itself, never forwarded to an actor.
  bytes @0 :UInt64;
  # Bytes released since the previous LinkCredit; > 0 and at most what the peer has outstanding
  # (more breaks the protocol: the connection is closed).
}

struct Heartbeat {
  # Node -> scheduler and scheduler -> every node, periodically (timeouts.heartbeat); not
  # acknowledged. Any frame counts as a sign of life: a peer silent for longer than the peer
  # timeout is lost.
  senderNodeId @0 :UInt32;
  # Node id of the sender.
  sequence @1 :UInt64;
  # Increases by one per heartbeat of the sender; gaps show lost or delayed heartbeats.
  timestampNs @2 :Int64;
  # Sender's system clock, ns since the Unix epoch; for logs only (clocks are not synchronised).
}

enum ErrorCode {
  unspecified @0;         # not set; rejected
  badFrame @1;            # the request's frame failed to decode (size, structure, consistency)
  unknownKey @2;          # the key was never initialised on this shard
  shapeMismatch @3;       # shape or size differs from the key's declaration
  dtypeMismatch @4;       # element type differs from the key's declaration
  alreadyInitialized @5;  # Init of a key that exists
  staleRound @6;          # the round is older than the shard's current one
  notAdmitted @7;         # the sender is not (or no longer) a member of the job
  unsupported @8;         # unknown optimizer, compression type or command
  lostPeer @9;            # a node the request depends on was lost
  timeout @10;            # the request could not complete in time
  shuttingDown @11;       # the receiver is stopping and takes no new requests, or (a barrier)
                          # a member of its group has finished
  internal @12;           # a bug on the receiver's side; the message says more
  invalidArgument @13;    # a parameter value is out of range
  notPermitted @14;       # the request acts as another node than its connection proved (a push
                          # under another worker's rank), or only worker rank 0 may send it
  moved @15;              # the key's range has left this server for another (elastic servers);
                          # the worker sends the request again to the server the next membership
                          # table names for the range
}

struct Error {
  # Reply to any request that failed; a request handled by one actor changed nothing (a keyless
  # request fanned out to every shard of a server answers with the first shard's error, and the
  # other shards may have applied it). Also sent unasked by the scheduler, with requestId 0, when
  # the job fails (lostPeer or timeout, naming the node or the missing roles) and to a worker lost
  # within the quorum.
  requestId @0 :UInt64;
  # The failed request's id; 0 for a frame that failed to decode (its id cannot be trusted) and
  # for the scheduler's unasked notices.
  union {
    noKey @1 :Void;
    # The error is not about one key.
    key @2 :UInt64;
    # The key the failed request referred to.
  }
  code @3 :ErrorCode;
  # What went wrong; required.
  message @4 :Text;
  # Human-readable detail naming the values involved.
}

struct LinkHello {
  # Every framed-link connection: each end's first frame. The listener sends its hello as the
  # connection opens; the connector waits for it and answers with its own, which proves the job
  # token (proof) and, on a data connection, the key of the worker it is (nodeRole, nodeRank,
  # nodeProof); the listener answers good proofs with LinkAuth. Until then an end sends nothing
  # else, and frames are capped at 4 KiB: an unauthenticated peer cannot make either end allocate
  # more. A wrong or missing proof is refused (Error notAdmitted, naming it); any other first
  # frame or a second LinkHello breaks the protocol (Error badFrame); either closes the
  # connection. Never forwarded to an actor. Once authenticated, both
  # ends compare hostId: equal ids mean the same kernel, and then each end with a non-zero
  # arenaBytes may offer an arena for what it sends (ArenaOffer).
  hostId @0 :Text;
  # The sender's host identity: /proc/sys/kernel/random/boot_id, "/net:" and the inode of its
  # network namespace, "/pid:" and that of its PID namespace, a slash and the uts hostname (at
  # most 151 bytes; docs/data-path.md, "Same host"); "unknown" when it cannot tell. Non-empty.
  arenaBytes @1 :UInt64;
  # Size of the arena the sender would create for its direction; 0: it will neither offer one
  # nor accept the peer's.
  windowBytes @2 :UInt64;
  # Receive window of the sender: the peer may have this many bytes of frames (prefix included;
  # link-control frames are not counted) outstanding before LinkCredit returns some. A frame may
  # also go when less than max(windowBytes / 8, 1) is outstanding, so a single frame larger than
  # the window goes (nearly) alone. A frame beyond this breaks the protocol. 0: the sender grants
  # no window (no credit flow control).
  nonce @3 :Data;
  # 32 random bytes, fresh for this connection; anything else is refused.
  proof @4 :Data;
  # Empty in the listener's hello. In the connector's: HMAC-SHA256 keyed with the job token over
  # the handshake transcript (label "troupe link v1 connector", both nonces, both hellos' other
  # fields; actors/logic/link_auth.hpp has the exact bytes), 32 bytes. The listener refuses a
  # missing or wrong proof and closes the connection; a proof replayed from another connection
  # is wrong, because the listener's nonce differs.
  keyShare @5 :Data;
  # The connector of a control connection (node -> scheduler): an X25519 public key, 32 bytes,
  # fresh for this connection; empty on data connections and in the listener's hello. The
  # scheduler answers with its own in LinkAuth.keyShare; both ends then derive the connection's
  # session key, HMAC-SHA256 keyed with the token over the transcript, the listener's share and
  # the X25519 shared secret, under which the scheduler seals Admission.admitted.sealedSecret. A
  # token holder who only reads the connection cannot compute it. Covered by both proofs.
  nodeRole @6 :Role;
  # The connector of a data connection (worker -> server): the node it claims to be, a worker;
  # unspecified in every other hello. Covered by both proofs.
  nodeRank @7 :UInt32;
  # Its rank within nodeRole; 0 when nodeRole is unspecified.
  nodeProof @8 :Data;
  # With nodeRole: HMAC-SHA256 keyed with that node's key (Admission.admitted.sealedSecret) over
  # the transcript with the label "troupe link v1 node connector", 32 bytes; empty otherwise. A
  # server's data port refuses a hello without it, with a wrong one, or from a rank the scheduler
  # declared lost, and holds a hello (within the handshake's time) until its own admission gave
  # it the job secret. It then takes pushes, pulls and pushpulls on the connection only under
  # that rank, and init, set_optimizer, sync_settings and commands only from worker rank 0
  # (Error notPermitted otherwise).
}

struct LinkAuth {
  # Listener -> connector, once the connector's proof checked out: the listener's own proof,
  # HMAC-SHA256 keyed with the job token over the same transcript with the label
  # "troupe link v1 listener" (and the keyShare below). The connector sends nothing but its hello
  # until this arrives and closes the connection when it is wrong. Link control, never forwarded
  # to an actor.
  proof @0 :Data;
  # 32 bytes.
  keyShare @1 :Data;
  # The scheduler's X25519 public key, 32 bytes, fresh for this connection, when the connector's
  # hello carried one (LinkHello.keyShare); empty otherwise. Made only once the connector has
  # proved the token, so a stranger cannot make the listener work for it.
  nodeProof @2 :Data;
  # When the connector's hello claimed a node (LinkHello.nodeRole): HMAC-SHA256 keyed with that
  # node's key over the transcript with the label "troupe link v1 node listener", 32 bytes; it
  # proves to the worker that the listener is a server of this job. Empty otherwise.
}

struct ArenaOffer {
  # Data connections, after the handshake, when the LinkHellos showed the same host: the sender
  # created a memory file (memfd) for the frames it sends, sealed against shrinking and growing.
  # Answered by ArenaAccept; the sender closes the descriptor once answered (or when the
  # connection closes). Nothing has a name in a file system, so nothing is ever left behind.
  name @0 :Text;
  # "/proc/<sender pid>/fd/<descriptor>", decimal numbers; anything else is refused, as is a file
  # that is not sealed against shrinking (its owner could cut it short under the mapping).
  bytes @1 :UInt64;
  # Size of the file; the receiver maps it read-only and refuses it if it is smaller.
}

struct ArenaAccept {
  # Reply to ArenaOffer. Until it arrives, and for good when ok is false, tensors travel inline.
  ok @0 :Bool;
  # True: the arena is mapped, Tensor.shm references to it are accepted from now on.
  detail @1 :Text;
  # Why it was refused (for the log); empty when ok.
}

struct ArenaRelease {
  # Receiver of Tensor.shm references -> their sender: these regions are no longer read.
  offsets @0 :List(UInt64);
  # The Tensor.shm offsets released, in any order; each one once.
}

struct Message {
  # The one root type of every frame.
  union {
    unset @0 :Void;
    # Never sent; a frame carrying it (e.g. all zeros) is rejected.
    registration @1 :Registration;
    # Node -> scheduler.
    admission @2 :Admission;
    # Scheduler -> node.
    membership @3 :Membership;
    # Scheduler -> all nodes.
    init @4 :Init;
    # Worker -> server.
    push @5 :Push;
    # Worker -> server.
    pullRequest @6 :PullRequest;
    # Worker -> server.
    pullReply @7 :PullReply;
    # Server -> worker.
    pushPull @8 :PushPull;
    # Worker -> server.
    ack @9 :Ack;
    # Any receiver of a request -> its sender.
    barrier @10 :Barrier;
    # Node -> scheduler.
    barrierRelease @11 :BarrierRelease;
    # Scheduler -> node.
    setOptimizer @12 :SetOptimizer;
    # Worker -> servers.
    setGradientCompression @13 :SetGradientCompression;
    # Worker -> servers.
    command @14 :Command;
    # Worker -> scheduler (done) or servers (checkpoints); scheduler -> servers (stop).
    heartbeat @15 :Heartbeat;
    # Node -> scheduler and scheduler -> node.
    error @16 :Error;
    # Any receiver of a request -> its sender; scheduler -> nodes, unasked.
    linkHello @17 :LinkHello;
    # Either end of every connection: its first frame.
    arenaOffer @18 :ArenaOffer;
    # Either end of a data connection.
    arenaAccept @19 :ArenaAccept;
    # Either end of a data connection.
    arenaRelease @20 :ArenaRelease;
    # Either end of a data connection.
    syncSettings @21 :SyncSettings;
    # Worker rank 0 -> servers and scheduler.
    linkCredit @22 :LinkCredit;
    # Either end of a connection.
    linkAuth @23 :LinkAuth;
    # Listener -> connector, after the connector's LinkHello.
    batch @24 :List(Message);
    # Several small keyed messages fused in one frame (a worker's requests to one server, or a
    # server's replies to one worker: docs/data-path.md, "Fusion"). Each element is handled
    # exactly as if it had come alone in its own frame, in list order, at the batch's place in
    # the stream; none is a Batch. A worker's batch holds only Push, PullRequest and PushPull;
    # a server's only Ack, PullReply and Error. A tensor in a batch is whole (one chunk). The
    # tensors of a batch in the sender's arena (Tensor.shm) share one region, which starts at the
    # first of them: the receiver releases that offset once, for the whole batch. At most 65,536
    # elements.
    handOver @25 :HandOver;
    # Scheduler -> server (elastic servers).
    rangeData @26 :RangeData;
    # Server -> server (elastic servers).
  }
}
