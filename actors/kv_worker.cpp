#include "actors/kv_worker.hpp"

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/abstract_broker.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/typed_broker.hpp>
#include <caf/send.hpp>
#include <caf/spawn_options.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/data_link.hpp"
#include "actors/logic/worker_core.hpp"
#include "engine/dispatch.hpp"

namespace troupe {
namespace {

/// The int is unused: CAF 0.17.6's init_fun_factory dereferences a null argument tuple for a
/// function without arguments (UBSan reports it; actors/server_node.cpp does the same).
reply_copier_actor::behavior_type reply_copier(int) {
  return {[](reply_copy& job) {
    engine::on_behalf_of_lane_scope owned; // as the worker's handlers (guarded)
    job.run();
  }};
}

/// Whether `link` is a broker, which CAF 0.17 wakes for a message from another thread by writing
/// to the multiplexer's pipe: that write blocks while the pipe is full, until the I/O thread reads
/// it. An actor the scheduler runs is woken without it.
bool is_broker(const link_actor& link) {
  return dynamic_cast<caf::io::abstract_broker*>(caf::actor_cast<caf::abstract_actor*>(link)) !=
         nullptr;
}

/// The receipts of frames that left while a worker ran its core on this thread (a frame written
/// to the socket from there, link_lane::write_now): the worker settles them itself when the core
/// returns, instead of hearing of each from a message.
struct receipts_here {
  const void* worker = nullptr;
  std::vector<send_receipt> left;
};
thread_local receipts_here* settling = nullptr;

/// An envelope's keepalive that tells the worker, once the last copy is gone (on whichever
/// thread drops it: the link's once the frame is in CAF's write buffer, the socket or the
/// shared-memory arena, the shard's in one process), that the frame has left its send window. It
/// holds the keepalive it wraps, and only a weak reference to the worker, which a link must not
/// keep alive.
class receipt_on_release {
public:
  receipt_on_release(std::shared_ptr<const void> inner, caf::weak_actor_ptr worker,
                     const void* state, send_receipt receipt)
      : inner_(std::move(inner)), worker_(std::move(worker)), state_(state), receipt_(receipt) {}
  receipt_on_release(const receipt_on_release&) = delete;
  receipt_on_release& operator=(const receipt_on_release&) = delete;
  ~receipt_on_release() {
    if (settling != nullptr && settling->worker == state_) {
      settling->left.push_back(receipt_);
      return;
    }
    if (auto worker = worker_.lock())
      caf::anon_send(caf::actor_cast<worker_actor>(std::move(worker)), receipt_);
  }

private:
  std::shared_ptr<const void> inner_;
  caf::weak_actor_ptr worker_;
  const void* state_;
  send_receipt receipt_;
};

template <class Handle>
struct broker_of;
template <class... Sigs>
struct broker_of<caf::typed_actor<Sigs...>> {
  using type = caf::io::typed_broker<Sigs...>;
};

/// Where the worker runs: as a broker on the middleman's I/O thread when the system has one (the
/// links to the servers are brokers on that thread too, so a request and its replies cross no
/// other thread between the caller and the socket), else as an ordinary actor (in-process jobs).
using worker_on_io_thread = broker_of<worker_actor>::type;
using worker_on_scheduler = worker_actor::base;

/// The worker actor: its worker_core and what the core asks of it (links, the copier, the relink
/// helper, the delayed report of a lost link), plus the ticks.
template <class Base>
class worker_state : public worker_core::output {
public:
  static inline const char* name = "troupe.kv_worker";

  using pointer = caf::stateful_actor<worker_state, Base>*;

  worker_state() = default;
  worker_state(const worker_state&) = delete;
  worker_state& operator=(const worker_state&) = delete;
  ~worker_state() {
    if (lane_) {
      std::lock_guard hold{lane_->mutex()};
      lane_->set_runner(nullptr);
    }
  }

