// The data server and data link brokers (see data_link.hpp for the contract and
// data_link_framing.hpp for how bytes become frames and back).
//
// Everything here runs on the middleman's I/O thread: CAF schedules brokers on the multiplexer,
// so the socket callbacks (new_data_msg, data_transferred_msg) and the mailbox (envelopes from
// shards or from the worker) are handled by one thread, and the connection state needs no lock.
//
// Write pacing: the brokers turn on ack_writes, so CAF reports every write the socket took with
// the bytes still in its buffers (data_transferred_msg::remaining). A connection hands CAF at
// most max_bytes_in_flight, in write_chunk_bytes steps, and tops up on each report: the socket
// always has the next chunk ready while tensors wait in the queue uncopied. A small frame goes to
// the write buffer and is flushed at once when the connection is idle: no timer delays it.

#include "actors/data_link.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/network/multiplexer.hpp>
#include <caf/io/receive_policy.hpp>
#include <caf/io/system_messages.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/data_link_framing.hpp"

namespace troupe {

namespace {

using caf::io::connection_handle;
using caf::io::receive_policy;

/// One connection's receiving and sending state, the same for both broker kinds.
struct link_connection {
  link_connection(std::uint64_t connection_id, connection_handle handle,
                  std::shared_ptr<receive_buffer_pool> pool, const wire::decode_limits& limits)
      : id(connection_id), hdl(handle), receiver(std::move(pool), limits) {}

  std::uint64_t id;
  connection_handle hdl;
  frame_receiver receiver;
  frame_send_queue queue;
  /// Bytes handed to CAF that the socket has not taken yet (CAF's own count, refreshed by every
  /// data_transferred_msg, plus what was appended since).
  std::size_t in_flight = 0;
  /// The peer broke the framing: whatever else arrives is ignored, and the connection closes as
  /// soon as the queued frames (the error_reply last) are in CAF's buffer, which CAF still sends.
  bool closing = false;
};

void log_line(const data_link_tuning& tuning, const std::string& line) {
  if (tuning.log)
    tuning.log(line);
}

std::optional<error> check_tuning(const data_link_tuning& tuning, const char* who) {
  if (tuning.write_chunk_bytes == 0 || tuning.max_bytes_in_flight == 0)
    return error{errc::invalid_argument,
                 std::string(who) + ": write_chunk_bytes and max_bytes_in_flight must be positive"};
  if (tuning.limits.max_frame_bytes < 16)
    return error{errc::invalid_argument, std::string(who) + ": limits.max_frame_bytes of " +
                                             std::to_string(tuning.limits.max_frame_bytes) +
                                             " bytes is below the smallest frame (16)"};
  return std::nullopt;
}

wire::message bad_frame_reply(const wire::decode_error& why) {
  return wire::error_reply{0, std::nullopt, wire::error_code::bad_frame,
                           "bad frame: " + std::string(wire::to_string(why.kind)) + ": " +
                               why.message};
}

/// The reply a request gets when it cannot be handled or answered at all.
wire::message failure_reply(const wire::message& request, wire::error_code code, std::string why) {
  return wire::error_reply{wire::request_id_of(request), wire::key_of(request), code,
                           std::move(why)};
}

/// Encodes `msg` for the wire, or says why it cannot go: encode refused it, or it is bigger than
/// the peer accepts (our own limit: both ends of a job use one configuration).
std::optional<std::string> encode_into(frame_send_queue& queue, const wire::message& msg,
                                       std::shared_ptr<const void> keepalive,
                                       const data_link_tuning& tuning) {
  try {
    auto frame = wire::encode(msg);
    if (frame.body_size() > tuning.limits.max_frame_bytes)
      return std::string(wire::kind_name(msg)) + " frame of " + std::to_string(frame.body_size()) +
             " bytes exceeds max_frame_bytes " + std::to_string(tuning.limits.max_frame_bytes) +
             "; split the tensor (wire::chunker)";
    queue.push(std::move(frame), std::move(keepalive));
    return std::nullopt;
  } catch (const std::exception& e) {
    return std::string("cannot encode ") + std::string(wire::kind_name(msg)) + ": " + e.what();
  }
}

/// Queues an error_reply; these are small and always encodable.
void queue_reply(link_connection& c, const wire::message& reply, const data_link_tuning& tuning) {
  if (auto why = encode_into(c.queue, reply, nullptr, tuning))
    log_line(tuning, "data link: dropping an error reply: " + *why);
}

/// Hands queued bytes to CAF while the in-flight bound allows, flushing each step.
void pump(caf::io::abstract_broker* self, link_connection& c, const data_link_tuning& tuning) {
  while (!c.queue.empty() && c.in_flight < tuning.max_bytes_in_flight) {
    const std::size_t budget =
        std::min(tuning.write_chunk_bytes, tuning.max_bytes_in_flight - c.in_flight);
    c.in_flight += c.queue.append_to(self->wr_buf(c.hdl), budget);
    // Starts the write when the socket is idle; otherwise CAF swaps this buffer in when the
    // current one is written, so the next chunk is always ready.
    self->flush(c.hdl);
  }
}

// ================================================================================================
// server

struct server_state {
  data_server_options options;
  std::shared_ptr<receive_buffer_pool> pool;
  std::unordered_map<connection_handle, link_connection> connections;
  /// Our own connection ids: CAF's handles are socket numbers, which the kernel reuses, and a
  /// late reply must never reach the next peer that gets the same number.
  std::unordered_map<std::uint64_t, connection_handle> handles;
  std::uint64_t next_id = 1;
  /// "host:port" bound, the answer to (get_atom).
  std::string endpoint;

