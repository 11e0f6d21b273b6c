// apps/slurm_tasks: Slurm's compressed node lists and which node each srun task becomes.

#include <map>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "apps/slurm_tasks.hpp"

using troupe::node_role;
using troupe::launch::expand_nodelist;
using troupe::launch::place_slurm_task;
using strings = std::vector<std::string>;

namespace {

/// The message of `list`'s error, or "" when it expands.
std::string error_of(const std::string& list, std::size_t max_hosts = 65536) {
  auto hosts = expand_nodelist(list, max_hosts);
  return hosts ? std::string() : hosts.error().message();
}

bool holds(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The variables srun gives task `procid` of `ntasks`, plus `more`.
troupe::env_lookup task_env(int procid, int ntasks, std::map<std::string, std::string> more = {}) {
  std::map<std::string, std::string, std::less<>> env{{"SLURM_PROCID", std::to_string(procid)},
                                                      {"SLURM_NTASKS", std::to_string(ntasks)},
                                                      {"SLURM_STEP_NODELIST", "node[01-02],gpu3"},
                                                      {"SLURM_JOB_NODELIST", "other[1-9]"},
                                                      {"SLURM_JOB_ID", "123456"}};
  for (auto& [k, v] : more)
    env[k] = v;
  return troupe::environment_from(std::move(env));
}

} // namespace

BOOST_AUTO_TEST_SUITE(slurm_nodelist)

BOOST_AUTO_TEST_CASE(ranges_lists_padding_and_several_groups_expand_in_slurm_s_order) {
  const std::map<std::string, strings> cases{
      {"node[01-04,07],gpu3", {"node01", "node02", "node03", "node04", "node07", "gpu3"}},
      {"127.0.0.1", {"127.0.0.1"}},
      {"localhost,127.0.0.1", {"localhost", "127.0.0.1"}},
      {"a[8-10]", {"a8", "a9", "a10"}},
      {"a[08-10]", {"a08", "a09", "a10"}},
      {"a[5]", {"a5"}},
      {"r[1-2]n[1-2]", {"r1n1", "r1n2", "r2n1", "r2n2"}},
      {"n[1-2]-ib,x_y.z", {"n1-ib", "n2-ib", "x_y.z"}},
      {"[1-2]", {"1", "2"}},
  };
  for (const auto& [list, expected] : cases) {
    auto hosts = expand_nodelist(list);
    BOOST_TEST_REQUIRE(hosts.has_value(), list << ": " << error_of(list));
    BOOST_TEST(*hosts == expected, list);
  }
}

BOOST_AUTO_TEST_CASE(a_broken_list_is_one_line_naming_the_list_and_the_fault) {
  const std::map<std::string, std::string> cases{
      {"", "node list is empty"},
      {"node[1-2", "'[' at position 4 is not closed"},
      {"n[1[2]]", "'[' at position 1 is not closed"},
      {"node1-2]", "']' at position 7 closes nothing"},
      {"node[]", "empty brackets"},
      {"node[3-1]", "range \"3-1\" runs backwards"},
      {"node[a-b]", "\"a-b\" in brackets is not a number"},
      {"node[1-]", "\"1-\" in brackets is not a number"},
      {"node[1,,2]", "\"\" in brackets is not a number"},
      {"n[1234567890]", "at most 9 digits"},
      {"a,,b", "empty name at position 2"},
      {"a,", "empty name at position 2"},
      {"no de", "character ' ' at position 2"},
      {"a:b", "character ':' at position 1"},
  };
  for (const auto& [list, expected] : cases) {
    const auto message = error_of(list);
    BOOST_TEST(holds(message, expected), list << " -> " << message);
    if (!list.empty())
      BOOST_TEST(message.starts_with("node list \"" + list + "\""), message);
    BOOST_TEST(!holds(message, "\n"), message);
  }
}

BOOST_AUTO_TEST_CASE(the_bound_on_names_holds_before_they_are_made) {
  BOOST_TEST(expand_nodelist("n[0-65535]")->size() == 65536u);
  BOOST_TEST(holds(error_of("n[0-65536]"), "names more than 65536 hosts"));
  BOOST_TEST(holds(error_of("a,n[0-65535]"), "names more than 65536 hosts"));
  // A product of groups a billion names large is refused at once, as is a range as long.
  BOOST_TEST(holds(error_of("a[0-99999]b[0-99999]"), "names more than 65536 hosts"));
  BOOST_TEST(holds(error_of("a[0-999999999]"), "names more than 65536 hosts"));
  BOOST_TEST(expand_nodelist("a[1-2]b[1-5]", 10)->size() == 10u);
  BOOST_TEST(holds(error_of("a[1-2]b[1-5],c", 10), "names more than 10 hosts"));
  BOOST_TEST(holds(error_of("c,a[1-2]b[1-5]", 10), "names more than 10 hosts"));
  // A long list is shown cut in the message.
  const std::string long_list = "n[1-2" + std::string(500, '0');
  BOOST_TEST(error_of(long_list).size() < 250u);
}

BOOST_AUTO_TEST_CASE(task_0_is_the_scheduler_then_the_servers_then_the_workers) {
  // -n 3 -s 2: six tasks.
  const std::vector<std::pair<node_role, int>> expected{
      {node_role::scheduler, 0}, {node_role::server, 0}, {node_role::server, 1},
      {node_role::worker, 0},    {node_role::worker, 1}, {node_role::worker, 2}};
  for (int procid = 0; procid < 6; ++procid) {
    auto task = place_slurm_task(task_env(procid, 6, {{"SLURMD_NODENAME", "node01"}}), 3, 2);
    BOOST_TEST_REQUIRE(task.has_value(), procid);
    BOOST_TEST((task->role == expected[procid].first), procid);
    BOOST_TEST(task->index == expected[procid].second, procid);
    // The step's list, not the job's.
    BOOST_TEST(task->scheduler_host == "node01");
    BOOST_TEST(task->node_name == "node01");
    BOOST_TEST(task->job_port.value_or(0) == 20000 + 123456 % 10000);
  }
  auto without_step = place_slurm_task(
      troupe::environment_from(
          {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "3"}, {"SLURM_JOB_NODELIST", "c[7-8]"}}),
      1, 1);
  BOOST_TEST_REQUIRE(without_step.has_value());
  BOOST_TEST(without_step->scheduler_host == "c7");
  BOOST_TEST(!without_step->job_port.has_value());
  BOOST_TEST(without_step->node_name.empty());
}