  worker_actor::behavior_type start(pointer self, kv_worker_options options) {
    self_ = self;
    options_ = std::move(options);
    lane_ = options_.lane;
    worker_core_options rules = options_;
    rules.can_relink = options_.reconnect != nullptr;
    // This process's data links, as the servers' summaries count theirs.
    rules.summary_footer = [] { return describe_tensor_bytes(process_link_tensor_bytes()); };
    core_.emplace(std::move(rules), *this);
    copier_ = self->template spawn<caf::linked>(reply_copier, 0);
    if (lane_) {
      std::lock_guard hold{lane_->mutex()};
      lane_->set_runner([this](kv_operation& op) { return run_here(op); });
    }
    schedule_tick();
    return {
        [this](server_links& links) {
          serve("its links", [&] {
            links_ = std::move(links.links);
            link_lanes_ = std::move(links.lanes);
            link_lanes_.resize(links_.size());
            links.names.resize(links_.size());
            core_->on_links(std::move(links.names));
          });
        },
        [this](server_relink& relink) { serve("a server's new link", [&] { on_relink(relink); }); },
        [this](kv_operation& op) {
          serve(
              op.what, [&] { core_->on_call(op); }, &op.done);
        },
        [this](handed_atom, kv_operation& op) {
          // Counted off before the call runs, under the lock throughout: a caller woken by its
          // completion finds the count at 0 and may run its next call itself.
          {
            std::lock_guard hold{lane_->mutex()};
            lane_->handled_one();
            guarded(
                op.what, [&] { core_->on_call(op); }, &op.done);
          }
          link_lane::send_staged();
        },
        [this](envelope& reply) { serve("a server's reply", [&] { core_->on_reply(reply); }); },
        [this](link_down_atom, std::uint64_t tag, const std::string& why) {
          serve("a link that went down", [&] { on_link_down(tag, why); });
        },
        [this](peer_lost_atom, const std::string& why) {
          serve("a lost peer", [&] { core_->fail_everything(error{errc::peer_lost, why}); });
        },
        [this](peer_lost_atom, std::uint64_t tag, const std::string& why) {
          serve("a lost server", [&] { core_->on_lost_report(tag, why); });
        },
        [this](const wire::membership& table) {
          serve("a membership table", [&] { core_->on_membership(table); });
        },
        [this](stop_atom) {
          serve("the end of the job", [&] {
            core_->fail_everything(error{errc::peer_lost, "the scheduler ended the job"});
          });
        },
        [this](tick_atom) {
          if (self_->current_sender() != self_->ctrl())
            return;
          schedule_tick();
          serve("a tick", [&] { core_->on_tick(); });
        },
        [this](finalize_atom, completion<result<std::uint64_t>>& done) {
          serve("finalize", [&] { core_->on_finalize(std::move(done)); });
        },
        [this](const send_receipt& receipt) {
          serve("a frame that left", [&] { core_->frame_left(receipt); });
        },
        [this](copied_atom, std::uint64_t id, std::uint8_t how, std::string& problem) {
          serve("a copied reply", [&] {
            // Anything else is not a chunk_copy: ignored, as a copy of a request that is gone.
            if (how <= static_cast<std::uint8_t>(chunk_copy::failed))
              core_->on_copied(id, static_cast<chunk_copy>(how), problem);
          });
        },
    };
  }

  /// worker_lane's runner, on a caller's thread with the lane's lock held: runs `op` here when
  /// the links are in, it would leave at once (worker_core::sends_at_once_to) and its server's
  /// link takes its frames from this thread without a message that may block (send): through the
  /// link's lane when it has one that takes frames now (link_lane::takes_now), or as a message
  /// to a link that is no broker (an in-process one). A relinked server's link, a broker without
  /// a lane, gets its frames from the actor.
  bool run_here(kv_operation& op) {
    if (!core_ || links_.empty())
      return false;
    const auto server = core_->sends_at_once_to(op, worker_lane::call_here_bytes);
    if (!server || *server >= links_.size())
      return false;
    const auto& lane = link_lanes_[*server];
    if (lane ? !lane->takes_now() : is_broker(links_[*server]))
      return false;
    on_caller_thread_ = true;
    guarded(
        op.what, [&] { core_->on_call(op); }, &op.done);
    on_caller_thread_ = false;
    return true;
  }

  // --- what the core asks of the actor -----------------------------------------------------------