  static inline const char* name = "troupe.data_server";
};

using server_broker = caf::io::stateful_broker<server_state>;

/// Forgets a connection and reports it. `close` when the socket is still open (CAF sends what
/// its buffers hold, then FIN); not when CAF reported the close.
void drop_connection(server_broker* self, connection_handle hdl, bool close, const char* why) {
  auto& st = self->state;
  auto i = st.connections.find(hdl);
  if (i == st.connections.end())
    return;
  const std::uint64_t id = i->second.id;
  if (close)
    self->close(hdl);
  st.handles.erase(id);
  st.connections.erase(i);
  log_line(st.options.tuning, "data server: connection " + std::to_string(id) + " " + why);
  if (st.options.on_disconnect)
    st.options.on_disconnect(id);
}

/// Writes what the connection may, and closes it once a fatal frame's reply is handed over.
void serve_writes(server_broker* self, link_connection& c) {
  pump(self, c, self->state.options.tuning);
  if (c.closing && c.queue.empty())
    drop_connection(self, c.hdl, true, "closed after a frame that broke the framing");
}

void dispatch(server_broker* self, link_connection& c, envelope&& request) {
  auto& st = self->state;
  request.connection = c.id;
  caf::actor target;
  try {
    target = st.options.route(request);
  } catch (const std::exception& e) {
    queue_reply(c,
                failure_reply(request.msg, wire::error_code::internal,
                              std::string("routing failed: ") + e.what()),
                st.options.tuning);
    return;
  }
  if (!target) {
    queue_reply(c,
                failure_reply(request.msg, wire::error_code::unsupported,
                              "no handler for " + std::string(wire::kind_name(request.msg)) +
                                  " frames on this server"),
                st.options.tuning);
    return;
  }
  self->send(target, std::move(request), caf::actor_cast<caf::actor>(self));
}

caf::behavior data_server_impl(server_broker* self, caf::io::doorman_ptr acceptor,
                               std::string endpoint, data_server_options options) {
  auto& st = self->state;
  st.options = std::move(options);
  st.endpoint = std::move(endpoint);
  st.pool = std::make_shared<receive_buffer_pool>(st.options.tuning.max_cached_buffer_bytes);
  self->add_doorman(std::move(acceptor));
  return {
      [=](const caf::io::new_connection_msg& msg) {
        auto& st = self->state;
        const std::uint64_t id = st.next_id++;
        st.connections.try_emplace(msg.handle, id, msg.handle, st.pool, st.options.tuning.limits);
        st.handles.emplace(id, msg.handle);
        self->ack_writes(msg.handle, true);
        self->configure_read(msg.handle, receive_policy::exactly(frame_receiver::first_read));
        log_line(st.options.tuning, "data server: connection " + std::to_string(id) + " from " +
                                        self->remote_addr(msg.handle) + ":" +
                                        std::to_string(self->remote_port(msg.handle)));
      },
      [=](caf::io::new_data_msg& msg) {
        auto& st = self->state;
        auto i = st.connections.find(msg.handle);
        if (i == st.connections.end() || i->second.closing)
          return;
        auto& c = i->second;
        auto out = c.receiver.consume(msg.buf);
        if (out.error) {
          log_line(st.options.tuning,
                   "data server: connection " + std::to_string(c.id) + " sent a bad frame: " +
                       std::string(wire::to_string(out.error->kind)) + ": " + out.error->message);
          queue_reply(c, bad_frame_reply(*out.error), st.options.tuning);
        }
        if (out.fatal())
          c.closing = true;
        else
          self->configure_read(msg.handle, receive_policy::exactly(out.next_read));
        if (out.frame)
          dispatch(self, c, std::move(*out.frame));
        serve_writes(self, c);
      },
      [=](const caf::io::data_transferred_msg& msg) {
        auto& st = self->state;
        auto i = st.connections.find(msg.handle);
        if (i == st.connections.end())
          return;
        i->second.in_flight = msg.remaining;
        serve_writes(self, i->second);
      },
      [=](const caf::io::connection_closed_msg& msg) {
        drop_connection(self, msg.handle, false, "closed by the peer");
      },
      [=](const caf::io::acceptor_closed_msg&) {
        // Existing connections keep being served; only new peers are turned away.
        log_line(self->state.options.tuning, "data server: the listening socket closed");
      },
      [=](envelope& reply) {
        auto& st = self->state;
        auto h = st.handles.find(reply.connection);
        if (h == st.handles.end()) {
          log_line(st.options.tuning,
                   "data server: dropping a " + std::string(wire::kind_name(reply.msg)) +
                       " for connection " + std::to_string(reply.connection) + ", which is closed");
          return;
        }
        auto& c = st.connections.at(h->second);
        if (auto why =
                encode_into(c.queue, reply.msg, std::move(reply.keepalive), st.options.tuning)) {
          // The peer waits for an answer to this request id: tell it why none comes.
          log_line(st.options.tuning, "data server: " + *why);
          queue_reply(c, failure_reply(reply.msg, wire::error_code::internal, *why),
                      st.options.tuning);
        }
        serve_writes(self, c);
      },
      [=](caf::get_atom) { return self->state.endpoint; },
      [=](stop_atom) {
        auto& st = self->state;
        std::vector<connection_handle> open;
        for (const auto& entry : st.connections)
          open.push_back(entry.first);
        for (auto hdl : open)
          drop_connection(self, hdl, true, "closed: the server stops");
        // Quitting closes the listening socket with every other servant of the broker.
        self->quit();
      },
  };
}

// ================================================================================================
// client

struct client_state {
  data_link_tuning tuning;
  caf::actor receiver;
  /// "host:port", for every message about this link.
  std::string peer;
  std::optional<link_connection> connection;
  bool down = false;

