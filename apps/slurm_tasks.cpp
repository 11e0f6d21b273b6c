#include "apps/slurm_tasks.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace troupe::launch {

namespace {

/// `list` as a message shows it: whole, or its first 120 characters when it is longer.
std::string shown(std::string_view list) {
  constexpr std::size_t most = 120;
  return "\"" + std::string(list.substr(0, most)) + (list.size() > most ? "...\"" : "\"");
}

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

/// A number of 1 to 9 digits, or nullopt.
std::optional<std::uint32_t> bound(std::string_view text) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  std::uint32_t value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

/// `value` in decimal, padded with zeros to `width` digits.
std::string padded(std::uint32_t value, std::size_t width) {
  std::string digits = std::to_string(value);
  return std::string(width > digits.size() ? width - digits.size() : 0, '0') + digits;
}

/// The numbers of one bracket group's text ("01-04,07"), each as its name part, at most `room`.
result<std::vector<std::string>> expand_group(std::string_view group, std::string_view list,
                                              std::size_t room, std::size_t max_hosts) {
  if (group.empty())
    return error{errc::invalid_argument, "node list " + shown(list) + ": empty brackets"};
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= group.size()) {
    const auto end = std::min(group.find(',', begin), group.size());
    const auto range = group.substr(begin, end - begin);
    const auto dash = range.find('-');
    const auto low_text = range.substr(0, dash);
    const auto high_text = dash == std::string_view::npos ? low_text : range.substr(dash + 1);
    const auto low = bound(low_text);
    const auto high = bound(high_text);
    if (!low || !high)
      return error{errc::invalid_argument,
                   "node list " + shown(list) + ": \"" + std::string(range) +
                       "\" in brackets is not a number or a range of numbers (at most 9 digits)"};
    if (*high < *low)
      return error{errc::invalid_argument, "node list " + shown(list) + ": range \"" +
                                               std::string(range) + "\" runs backwards"};
    if (*high - *low >= room - parts.size())
      return error{errc::invalid_argument, "node list " + shown(list) + " names more than " +
                                               std::to_string(max_hosts) + " hosts"};
    for (std::uint32_t n = *low;; ++n) {
      parts.push_back(padded(n, low_text.size()));
      if (n == *high)
        break;
    }
    begin = end + 1;
  }
  return parts;
}

} // namespace

result<std::vector<std::string>> expand_nodelist(std::string_view list, std::size_t max_hosts) {
  if (list.empty())
    return error{errc::invalid_argument, "node list is empty"};
  std::vector<std::string> hosts;
  std::size_t at = 0;
  while (at <= list.size()) {
    // One name: literal parts and bracket groups up to a comma outside brackets. Each segment is
    // its alternatives; the name expands to every combination, the first segment outermost.
    std::vector<std::vector<std::string>> segments;
    std::string literal;
    std::size_t combinations = 1;
    const std::size_t room = max_hosts - hosts.size();
    for (; at < list.size() && list[at] != ','; ++at) {
      const char c = list[at];
      if (c == '[') {
        const auto close = list.find(']', at);
        const auto next_open = list.find('[', at + 1);
        if (close == std::string_view::npos || next_open < close)
          return error{errc::invalid_argument, "node list " + shown(list) + ": '[' at position " +
                                                   std::to_string(at) + " is not closed"};
        if (!literal.empty())
          segments.push_back({std::move(literal)});
        literal.clear();
        auto group = expand_group(list.substr(at + 1, close - at - 1), list, room, max_hosts);
        if (!group)
          return group.error();
        if (group->size() > room / combinations)
          return error{errc::invalid_argument, "node list " + shown(list) + " names more than " +
                                                   std::to_string(max_hosts) + " hosts"};
        combinations *= group->size();
        segments.push_back(std::move(*group));
        at = close;
      } else if (c == ']') {
        return error{errc::invalid_argument, "node list " + shown(list) + ": ']' at position " +
                                                 std::to_string(at) + " closes nothing"};
      } else if (is_name_char(c)) {
        literal += c;
      } else {
        return error{errc::invalid_argument,
                     "node list " + shown(list) + ": character '" + std::string(1, c) +
                         "' at position " + std::to_string(at) + " is not part of a host name"};
      }
    }
    if (!literal.empty())
      segments.push_back({std::move(literal)});
    if (segments.empty())
      return error{errc::invalid_argument,
                   "node list " + shown(list) + ": empty name at position " + std::to_string(at)};
    if (combinations > room)
      return error{errc::invalid_argument, "node list " + shown(list) + " names more than " +
                                               std::to_string(max_hosts) + " hosts"};
    // Every combination, as an odometer whose last digit turns fastest.
    std::vector<std::size_t> digit(segments.size(), 0);
    for (std::size_t made = 0; made < combinations; ++made) {
      std::string name;
      for (std::size_t s = 0; s < segments.size(); ++s)
        name += segments[s][digit[s]];
      hosts.push_back(std::move(name));
      for (std::size_t s = segments.size(); s-- > 0;) {
        if (++digit[s] < segments[s].size())
          break;
        digit[s] = 0;
      }
    }
    ++at; // past the comma, or past the end
  }
  return hosts;
}

