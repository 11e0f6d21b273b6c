#include "apps/k8s_manifests.hpp"

#include <algorithm>
#include <regex>

#include "engine/json_line.hpp"

namespace troupe::launch {

namespace {

using object = json_line::object;

/// A YAML scalar: a string as a JSON string (a YAML double-quoted scalar, every character
/// escaped that needs it), anything else as JSON writes it. Throws on text that is not UTF-8.
std::string scalar(const object& value) {
  return value.dump(-1, ' ', true);
}

/// A mapping key: as it is when it is plainly a word, else quoted.
std::string key_text(const std::string& key) {
  static const std::regex plain{"[A-Za-z_][A-Za-z0-9_./-]*"};
  return std::regex_match(key, plain) ? key : scalar(object(key));
}

/// `value` as block YAML at `indent` spaces, into `out`.
void write_yaml(std::string& out, const object& value, std::size_t indent) {
  const std::string pad(indent, ' ');
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      out += pad + key_text(key) + ":";
      if ((item.is_object() || item.is_array()) && !item.empty()) {
        out += "\n";
        write_yaml(out, item, indent + 2);
      } else {
        out += " " +
               (item.is_object()  ? std::string("{}")
                : item.is_array() ? std::string("[]")
                                  : scalar(item)) +
               "\n";
      }
    }
    return;
  }
  for (const auto& item : value) {
    if (item.is_object() && !item.empty()) {
      // "- " takes the place of the first key's indentation.
      std::string nested;
      write_yaml(nested, item, indent + 2);
      nested.replace(indent, 2, "- ");
      out += nested;
    } else {
      out += pad + "- " + scalar(item) + "\n";
    }
  }
}

status check_name(const std::string& what, const std::string& value, const std::regex& form,
                  std::size_t most, const std::string& rule) {
  if (value.size() > most || !std::regex_match(value, form))
    return error{errc::invalid_argument, what + " \"" + value + "\": Kubernetes needs " + rule +
                                             ", at most " + std::to_string(most) + " characters"};
  return {};
}

/// An env list entry of a container.
object env_value(const std::string& name, const std::string& value) {
  return object{{"name", name}, {"value", value}};
}