  static inline const char* name = "troupe.data_link";
};

using client_broker = caf::io::stateful_broker<client_state>;

/// Tells the receiver once that the link is gone, and ends the broker (which closes the socket).
void link_down(client_broker* self, std::string reason) {
  auto& st = self->state;
  if (!st.down) {
    st.down = true;
    log_line(st.tuning, "data link: " + reason);
    self->send(st.receiver, link_down_atom::value, std::move(reason));
  }
  self->quit();
}

/// A local reply to the receiver, for a request that never left or a frame that was refused.
void tell_receiver(client_broker* self, wire::message msg) {
  self->send(self->state.receiver, envelope{std::move(msg), nullptr, 0});
}

caf::behavior data_link_impl(client_broker* self, connection_handle hdl, caf::actor receiver,
                             std::string peer, data_link_options options) {
  auto& st = self->state;
  st.tuning = std::move(options.tuning);
  st.receiver = std::move(receiver);
  st.peer = std::move(peer);
  st.connection.emplace(1, hdl,
                        std::make_shared<receive_buffer_pool>(st.tuning.max_cached_buffer_bytes),
                        st.tuning.limits);
  // Nobody would read what arrives once the receiver is gone.
  self->monitor(st.receiver);
  self->set_down_handler([=](caf::down_msg& msg) {
    if (msg.source == self->state.receiver)
      self->quit();
  });
  self->ack_writes(hdl, true);
  self->configure_read(hdl, receive_policy::exactly(frame_receiver::first_read));
  return {
      [=](caf::io::new_data_msg& msg) {
        auto& st = self->state;
        if (st.down)
          return;
        auto& c = *st.connection;
        auto out = c.receiver.consume(msg.buf);
        if (out.frame)
          self->send(st.receiver, std::move(*out.frame));
        if (out.fatal()) {
          link_down(self, "data link to " + st.peer + " closed: the server sent a frame that " +
                              "breaks the framing: " + out.error->message);
          return;
        }
        if (out.error) {
          log_line(st.tuning, "data link: " + st.peer + " sent a bad frame: " + out.error->message);
          tell_receiver(self, bad_frame_reply(*out.error));
        }
        self->configure_read(msg.handle, receive_policy::exactly(out.next_read));
      },
      [=](const caf::io::data_transferred_msg& msg) {
        auto& st = self->state;
        if (st.down)
          return;
        st.connection->in_flight = msg.remaining;
        pump(self, *st.connection, st.tuning);
      },
      [=](const caf::io::connection_closed_msg&) {
        link_down(self, "data link to " + self->state.peer + " closed by the peer");
      },
      [=](envelope& request) {
        auto& st = self->state;
        if (st.down)
          return;
        auto& c = *st.connection;
        if (auto why = encode_into(c.queue, request.msg, std::move(request.keepalive), st.tuning)) {
          log_line(st.tuning, "data link: " + *why);
          tell_receiver(self, failure_reply(request.msg, wire::error_code::internal, *why));
          return;
        }
        pump(self, c, st.tuning);
      },
      [=](caf::get_atom) { return self->state.peer; },
      [=](stop_atom) {
        link_down(self, "data link to " + self->state.peer + " stopped by its owner");
      },
  };
}

/// Waits until `broker` has run its first message. The socket it was spawned with is registered
/// with the multiplexer through the same queue as that message, so afterwards the broker is
/// really listening (or reading). Without this, a broker stopped right after its spawn makes
/// CAF 0.17.6 register the socket after the broker is gone and leak it (LeakSanitizer shows the
/// same with middleman::spawn_server).
std::optional<std::string> await_started(caf::actor_system& sys, const caf::actor& broker) {
  caf::scoped_actor self{sys};
  std::optional<std::string> failure;
  self->request(broker, std::chrono::seconds(10), caf::get_atom::value)
      .receive([](const std::string&) {},
               [&](caf::error& e) { failure = "the broker did not start: " + sys.render(e); });
  return failure;
}

} // namespace

result<data_server> spawn_data_server(caf::actor_system& sys, const std::string& bind_host,
                                      std::uint16_t port, data_server_options options) {
  if (!options.route)
    return error{errc::invalid_argument, "spawn_data_server: options.route is empty"};
  if (bind_host.empty())
    return error{errc::invalid_argument,
                 "spawn_data_server: empty bind address (use 0.0.0.0 for every interface)"};
  if (auto bad = check_tuning(options.tuning, "spawn_data_server"))
    return *bad;
  const std::string where = bind_host + ":" + std::to_string(port);
  auto& middleman = sys.middleman();
  // The doorman is made here, not with spawn_server, because only the multiplexer takes the
  // address to bind: spawn_server would listen on every interface.
  auto acceptor =
      middleman.backend().new_tcp_doorman(port, bind_host.c_str(), options.reuse_address);
  if (!acceptor)
    return error{errc::io_error,
                 "cannot listen for data links on " + where + ": " + sys.render(acceptor.error())};
  data_server server;
  server.port = (*acceptor)->port();
  server.host = (*acceptor)->addr();
  server.broker =
      middleman.spawn_broker(data_server_impl, std::move(*acceptor),
                             server.host + ":" + std::to_string(server.port), std::move(options));
  if (auto failure = await_started(sys, server.broker)) {
    caf::anon_send_exit(server.broker, caf::exit_reason::kill);
    return error{errc::internal, "data server on " + where + ": " + *failure};
  }
  return server;
}

result<caf::actor> connect_data_link(caf::actor_system& sys, const std::string& host,
                                     std::uint16_t port, caf::actor receiver,
                                     data_link_options options) {
  const std::string peer = host + ":" + std::to_string(port);
  if (!receiver)
    return error{errc::invalid_argument, "connect_data_link to " + peer + ": invalid receiver"};
  if (auto bad = check_tuning(options.tuning, "connect_data_link"))
    return *bad;
  auto link = sys.middleman().spawn_client(data_link_impl, host, port, std::move(receiver), peer,
                                           std::move(options));
  if (!link)
    return error{errc::peer_lost,
                 "cannot connect a data link to " + peer + ": " + sys.render(link.error())};
  if (auto failure = await_started(sys, *link)) {
    caf::anon_send_exit(*link, caf::exit_reason::kill);
    return error{errc::peer_lost, "data link to " + peer + ": " + *failure};
  }
  return *link;
}

void tune_for_data_path(caf::actor_system_config& cfg) {
  cfg.set("work-stealing.moderate-poll-attempts", 0);
}

} // namespace troupe