  /// Straight to the socket when the server's link has a lane that takes the frame now
  /// (link_lane::write_now), else as a message to the link: handed through its lane (counted,
  /// so that no later frame overtakes it), or plain. On a caller's thread (run_here) always
  /// through the lane (link_lane::take), which sends no message while the locks are held.
  void send(std::uint32_t server, envelope request, send_receipt receipt) override {
    if (receipt.bytes > 0) {
      // Aliased: the keepalive still points where it pointed.
      const void* viewed = request.keepalive.get();
      auto holder = std::make_shared<const receipt_on_release>(
          std::move(request.keepalive), caf::actor_cast<caf::weak_actor_ptr>(self_),
          static_cast<const void*>(this), receipt);
      request.keepalive = std::shared_ptr<const void>(std::move(holder), viewed);
    }
    const auto& lane = link_lanes_[server];
    if (on_caller_thread_) {
      // run_here checked the link of the one server a call it runs sends to.
      if (lane) {
        lane->take(request);
        return;
      }
      if (is_broker(links_[server]))
        throw std::logic_error("a call run on the caller's thread sent a frame to server " +
                               std::to_string(server) + ", whose link is a broker without a lane");
      // Not a broker: the scheduler runs it, and the message never waits for the I/O thread.
      caf::anon_send(links_[server], std::move(request));
      return;
    }
    if (lane && lane->write_now(request))
      return;
    if (lane) {
      lane->handing();
      self_->send(links_[server], handed_atom::value, std::move(request));
      return;
    }
    self_->send(links_[server], std::move(request));
  }

  void copy_elsewhere(std::uint64_t id,
                      std::function<std::pair<chunk_copy, std::string>()> copy) override {
    auto worker = caf::actor_cast<worker_actor>(self_);
    self_->send(copier_, reply_copy{[worker, id, copy = std::move(copy)] {
                  std::pair<chunk_copy, std::string> outcome;
                  try {
                    outcome = copy();
                  } catch (const std::exception& e) {
                    outcome = {chunk_copy::failed, e.what()};
                  }
                  caf::anon_send(worker, copied_atom::value, id,
                                 static_cast<std::uint8_t>(outcome.first),
                                 std::move(outcome.second));
                }});
  }

  void report_lost_later(std::uint64_t tag, std::string why) override {
    self_->delayed_send(self_, options_.link_down_grace, peer_lost_atom::value, tag,
                        std::move(why));
  }

  /// Connects to the server's new address on a helper thread (connecting blocks); the link comes
  /// back as server_relink.
  void relink(const wire::node_info& node) override {
    auto worker = caf::actor_cast<worker_actor>(self_);
    auto receiver = caf::actor_cast<caf::actor>(self_);
    // Passed as arguments, not captured: CAF 0.17.6's init_fun_factory dereferences a null
    // argument tuple for a function without arguments (see reply_copier).
    self_->system().template spawn<caf::detached>(
        [](caf::event_based_actor* helper, const worker_actor& worker, const caf::actor& receiver,
           const reconnect_function& connect, const wire::node_info& node) {
          server_relink relink;
          relink.server = node.rank;
          relink.name =
              wire::describe(node) + " at " + node.host + ":" + std::to_string(node.data_port);
          auto link = status_of([&]() -> status {
            auto opened = connect(node, receiver);
            if (!opened)
              return opened.error();
            relink.link = *opened;
            return ok();
          });
          if (!link)
            relink.problem = link.error().message();
          caf::anon_send(worker, std::move(relink));
          helper->quit();
        },
        worker, receiver, options_.reconnect, node);
  }

private:
  /// A handler: guarded, with the lane's lock held (a caller's thread may run the core too).
  /// Frames staged for the socket meanwhile (link_lane::write_now) are sent once the lock is
  /// released.
  template <class Body>
  void serve(std::string_view what, Body&& body, completion<status>* call = nullptr) {
    {
      std::unique_lock<std::mutex> hold;
      if (lane_)
        hold = std::unique_lock<std::mutex>{lane_->mutex()};
      guarded(what, std::forward<Body>(body), call);
    }
    link_lane::send_staged();
  }

  /// Runs a use of the core so that nothing it throws escapes the actor: the call it served (if
  /// any) fails naming what was being done. Frames that left meanwhile from this thread (written
  /// to the socket at once) are settled here, which may send more.
  template <class Body>
  void guarded(std::string_view what, Body&& body, completion<status>* call = nullptr) {
    // The caller waited for the engine's queued uses of a request's arrays before handing them
    // over, and a lane's task may be waiting for this request (actors/gluon/trainer.cpp).
    engine::on_behalf_of_lane_scope owned;
    receipts_here here{static_cast<const void*>(this), {}};
    auto* outer = std::exchange(settling, &here);
    const status outcome = status_of([&]() -> status {
      body();
      while (!here.left.empty()) {
        auto left = std::move(here.left);
        here.left.clear();
        for (const auto& receipt : left)
          core_->frame_left(receipt);
      }
      return ok();
    });
    settling = outer;
    if (!outcome) {
      options_.log.error(std::string{what} + ": " + outcome.error().to_string());
      if (call)
        call->deliver(
            error{outcome.error().code(), std::string{what} + ": " + outcome.error().message()});
    }
  }

