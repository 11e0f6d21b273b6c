#pragma once
// Kubernetes for troupe-launch: `troupe-launch --emit k8s --image IMAGE -n W -s S -- COMMAND`
// writes the manifests of a job instead of starting it, for `kubectl apply -f`:
//
//   ConfigMap  NAME-config     the cluster file of --config, mounted at /etc/troupe (TROUPE_CONFIG)
//   Service    NAME-scheduler  the scheduler's address (DMLC_PS_ROOT_URI) and port
//   Job        NAME-scheduler  one pod: troupe-node --role scheduler --bind 0.0.0.0
//   Job        NAME-server     S pods (an Indexed Job): troupe-node --role server
//   Job        NAME-worker     W pods (an Indexed Job): COMMAND
//
// Every pod gets the DMLC_* variables of a job, the --env pairs, and TROUPE_JOB_TOKEN from a
// Secret (key "token") that the manifests only name: the token is never written into them.
// Servers and workers take their rank hint from their Job's completion index and give peers
// their pod's IP (DMLC_NODE_HOST). Every Job has backoffLimit 0 and pods restartPolicy Never: a
// failed node fails the job, as troupe-launch's own jobs do, instead of coming back as a new
// node that the scheduler would not know.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/error.hpp"

namespace troupe::launch {

/// A job to write the manifests of.
struct k8s_job {
  /// Prefix of every object's name and the value of the troupe-job label: a DNS label of at most
  /// 40 characters (lowercase letters, digits, '-'; a letter first), so the suffixes fit.
  std::string name = "troupe";
  /// The container image of every pod: it holds troupe-node and the worker program.
  std::string image;
  /// The Secret holding the job token under the key "token"; empty: NAME-token.
  std::string secret;
  int num_workers = 1;
  int num_servers = 1;
  std::uint16_t port = 9091;
  std::optional<int> quorum;
  /// troupe-node as the image has it (a path, or a name on its PATH).
  std::string node_binary = "troupe-node";
  /// The worker program and its arguments.
  std::vector<std::string> command;
  /// NAME=VALUE pairs: for every pod, then for servers or workers only (a later one wins).
  std::vector<std::string> every_node_env;
  std::vector<std::string> server_env;
  std::vector<std::string> worker_env;
  /// The cluster file's text, for the ConfigMap; nullopt: none.
  std::optional<std::string> config_text;
};

/// Where the ConfigMap's cluster file appears in every pod (TROUPE_CONFIG).
inline constexpr const char* k8s_config_path = "/etc/troupe/cluster.toml";

/// The manifests of `job` as one YAML stream (documents separated by "---"), every string value
/// double-quoted. Errors (errc::invalid_argument, one line naming the field): a name, secret or
/// image Kubernetes would refuse, no command, an env pair without '=', text that is not UTF-8.
result<std::string> k8s_manifests(const k8s_job& job);

} // namespace troupe::launch