std::uint16_t slurm_job_port(std::uint64_t job_id) noexcept {
  return static_cast<std::uint16_t>(20000 + job_id % 10000);
}

namespace {

/// The non-negative integer in variable `name`, or an error naming it.
result<std::uint64_t> counter(const env_lookup& env, std::string_view name) {
  const auto value = env(name);
  if (!value)
    return error{errc::invalid_argument,
                 "--launcher slurm: " + std::string(name) +
                     " is not set; run troupe-launch under srun, one task per node of the job"};
  std::uint64_t number = 0;
  const auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), number);
  if (value->empty() || ec != std::errc{} || end != value->data() + value->size())
    return error{errc::invalid_argument, "--launcher slurm: " + std::string(name) + " is \"" +
                                             *value + "\", not a non-negative integer"};
  return number;
}

} // namespace

result<slurm_task> place_slurm_task(const env_lookup& env, int num_workers, int num_servers) {
  auto procid = counter(env, "SLURM_PROCID");
  if (!procid)
    return procid.error();
  auto ntasks = counter(env, "SLURM_NTASKS");
  if (!ntasks)
    return ntasks.error();
  const auto needed = 1 + static_cast<std::uint64_t>(num_servers) + num_workers;
  if (*ntasks != needed)
    return error{errc::invalid_argument,
                 "--launcher slurm: srun started " + std::to_string(*ntasks) +
                     " tasks (SLURM_NTASKS), but -n " + std::to_string(num_workers) + " -s " +
                     std::to_string(num_servers) + " needs " + std::to_string(needed) +
                     ": one scheduler, " + std::to_string(num_servers) + " servers and " +
                     std::to_string(num_workers) + " workers (srun -n " + std::to_string(needed) +
                     ")"};
  if (*procid >= *ntasks)
    return error{errc::invalid_argument,
                 "--launcher slurm: SLURM_PROCID " + std::to_string(*procid) +
                     " is not below SLURM_NTASKS " + std::to_string(*ntasks)};

  std::optional<std::string> list;
  std::string list_variable;
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if ((list = env(name))) {
      list_variable = name;
      break;
    }
  if (!list)
    return error{errc::invalid_argument, "--launcher slurm: none of SLURM_STEP_NODELIST, "
                                         "SLURM_JOB_NODELIST, SLURM_NODELIST is set"};
  auto nodes = expand_nodelist(*list);
  if (!nodes)
    return error{errc::invalid_argument,
                 "--launcher slurm: " + list_variable + ": " + nodes.error().message()};

  slurm_task task;
  task.scheduler_host = nodes->front();
  task.node_name = env("SLURMD_NODENAME").value_or("");
  const auto rank = static_cast<int>(*procid);
  if (rank == 0) {
    task.role = node_role::scheduler;
    if (!task.node_name.empty() && task.node_name != task.scheduler_host)
      return error{errc::invalid_argument,
                   "--launcher slurm: task 0 (the scheduler) runs on " + task.node_name +
                       ", but the first node of " + list_variable + " is " + task.scheduler_host +
                       ", where the other tasks look for it; start srun with its default block "
                       "distribution (--distribution=block)"};
  } else if (rank <= num_servers) {
    task.role = node_role::server;
    task.index = rank - 1;
  } else {
    task.role = node_role::worker;
    task.index = rank - 1 - num_servers;
  }
  if (env("SLURM_JOB_ID")) {
    auto id = counter(env, "SLURM_JOB_ID");
    if (!id)
      return id.error();
    task.job_port = slurm_job_port(*id);
  }
  return task;
}

} // namespace troupe::launch