  void on_link_down(std::uint64_t tag, const std::string& why) {
    if (auto refusal = handshake_refusal(why))
      return core_->on_refused(tag, *refusal);
    const bool current =
        tag > 0 && tag <= links_.size() &&
        self_->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(links_[tag - 1]);
    core_->on_link_down(tag, why, current);
  }

  void on_relink(server_relink& relink) {
    switch (core_->on_relink(relink.server, relink.link.has_value(), relink.name, relink.problem)) {
    case worker_core::relink_step::ignore:
      return;
    case worker_core::relink_step::close_new_link:
      if (relink.link)
        self_->send(*relink.link, stop_atom::value);
      return;
    case worker_core::relink_step::install:
      if (relink.server >= links_.size()) {
        // A server that joined the running job: its first link.
        links_.resize(relink.server + 1);
        link_lanes_.resize(relink.server + 1);
      } else if (links_[relink.server]) {
        self_->send(links_[relink.server], stop_atom::value);
      }
      links_[relink.server] = *relink.link;
      link_lanes_[relink.server] = nullptr; // a relinked server's frames go as messages
      core_->server_back(relink.server, relink.name);
      return;
    }
  }

  void schedule_tick() { self_->delayed_send(self_, core_->tick_interval(), tick_atom::value); }

  pointer self_ = nullptr;
  kv_worker_options options_;
  /// Declared after what it uses through output (links_, copier_...): destroyed first, so that
  /// its destructor, which ends every call still under way, runs while they exist.
  reply_copier_actor copier_;
  std::vector<link_actor> links_;
  /// Per link, its lane (null: none).
  std::vector<std::shared_ptr<link_lane>> link_lanes_;
  /// Shared with the facade (kv_worker_options::lane); its lock guards everything here.
  std::shared_ptr<worker_lane> lane_;
  /// The core runs on a caller's thread (run_here).
  bool on_caller_thread_ = false;
  std::optional<worker_core> core_;
};

template <class Base>
worker_actor::behavior_type worker_behavior(typename worker_state<Base>::pointer self,
                                            kv_worker_options options) {
  return self->state.start(self, std::move(options));
}

} // namespace

void worker_lane::call(kv_operation op) {
  // A call too large to run here goes to the actor without the lock, which the I/O thread may
  // hold for a reply's copy of hundreds of kilobytes (a caller waited 80-110 µs for it).
  if (handed_.load(std::memory_order_relaxed) == 0 &&
      worker_core::small_enough_to_send_at_once(op, call_here_bytes)) {
    bool ran = false;
    {
      std::lock_guard hold{mutex_};
      // With the lock held the actor runs nothing, and it lowers handed_ under the lock: 0 here
      // means it has handled every call handed to it, so this one overtakes none.
      ran = runner_ && handed_.load(std::memory_order_relaxed) == 0 && runner_(op);
    }
    // Its frame, staged for the socket, goes now that the worker's lock is free.
    link_lane::send_staged();
    if (ran)
      return;
  }
  handed_.fetch_add(1, std::memory_order_relaxed);
  if (auto actor = caf::actor_cast<worker_actor>(actor_))
    caf::anon_send(actor, handed_atom::value, std::move(op));
  else
    op.done.deliver(error{errc::peer_lost, op.what + ": the KVStore worker stopped"});
}

void worker_lane::set_actor(const worker_actor& actor) {
  std::lock_guard hold{mutex_};
  actor_ = actor.address();
}

worker_actor spawn_kv_worker(caf::actor_system& system, kv_worker_options options) {
  if (!options.lane)
    options.lane = std::make_shared<worker_lane>();
  auto lane = options.lane;
  worker_actor worker;
  if (system.has_middleman())
    worker =
        system.middleman().spawn_broker(worker_behavior<worker_on_io_thread>, std::move(options));
  else
    worker = system.spawn(worker_behavior<worker_on_scheduler>, std::move(options));
  lane->set_actor(worker);
  return worker;
}

} // namespace troupe