BOOST_AUTO_TEST_CASE(a_task_outside_a_fitting_srun_is_refused_naming_the_variable) {
  auto message = [](const troupe::env_lookup& env) {
    auto task = place_slurm_task(env, 2, 1);
    return task ? std::string() : task.error().message();
  };
  BOOST_TEST(holds(message(troupe::environment_from({{"SLURM_NTASKS", "4"}})),
                   "SLURM_PROCID is not set; run troupe-launch under srun"));
  BOOST_TEST(holds(message(task_env(0, 5)), "srun started 5 tasks (SLURM_NTASKS), but -n 2 -s 1 "
                                            "needs 4: one scheduler, 1 servers and 2 workers "
                                            "(srun -n 4)"));
  BOOST_TEST(holds(message(task_env(4, 4)), "SLURM_PROCID 4 is not below SLURM_NTASKS 4"));
  BOOST_TEST(holds(message(task_env(0, 4, {{"SLURM_PROCID", "x1"}})),
                   "SLURM_PROCID is \"x1\", not a non-negative integer"));
  BOOST_TEST(holds(message(task_env(0, 4, {{"SLURM_JOB_ID", "-3"}})), "SLURM_JOB_ID is \"-3\""));
  BOOST_TEST(holds(message(task_env(0, 4, {{"SLURM_STEP_NODELIST", "n[2-1]"}})),
                   "SLURM_STEP_NODELIST: node list \"n[2-1]\": range \"2-1\" runs backwards"));
  BOOST_TEST(
      holds(message(troupe::environment_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}})),
            "none of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, SLURM_NODELIST is set"));
  BOOST_TEST(holds(message(task_env(0, 4, {{"SLURMD_NODENAME", "node02"}})),
                   "task 0 (the scheduler) runs on node02, but the first node of "
                   "SLURM_STEP_NODELIST is node01"));
  // Only task 0 must sit on the first node.
  BOOST_TEST(message(task_env(1, 4, {{"SLURMD_NODENAME", "node02"}})).empty());
}

BOOST_AUTO_TEST_SUITE_END()