object env_from_field(const std::string& name, const std::string& field) {
  return object{{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", field}}}}}};
}

/// `pairs` (NAME=VALUE) onto `env`: a name already there gets the new value in its place, so
/// that every name appears once and a later layer wins.
void add_pairs(object& env, const std::vector<std::string>& pairs) {
  for (const auto& pair : pairs) {
    const auto eq = pair.find('=');
    const auto name = pair.substr(0, eq);
    auto entry = env_value(name, pair.substr(eq + 1));
    auto same =
        std::find_if(env.begin(), env.end(), [&](const object& e) { return e["name"] == name; });
    if (same != env.end())
      *same = std::move(entry);
    else
      env.push_back(std::move(entry));
  }
}

object labels(const k8s_job& job, std::optional<std::string> role) {
  object l{{"app.kubernetes.io/name", "troupe"}, {"troupe-job", job.name}};
  if (role)
    l["troupe-role"] = *role;
  return l;
}

/// The Job of `role`: `count` pods (Indexed when it is a server or worker Job) running `command`.
object job_object(const k8s_job& job, const std::string& role, int count,
                  const std::vector<std::string>& command, object env) {
  object container{{"name", role}, {"image", job.image}, {"command", command}};
  if (role == "scheduler")
    container["ports"] = object::array({{{"name", "scheduler"}, {"containerPort", job.port}}});
  container["env"] = std::move(env);
  object pod_spec{{"restartPolicy", "Never"}};
  if (job.config_text) {
    container["volumeMounts"] = object::array(
        {{{"name", "troupe-config"}, {"mountPath", "/etc/troupe"}, {"readOnly", true}}});
    pod_spec["volumes"] = object::array(
        {{{"name", "troupe-config"}, {"configMap", {{"name", job.name + "-config"}}}}});
  }
  pod_spec["containers"] = object::array({std::move(container)});
  object spec{{"backoffLimit", 0}};
  if (role != "scheduler")
    spec.update(
        object{{"completionMode", "Indexed"}, {"completions", count}, {"parallelism", count}});
  spec["template"] = object{{"metadata", {{"labels", labels(job, role)}}}, {"spec", pod_spec}};
  return object{{"apiVersion", "batch/v1"},
                {"kind", "Job"},
                {"metadata", {{"name", job.name + "-" + role}, {"labels", labels(job, role)}}},
                {"spec", std::move(spec)}};
}

} // namespace

result<std::string> k8s_manifests(const k8s_job& job) {
  static const std::regex label{"[a-z]([-a-z0-9]*[a-z0-9])?"};
  static const std::regex subdomain{"[a-z0-9]([-a-z0-9.]*[a-z0-9])?"};
  if (auto ok = check_name("--name", job.name, label, 40,
                           "lowercase letters, digits and '-', a letter first and no '-' last");
      !ok)
    return ok.error();
  const std::string secret = job.secret.empty() ? job.name + "-token" : job.secret;
  if (auto ok = check_name("--k8s-secret", secret, subdomain, 253,
                           "lowercase letters, digits, '-' and '.', a letter or digit at each end");
      !ok)
    return ok.error();
  if (job.image.empty() || std::any_of(job.image.begin(), job.image.end(), [](char c) {
        return std::isspace(static_cast<unsigned char>(c)) != 0;
      }))
    return error{errc::invalid_argument,
                 "--image \"" + job.image + "\": an image reference without blanks is needed"};
  if (job.command.empty())
    return error{errc::invalid_argument, "no worker command"};
  for (const auto* pairs : {&job.every_node_env, &job.server_env, &job.worker_env})
    for (const auto& pair : *pairs)
      if (pair.find('=') == std::string::npos || pair.front() == '=')
        return error{errc::invalid_argument, "env pair \"" + pair + "\" is not NAME=VALUE"};

  const std::string scheduler_name = job.name + "-scheduler";
  object common = object::array();
  common.push_back(env_value("DMLC_PS_ROOT_URI", scheduler_name));
  common.push_back(env_value("DMLC_PS_ROOT_PORT", std::to_string(job.port)));
  common.push_back(env_value("DMLC_NUM_WORKER", std::to_string(job.num_workers)));
  common.push_back(env_value("DMLC_NUM_SERVER", std::to_string(job.num_servers)));
  if (job.quorum)
    common.push_back(env_value("TROUPE_QUORUM", std::to_string(*job.quorum)));
  if (job.config_text)
    common.push_back(env_value("TROUPE_CONFIG", k8s_config_path));
  common.push_back(object{{"name", "TROUPE_JOB_TOKEN"},
                          {"valueFrom", {{"secretKeyRef", {{"name", secret}, {"key", "token"}}}}}});
  add_pairs(common, job.every_node_env);

  auto role_env = [&](const std::string& role, const std::vector<std::string>& pairs) {
    object env = common;
    add_pairs(env, pairs);
    env.push_back(env_value("DMLC_ROLE", role));
    if (role != "scheduler") {
      env.push_back(env_from_field(
          "TROUPE_RANK_HINT", "metadata.annotations['batch.kubernetes.io/job-completion-index']"));
      env.push_back(env_from_field("DMLC_NODE_HOST", "status.podIP"));
    }
    return env;
  };

  std::vector<object> documents;
  if (job.config_text)
    documents.push_back(object{
        {"apiVersion", "v1"},
        {"kind", "ConfigMap"},
        {"metadata", {{"name", job.name + "-config"}, {"labels", labels(job, std::nullopt)}}},
        {"data", {{"cluster.toml", *job.config_text}}}});
  documents.push_back(
      object{{"apiVersion", "v1"},
             {"kind", "Service"},
             {"metadata", {{"name", scheduler_name}, {"labels", labels(job, "scheduler")}}},
             {"spec",
              {{"selector", {{"troupe-job", job.name}, {"troupe-role", "scheduler"}}},
               {"ports", object::array({{{"name", "scheduler"},
                                         {"protocol", "TCP"},
                                         {"port", job.port},
                                         {"targetPort", job.port}}})}}}});
  documents.push_back(job_object(job, "scheduler", 1,
                                 {job.node_binary, "--role", "scheduler", "--bind", "0.0.0.0"},
                                 role_env("scheduler", {})));
  documents.push_back(job_object(job, "server", job.num_servers,
                                 {job.node_binary, "--role", "server"},
                                 role_env("server", job.server_env)));
  documents.push_back(
      job_object(job, "worker", job.num_workers, job.command, role_env("worker", job.worker_env)));

  std::string out = "# troupe job \"" + job.name + "\": " + std::to_string(job.num_workers) +
                    " workers, " + std::to_string(job.num_servers) +
                    " servers, written by troupe-launch --emit k8s.\n"
                    "# Every pod reads the job token from Secret \"" +
                    secret +
                    "\" (key \"token\"), which these manifests do not hold; make it once:\n"
                    "#   kubectl create secret generic " +
                    secret + " --from-literal=token=\"$(openssl rand -hex 32)\"\n";
  try {
    for (const auto& document : documents) {
      out += "---\n";
      write_yaml(out, document, 0);
    }
  } catch (const nlohmann::json::exception&) {
    return error{errc::invalid_argument,
                 "a value of the job (an --env pair, the command or the cluster file) is not "
                 "UTF-8 text"};
  }
  return out;
}

} // namespace troupe::launch
