#include "actors/logic/job_trace.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

namespace troupe {

namespace {

// A node file is one JSON object laid out one event per line, so that merging copies lines
// instead of building a document of millions of events:
//   {"traceEvents":[
//   {event},
//   ...
//   {event}
//   ],"otherData":{...}}
constexpr std::string_view file_head = "{\"traceEvents\":[";
constexpr std::string_view file_tail_start = "],\"otherData\":";

std::int64_t process_id(std::string_view role, std::int64_t rank) {
  if (role == "scheduler")
    return 1;
  if (role == "server")
    return 1000 + std::max<std::int64_t>(rank, 0);
  if (role == "worker")
    return 2000 + std::max<std::int64_t>(rank, 0);
  return 3000;
}

std::string node_label(std::string_view role, std::int64_t rank) {
  return rank < 0 ? std::string{role} : fmt::format("{}-{}", role, rank);
}

struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

} // namespace

job_trace& job_trace::process() noexcept {
  static job_trace trace;
  return trace;
}

std::int64_t job_trace::now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void job_trace::start(std::string file_prefix, std::size_t max_events) {
  std::lock_guard lock{mutex_};
  prefix_ = std::move(file_prefix);
  max_events_ = max_events;
  spans_.reserve(std::min<std::size_t>(max_events_, 65'536));
  enabled_.store(true, std::memory_order_relaxed);
}

void job_trace::set_node(std::string role, std::int64_t rank) {
  std::lock_guard lock{mutex_};
  role_ = std::move(role);
  rank_ = rank;
}

void job_trace::record(const trace_span& span) noexcept {
  if (!enabled())
    return;
  std::lock_guard lock{mutex_};
  if (spans_.size() >= max_events_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  try {
    spans_.push_back(span);
  } catch (...) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

std::string job_trace::file() const {
  std::lock_guard lock{mutex_};
  return prefix_.empty() ? std::string{} : prefix_ + "." + node_label(role_, rank_);
}

std::size_t job_trace::size() const {
  std::lock_guard lock{mutex_};
  return spans_.size();
}

void job_trace::reset() {
  std::lock_guard lock{mutex_};
  enabled_.store(false, std::memory_order_relaxed);
  spans_.clear();
  prefix_.clear();
  role_ = "node";
  rank_ = -1;
  dropped_.store(0, std::memory_order_relaxed);
}

result<std::string> job_trace::write() const {
  std::lock_guard lock{mutex_};
  if (prefix_.empty())
    return error{errc::invalid_argument, "the job trace was not started (observe.trace)"};
  const auto path = prefix_ + "." + node_label(role_, rank_);
  const auto temporary = path + ".partial";
  std::unique_ptr<std::FILE, file_closer> out{std::fopen(temporary.c_str(), "w")};
  if (!out)
    return error{errc::io_error, "cannot write the trace file " + temporary};
  const auto pid = process_id(role_, rank_);
  const auto label = node_label(role_, rank_);
  fmt::memory_buffer text;
  fmt::format_to(std::back_inserter(text), "{}\n", file_head);
  fmt::format_to(std::back_inserter(text),
                 "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"tid\":0,\"args\":{{"
                 "\"name\":\"{}\"}}}},\n"
                 "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{},\"tid\":0,"
                 "\"args\":{{\"sort_index\":{}}}}}",
                 pid, label, pid, pid);
  std::uint64_t id = 0;
  for (const auto& span : spans_) {
    ++id;
    // Both halves carry the args: viewers show the begin's, scripts need not pair them first.
    auto args = fmt::format("{{\"key\":{},\"round\":{},\"peer\":{},\"bytes\":{}}}", span.key,
                            span.round, span.peer, span.bytes);
    for (int half = 0; half < 2; ++half)
      fmt::format_to(std::back_inserter(text),
                     ",\n{{\"ph\":\"{}\",\"cat\":\"{}\",\"name\":\"{}\",\"id2\":{{\"local\":\"{:#x}"
                     "\"}},\"pid\":{},\"tid\":0,\"ts\":{},\"args\":{}}}",
                     half == 0 ? 'b' : 'e', role_, span.name, id, pid,
                     half == 0 ? span.start_us : std::max(span.end_us, span.start_us), args);
    if (text.size() > (1u << 20)) {
      if (std::fwrite(text.data(), 1, text.size(), out.get()) != text.size())
        return error{errc::io_error, "cannot write the trace file " + temporary};
      text.clear();
    }
  }
  fmt::format_to(std::back_inserter(text),
                 "\n{}{{\"node\":\"{}\",\"spans\":{},\"dropped_spans\":{}}}}}\n", file_tail_start,
                 label, spans_.size(), dropped());
  if (std::fwrite(text.data(), 1, text.size(), out.get()) != text.size() ||
      std::fflush(out.get()) != 0)
    return error{errc::io_error, "cannot write the trace file " + temporary};
  out.reset();
  std::error_code failed;
  std::filesystem::rename(temporary, path, failed);
  if (failed)
    return error{errc::io_error,
                 "cannot rename " + temporary + " to " + path + ": " + failed.message()};
  return path;
}

status merge_trace_files(const std::string& output, std::span<const std::string> parts) {
  if (parts.empty())
    return error{errc::invalid_argument, "no node trace files to merge into " + output};
  std::vector<std::string> events;
  nlohmann::json nodes = nlohmann::json::array();
  std::uint64_t dropped = 0;
  for (const auto& part : parts) {
    {
      std::ifstream check{part};
      if (!check)
        return error{errc::io_error, "cannot read the trace file " + part};
      if (!nlohmann::json::accept(check))
        return error{errc::invalid_argument, part + " is not JSON (a node trace file torn?)"};
    }
    std::ifstream in{part};
    std::string line;
    if (!std::getline(in, line) || line != file_head)
      return error{errc::invalid_argument, part + " is not a troupe node trace file"};
    bool ended = false;
    while (std::getline(in, line)) {
      if (line.starts_with(file_tail_start)) {
        // The line ends with the file's own closing brace after otherData's.
        auto text = line.substr(file_tail_start.size());
        if (!text.empty() && text.back() == '}')
          text.pop_back();
        auto other = nlohmann::json::parse(text, nullptr, false);
        if (other.is_discarded() || !other.is_object())
          return error{errc::invalid_argument, part + ": its otherData is not an object"};
        nodes.push_back(other.value("node", std::string{"?"}));
        dropped += other.value("dropped_spans", std::uint64_t{0});
        ended = true;
        break;
      }
      if (!line.empty() && line.back() == ',')
        line.pop_back();
      events.push_back(std::move(line));
    }
    if (!ended)
      return error{errc::invalid_argument, part + " ends before its otherData (torn?)"};
  }
  const auto temporary = output + ".partial";
  {
    std::ofstream out{temporary, std::ios::trunc};
    if (!out)
      return error{errc::io_error, "cannot write the trace file " + temporary};
    out << file_head << '\n';
    for (std::size_t i = 0; i < events.size(); ++i)
      out << events[i] << (i + 1 < events.size() ? ",\n" : "\n");
    nlohmann::json other{{"nodes", nodes}, {"dropped_spans", dropped}};
    out << file_tail_start << other.dump() << "}\n";
    if (!out.flush())
      return error{errc::io_error, "cannot write the trace file " + temporary};
  }
  std::error_code failed;
  std::filesystem::rename(temporary, output, failed);
  if (failed)
    return error{errc::io_error,
                 "cannot rename " + temporary + " to " + output + ": " + failed.message()};
  return ok();
}

std::vector<std::string> node_trace_files(const std::string& file_prefix) {
  namespace fs = std::filesystem;
  const fs::path prefix{file_prefix};
  const auto dir = prefix.has_parent_path() ? prefix.parent_path() : fs::path{"."};
  const auto stem = prefix.filename().string() + ".";
  std::vector<std::string> found;
  std::error_code failed;
  for (const auto& entry : fs::directory_iterator{dir, failed}) {
    const auto name = entry.path().filename().string();
    if (!name.starts_with(stem) || name.ends_with(".partial"))
      continue;
    const auto node = std::string_view{name}.substr(stem.size());
    if (node.starts_with("scheduler") || node.starts_with("server-") || node.starts_with("worker-"))
      found.push_back((dir / name).string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

} // namespace troupe
