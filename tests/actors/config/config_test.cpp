// The cluster configuration: defaults, the sample file, file < environment < flags, every
// DMLC_* variable, and errors that name the file position, the variable or the flag.

#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/config/config.hpp"
#include "actors/config/local_address.hpp"
#include "actors/config/tls_credentials.hpp"
#include "schema/chunking.hpp"
#include "tests/temp_dir.hpp"
#include "tests/tls_certs.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

using troupe::testing::job_certs;
using troupe::testing::other_certs;
using troupe::testing::temp_dir;

namespace {

using env_map = std::map<std::string, std::string, std::less<>>;

const fs::path sample_path = fs::path(TROUPE_SOURCE_DIR) / "docs" / "cluster.sample.toml";

cluster_config load_ok(const std::optional<fs::path>& file, env_map env = {},
                       const config_overrides& flags = {}) {
  auto loaded = load_config(file, environment_from(std::move(env)), flags);
  if (!loaded)
    BOOST_FAIL("load_config failed: " << loaded.error().to_string());
  return *loaded;
}

error load_error(const std::optional<fs::path>& file, env_map env = {},
                 const config_overrides& flags = {}) {
  auto loaded = load_config(file, environment_from(std::move(env)), flags);
  BOOST_TEST_REQUIRE(!loaded.has_value());
  return loaded.error();
}

/// Whether wire::chunker itself takes chunks of `chunk_bytes` (its constructor throws
/// std::invalid_argument otherwise).
bool chunker_accepts(std::int64_t chunk_bytes) {
  std::vector<std::byte> payload(16);
  wire::tensor_chunk tensor{wire::dtype::float32, {4}, payload.size(), 0, payload};
  try {
    wire::chunker split(wire::push{1, 3, 0, 5, tensor}, static_cast<std::size_t>(chunk_bytes));
    return split.chunk_count() >= 1;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

/// Why validate_for_role refuses `cfg` for `role` (it must).
std::string refusal(const cluster_config& cfg, node_role role) {
  auto valid = validate_for_role(cfg, role);
  BOOST_TEST_REQUIRE(!valid.has_value(), to_string(role));
  BOOST_TEST((valid.error().code() == errc::invalid_argument));
  return valid.error().message();
}

/// No message may show the token, in whatever form it was given.
void require_no_secret(const error& err, const std::string& secret) {
  BOOST_TEST(err.message().find(secret) == std::string::npos, err.message());
  BOOST_TEST(err.message().find('\n') == std::string::npos, err.message());
}

/// The flags `args` as a binary using add_config_flags would parse them.
config_overrides parse_flags(std::vector<std::string> args) {
  config_overrides flags;
  CLI::App app{"config test"};
  add_config_flags(app, flags);
  std::reverse(args.begin(), args.end()); // CLI11 takes the vector form in reverse order
  app.parse(args);
  return flags;
}

} // namespace

BOOST_AUTO_TEST_SUITE(config)

BOOST_AUTO_TEST_CASE(defaults_are_loopback_and_mxnet_values_and_leave_job_values_unset) {
  auto cfg = load_ok(std::nullopt);
  BOOST_TEST(!cfg.role.has_value());
  BOOST_TEST(!cfg.num_workers.has_value());
  BOOST_TEST(!cfg.num_servers.has_value());
  BOOST_TEST(!cfg.scheduler_port.has_value());
  BOOST_TEST(cfg.job_id == "troupe");
  BOOST_TEST(cfg.auth_token.empty());
  BOOST_TEST(!cfg.insecure);
  BOOST_TEST(cfg.scheduler_host == "127.0.0.1");
  BOOST_TEST(cfg.bind_address == "127.0.0.1");
  BOOST_TEST(cfg.node_host == "127.0.0.1"); // peers reach a loopback node on loopback
  BOOST_TEST(cfg.data_port == 0);
  BOOST_TEST(cfg.shards_per_server == cluster_config::default_shards());
  BOOST_TEST(cfg.shards_per_server >= 1);
  BOOST_TEST(cfg.verbose == 0);
  BOOST_TEST(cfg.request_timeout == 30s);
  BOOST_TEST(cfg.peer_timeout == 5s);
  BOOST_TEST(cfg.heartbeat_interval == 500ms);
  BOOST_TEST(!cfg.quorum.has_value());
  BOOST_TEST(!cfg.rescale_quorum);
  BOOST_TEST(!cfg.max_staleness.has_value());
  BOOST_TEST(cfg.max_rounds_ahead == 2);
  BOOST_TEST(cfg.link_window_bytes == 64 * 1024 * 1024);
  BOOST_TEST(cfg.connect_timeout == 10s);
  BOOST_TEST(cfg.startup_timeout == 60s);
  BOOST_TEST(cfg.bigarray_bound == 1'000'000);
  BOOST_TEST(cfg.max_frame_bytes == 256 * 1024 * 1024);
  BOOST_TEST(cfg.chunk_bytes == 1024 * 1024);
  BOOST_TEST(cfg.send_window_bytes == 4 * 1024 * 1024);
  BOOST_TEST(cfg.slice_credit == 4);
  BOOST_TEST(cfg.shm_arena_bytes == 64 * 1024 * 1024);
  BOOST_TEST(cfg.io_spin_us == 0);
  BOOST_TEST(cfg.fuse_item_bytes == 16 * 1024);
  BOOST_TEST(cfg.fuse_frame_bytes == 256 * 1024);
}

BOOST_AUTO_TEST_CASE(the_sample_file_loads_to_exactly_the_defaults) {
  BOOST_TEST_REQUIRE(fs::exists(sample_path));
  BOOST_TEST((load_ok(sample_path) == load_ok(std::nullopt)));
}

BOOST_AUTO_TEST_CASE(the_sample_file_names_every_key_and_its_commented_examples_load) {
  std::ifstream in(sample_path);
  BOOST_TEST_REQUIRE(in.good());
  const std::regex section_line{R"(^\[(\w+)\]\s*$)"};
  const std::regex key_line{R"(^(# )?(\w+) = (.*)$)"};
  std::set<std::string> seen;
  std::string section, line, uncommented;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, section_line)) {
      section = m[1];
    } else if (std::regex_match(line, m, key_line)) {
      bool commented = m[1].matched;
      auto key = std::find_if(config_keys().begin(), config_keys().end(), [&](const auto& k) {
        return k.section == section && k.name == m[2].str();
      });
      if (key == config_keys().end()) {
        if (!commented)
          BOOST_FAIL("sample key " << m[2] << " in [" << section << "] is not a key");
        uncommented += line + "\n";
        continue;
      }
      seen.insert(section + "." + m[2].str());
      if (!key->default_text.empty()) {
        BOOST_TEST(!commented, section << "." << key->name << " has a default: write it out");
        BOOST_TEST(m[3].str() == std::string(key->default_text));
      } else {
        BOOST_TEST(commented, section << "." << key->name << " has no default: comment it");
      }
      uncommented += (commented ? line.substr(2) : line) + "\n";
      continue;
    }
    uncommented += line + "\n";
  }
  for (const auto& key : config_keys())
    BOOST_TEST(seen.count(std::string(key.section) + "." + std::string(key.name)) == 1,
               key.section << "." << key.name << " is missing from the sample");

  // The examples must be valid values; the token file is the one that must exist to load.
  temp_dir dir;
  auto token = dir.write("job.token", "s3cret\n", 0600);
  uncommented = std::regex_replace(uncommented, std::regex{R"(token_file = ".*")"},
                                   "token_file = \"" + token.string() + "\"");
  uncommented = std::regex_replace(uncommented, std::regex{R"(\ntoken = "")"}, "\n");
  auto examples = dir.write("examples.toml", uncommented);
  auto cfg = load_ok(examples);
  BOOST_TEST((cfg.role == node_role::worker));
  BOOST_TEST((cfg.num_workers == 2));
  BOOST_TEST(cfg.auth_token == "s3cret");
  BOOST_TEST((cfg.scheduler_port == 9091));
  BOOST_TEST(cfg.node_host == "10.0.0.5"); // host beats interface within one layer
}

BOOST_AUTO_TEST_CASE(the_environment_beats_the_file_and_flags_beat_the_environment) {
  temp_dir dir;
  auto file = dir.write("cluster.toml", "[job]\nnum_workers = 2\n[node]\nverbose = 1\n");
  env_map env{{"DMLC_NUM_WORKER", "3"}};
  auto flags = parse_flags({"--num-workers", "4"});

  BOOST_TEST((load_ok(file).num_workers == 2));
  BOOST_TEST((load_ok(file, env).num_workers == 3));
  auto all = load_ok(file, env, flags);
  BOOST_TEST((all.num_workers == 4));
  BOOST_TEST(all.verbose == 1); // a key no later layer sets keeps the file's value
  BOOST_TEST((load_ok(std::nullopt, {}, flags).num_workers == 4));
}

BOOST_AUTO_TEST_CASE(every_dmlc_variable_sets_its_field) {
  env_map env{{"DMLC_ROLE", "server"},
              {"DMLC_PS_ROOT_URI", "10.1.2.3"},
              {"DMLC_PS_ROOT_PORT", "9100"},
              {"DMLC_NUM_WORKER", "3"},
              {"DMLC_NUM_SERVER", "2"},
              {"DMLC_NODE_HOST", "10.9.8.7"},
              {"PORT", "9200"},
              {"PS_VERBOSE", "2"},
              {"MXNET_KVSTORE_BIGARRAY_BOUND", "1000"},
              {"TROUPE_JOB_ID", "mnist-7"},
              {"TROUPE_JOB_TOKEN", "tok"}};
  auto cfg = load_ok(std::nullopt, env);
  BOOST_TEST((cfg.role == node_role::server));
  BOOST_TEST(cfg.scheduler_host == "10.1.2.3");
  BOOST_TEST((cfg.scheduler_port == 9100));
  BOOST_TEST((cfg.num_workers == 3));
  BOOST_TEST((cfg.num_servers == 2));
  BOOST_TEST(cfg.node_host == "10.9.8.7");
  BOOST_TEST(cfg.bind_address == "10.9.8.7"); // the configuration named this node's address
  BOOST_TEST(cfg.data_port == 9200);
  BOOST_TEST(cfg.verbose == 2);
  BOOST_TEST(cfg.bigarray_bound == 1000);
  BOOST_TEST(cfg.job_id == "mnist-7");
  BOOST_TEST(cfg.auth_token == "tok");
  BOOST_TEST(validate_for_role(cfg, node_role::server).has_value());
}

BOOST_AUTO_TEST_CASE(the_scheduler_binds_its_root_uri_and_ignores_dmlc_interface) {
  env_map env{{"DMLC_ROLE", "scheduler"},
              {"DMLC_PS_ROOT_URI", "127.0.0.2"},
              {"DMLC_INTERFACE", "troupe-absent0"}};
  auto cfg = load_ok(std::nullopt, env);
  BOOST_TEST(cfg.node_host == "127.0.0.2");
  BOOST_TEST(cfg.bind_address == "127.0.0.2");
  env["DMLC_ROLE"] = "worker";
  auto err = load_error(std::nullopt, env);
  BOOST_TEST(err.message().find("DMLC_INTERFACE") == 0);
}

BOOST_AUTO_TEST_CASE(dmlc_interface_lo_gives_127_0_0_1) {
  auto cfg = load_ok(std::nullopt, {{"DMLC_ROLE", "worker"}, {"DMLC_INTERFACE", "lo"}});
  BOOST_TEST(cfg.node_interface == "lo");
  BOOST_TEST(cfg.node_host == "127.0.0.1");
  BOOST_TEST(cfg.bind_address == "127.0.0.1");
  auto direct = interface_ipv4("lo");
  BOOST_TEST_REQUIRE(direct.has_value());
  BOOST_TEST(*direct == "127.0.0.1");
}

BOOST_AUTO_TEST_CASE(an_absent_interface_is_an_error_naming_the_variable_and_the_interface) {
  auto err = load_error(std::nullopt, {{"DMLC_INTERFACE", "troupe-nope0"}});
  BOOST_TEST((err.code() == errc::invalid_argument));
  BOOST_TEST(err.message().find("DMLC_INTERFACE: no network interface \"troupe-nope0\"") == 0,
             err.message());
  BOOST_TEST(err.message().find("lo") != std::string::npos); // lists the interfaces present
  BOOST_TEST(err.message().find('\n') == std::string::npos);
}

BOOST_AUTO_TEST_CASE(dmlc_node_host_beats_dmlc_interface_in_the_same_layer) {
  auto cfg =
      load_ok(std::nullopt, {{"DMLC_NODE_HOST", "127.0.0.3"}, {"DMLC_INTERFACE", "troupe-nope0"}});
  BOOST_TEST(cfg.node_host == "127.0.0.3");
}

BOOST_AUTO_TEST_CASE(an_interface_from_a_later_layer_replaces_a_host_from_the_file) {
  temp_dir dir;
  auto file = dir.write("cluster.toml", "[node]\nhost = \"10.0.0.5\"\n");
  BOOST_TEST(load_ok(file).node_host == "10.0.0.5");
  auto cfg = load_ok(file, {{"DMLC_INTERFACE", "lo"}});
  BOOST_TEST(cfg.node_host == "127.0.0.1");
  BOOST_TEST(load_ok(file, {}, parse_flags({"--interface", "lo"})).node_host == "127.0.0.1");
}

BOOST_AUTO_TEST_CASE(an_explicit_bind_address_is_kept_and_a_wildcard_leaves_the_host_unknown) {
  auto wildcard = load_ok(std::nullopt, {}, parse_flags({"--bind", "0.0.0.0"}));
  BOOST_TEST(wildcard.bind_address == "0.0.0.0");
  BOOST_TEST(wildcard.node_host.empty());
  auto named =
      load_ok(std::nullopt, {{"DMLC_NODE_HOST", "10.0.0.9"}}, parse_flags({"--bind", "0.0.0.0"}));
  BOOST_TEST(named.bind_address == "0.0.0.0");
  BOOST_TEST(named.node_host == "10.0.0.9");
}

BOOST_AUTO_TEST_CASE(bad_environment_values_name_the_variable_and_the_value) {
  BOOST_TEST(load_error(std::nullopt, {{"DMLC_NUM_WORKER", "x"}}).message() ==
             "DMLC_NUM_WORKER must be a positive integer, got \"x\"");
  const std::vector<std::pair<std::string, std::string>> bad{
      {"DMLC_ROLE", "master"},
      {"DMLC_PS_ROOT_URI", "a host"},
      {"DMLC_PS_ROOT_PORT", "70000"},
      {"DMLC_PS_ROOT_PORT", "90a"},
      {"DMLC_NUM_WORKER", "0"},
      {"DMLC_NUM_WORKER", "-2"},
      {"DMLC_NUM_SERVER", "two"},
      {"DMLC_NODE_HOST", "a\tb"},
      {"DMLC_INTERFACE", "a/b"},
      {"PORT", "-1"},
      {"PS_VERBOSE", "3"},
      {"MXNET_KVSTORE_BIGARRAY_BOUND", "1e6"},
      {"TROUPE_JOB_ID", "no spaces please"},
  };
  for (const auto& [name, value] : bad) {
    auto err = load_error(std::nullopt, {{name, value}});
    BOOST_TEST((err.code() == errc::invalid_argument));
    BOOST_TEST(err.message().find(name + " must be ") == 0, err.message());
    BOOST_TEST(err.message().ends_with("got \"" + value + "\""), err.message());
  }
}

BOOST_AUTO_TEST_CASE(an_empty_variable_counts_as_unset) {
  auto cfg = load_ok(std::nullopt, {{"DMLC_NUM_WORKER", ""}, {"DMLC_INTERFACE", ""}});
  BOOST_TEST(!cfg.num_workers.has_value());
  BOOST_TEST(cfg.node_interface.empty());
}

BOOST_AUTO_TEST_CASE(an_unknown_key_names_file_line_column_and_key) {
  temp_dir dir;
  auto file = dir.write("cluster.toml", "[job]\nnum_workers = 2\n  nm_servers = 2\n");
  auto err = load_error(file);
  BOOST_TEST((err.code() == errc::invalid_argument));
  BOOST_TEST(err.message() == file.string() + ":3:3: unknown key 'nm_servers' in [job]");
}

BOOST_AUTO_TEST_CASE(an_unknown_section_or_a_key_outside_a_section_names_its_line) {
  temp_dir dir;
  auto section = dir.write("a.toml", "[job]\nid = \"x\"\n\n[jobs]\nid = \"y\"\n");
  BOOST_TEST(
      load_error(section).message().find(section.string() + ":4:2: unknown section [jobs]") == 0);
  auto top = dir.write("b.toml", "num_workers = 2\n");
  BOOST_TEST(load_error(top).message() ==
             top.string() + ":1:1: unknown key 'num_workers' outside any section (it belongs "
                            "in [job])");
}

BOOST_AUTO_TEST_CASE(a_malformed_value_names_file_line_column_key_and_value) {
  temp_dir dir;
  auto file = dir.write("cluster.toml", "# a job\n\n[job]\nid = \"j\"\n\n# two workers\n"
                                        "num_workers = \"two\"\n");
  BOOST_TEST(load_error(file).message() ==
             file.string() + ":7:15: job.num_workers must be a positive integer, got \"two\"");
  // TOML is typed: a quoted number is a string, and a float is not a port.
  auto port = dir.write("port.toml", "[scheduler]\nport = 9.5\n");
  BOOST_TEST(load_error(port).message() ==
             port.string() + ":2:8: scheduler.port must be a port number from 0 to 65535, "
                             "got 9.5");
  auto duration = dir.write("timeout.toml", "[timeouts]\nrequest = 5\n");
  BOOST_TEST(load_error(duration).message().find(duration.string() +
                                                 ":2:11: timeouts.request must be a positive "
                                                 "duration") == 0);
}

BOOST_AUTO_TEST_CASE(broken_toml_is_corrupt_data_naming_file_and_line) {
  temp_dir dir;
  auto file = dir.write("cluster.toml", "[job]\nnum_workers = 2\n[scheduler\nport = 9000\n");
  auto err = load_error(file);
  BOOST_TEST((err.code() == errc::corrupt_data));
  BOOST_TEST(err.message().find(file.string() + ":3:") == 0, err.message());
  BOOST_TEST(err.message().find('\n') == std::string::npos);

  auto duplicate = dir.write("dup.toml", "[job]\nid = \"a\"\nid = \"b\"\n");
  BOOST_TEST(load_error(duplicate).message().find(duplicate.string() + ":3:") == 0);
}

// What the parser refuses on a plain `key = ...` line is said with the key, as a bad value is.
BOOST_AUTO_TEST_CASE(broken_toml_on_a_key_s_line_names_the_key) {
  temp_dir dir;
  auto big =
      dir.write("big.toml", "[job]\nid = \"j\"\n\n[ scheduler ]\nport = 99999999999999999999\n");
  auto err = load_error(big);
  BOOST_TEST((err.code() == errc::corrupt_data));
  BOOST_TEST(err.message().find(big.string() + ":5:28: scheduler.port: ") == 0, err.message());
  auto unterminated = dir.write("string.toml", "[job]\n  id = \"j\n");
  BOOST_TEST(load_error(unterminated).message().find(unterminated.string() + ":2:") == 0);
  BOOST_TEST(load_error(unterminated).message().find(": job.id: ") != std::string::npos);
  auto outside = dir.write("outside.toml", "num_workers = 99999999999999999999\n");
  BOOST_TEST(load_error(outside).message().find(": num_workers: ") != std::string::npos);
  // A line that sets no plain key names no key.
  auto header = dir.write("header.toml", "[job]\nid = \"j\"\n[scheduler\n");
  BOOST_TEST(load_error(header).message().find(": job.id") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_missing_file_is_an_io_error_naming_it_and_what_named_it) {
  temp_dir dir;
  const auto absent = dir.path() / "absent.toml";
  auto err = load_error(absent);
  BOOST_TEST((err.code() == errc::io_error));
  BOOST_TEST(err.message() ==
             "cannot read config file " + absent.string() + ": No such file or directory");
  auto from_flag = load_error(std::nullopt, {}, parse_flags({"--config", absent.string()}));
  BOOST_TEST((from_flag.code() == errc::io_error));
  BOOST_TEST(from_flag.message() == "--config: " + err.message());
  auto from_env = load_error(std::nullopt, {{"TROUPE_CONFIG", absent.string()}});
  BOOST_TEST(from_env.message() == "TROUPE_CONFIG: " + err.message());
}

BOOST_AUTO_TEST_CASE(troupe_config_names_the_file_when_no_flag_does) {
  temp_dir dir;
  auto env_file = dir.write("env.toml", "[job]\nnum_servers = 5\n");
  auto flag_file = dir.write("flag.toml", "[job]\nnum_servers = 6\n");
  BOOST_TEST((load_ok(std::nullopt, {{"TROUPE_CONFIG", env_file.string()}}).num_servers == 5));
  auto flags = parse_flags({"--config", flag_file.string()});
  BOOST_TEST(
      (load_ok(std::nullopt, {{"TROUPE_CONFIG", env_file.string()}}, flags).num_servers == 6));
}

BOOST_AUTO_TEST_CASE(every_flag_sets_its_field_and_bad_flag_values_name_the_flag) {
  temp_dir dir;
  auto token = dir.write("token", "abc\r\n", 0600);
  auto flags = parse_flags({"--role",
                            "scheduler",
                            "--scheduler-host",
                            "127.0.0.1",
                            "--scheduler-port",
                            "0",
                            "--num-workers",
                            "7",
                            "--max-workers",
                            "9",
                            "--join-at-barrier",
                            "true",
                            "--num-servers",
                            "3",
                            "--max-servers",
                            "5",
                            "--job-id",
                            "j",
                            "--token-file",
                            token.string(),
                            "--insecure",
                            "false",
                            "--host",
                            "127.0.0.1",
                            "--interface",
                            "lo",
                            "--bind",
                            "127.0.0.1",
                            "--port",
                            "1234",
                            "--shards",
                            "3",
                            "--verbose",
                            "1",
                            "--timeout",
                            "2m",
                            "--peer-timeout",
                            "20s",
                            "--heartbeat",
                            "1s",
                            "--connect-timeout",
                            "3s",
                            "--startup-timeout",
                            "1h",
                            "--server-rejoin",
                            "2m",
                            "--bigarray-bound",
                            "10",
                            "--max-frame-bytes",
                            "1MiB",
                            "--chunk-bytes",
                            "65536",
                            "--slice-bytes",
                            "256KiB",
                            "--send-window-bytes",
                            "256KiB",
                            "--slice-credit",
                            "6",
                            "--shm-arena-bytes",
                            "0",
                            "--io-spin-us",
                            "7",
                            "--fuse-item-bytes",
                            "4KiB",
                            "--fuse-frame-bytes",
                            "0",
                            "--rank-hint",
                            "2",
                            "--link-window-bytes",
                            "1MiB",
                            "--receive-budget-bytes",
                            "2MiB",
                            "--min-frame-rate",
                            "1MiB",
                            "--max-send-queue-bytes",
                            "3MiB",
                            "--max-store-bytes",
                            "1GiB",
                            "--max-value-bytes",
                            "512MiB",
                            "--stalled-frame-timeout",
                            "250ms",
                            "--frame-grace",
                            "3s",
                            "--quorum",
                            "5",
                            "--rescale-quorum",
                            "true",
                            "--max-staleness",
                            "3",
                            "--max-rounds-ahead",
                            "4",
                            "--checkpoint-dir",
                            "/var/lib/troupe/j",
                            "--checkpoint-every-rounds",
                            "50",
                            "--checkpoint-every",
                            "10m",
                            "--recover",
                            "true",
                            "--server-device",
                            "gpu(1)",
                            "--tls",
                            "false",
                            "--tls-ca",
                            "/ca.crt",
                            "--tls-cert",
                            "/{role}.crt",
                            "--tls-key",
                            "/{role}.key",
                            "--tls-allow-shared-memory",
                            "true",
                            "--trace",
                            "/tmp/job.trace",
                            "--summary",
                            "true"});
  auto cfg = load_ok(std::nullopt, {}, flags);
  BOOST_TEST((cfg.role == node_role::scheduler));
  BOOST_TEST((cfg.scheduler_port == 0));
  BOOST_TEST((cfg.num_workers == 7));
  BOOST_TEST((cfg.max_workers == 9));
  BOOST_TEST(cfg.join_at_barrier);
  BOOST_TEST((cfg.num_servers == 3));
  BOOST_TEST((cfg.max_servers == 5));
  BOOST_TEST(cfg.key_range_count() == 5);
  BOOST_TEST(cfg.job_id == "j");
  BOOST_TEST(cfg.auth_token == "abc");
  BOOST_TEST(!cfg.insecure);
  BOOST_TEST(cfg.data_port == 1234);
  BOOST_TEST(cfg.shards_per_server == 3);
  BOOST_TEST(cfg.verbose == 1);
  BOOST_TEST(cfg.request_timeout == 2min);
  BOOST_TEST(cfg.heartbeat_interval == 1s);
  BOOST_TEST(cfg.connect_timeout == 3s);
  BOOST_TEST(cfg.startup_timeout == 1h);
  BOOST_TEST(cfg.bigarray_bound == 10);
  BOOST_TEST(cfg.max_frame_bytes == 1024 * 1024);
  BOOST_TEST(cfg.chunk_bytes == 65536);
  BOOST_TEST(cfg.slice_bytes == 256 * 1024);
  BOOST_TEST(cfg.send_window_bytes == 256 * 1024);
  BOOST_TEST(cfg.slice_credit == 6);
  BOOST_TEST(cfg.shm_arena_bytes == 0);
  BOOST_TEST(cfg.io_spin_us == 7);
  BOOST_TEST(cfg.fuse_item_bytes == 4 * 1024);
  BOOST_TEST(cfg.fuse_frame_bytes == 0);
  BOOST_TEST(cfg.rank_hint == 2);
  BOOST_TEST(cfg.peer_timeout == 20s);
  BOOST_TEST(cfg.link_window_bytes == 1024 * 1024);
  BOOST_TEST(cfg.receive_budget_bytes == 2 * 1024 * 1024);
  BOOST_TEST(cfg.max_send_queue_bytes == 3 * 1024 * 1024);
  BOOST_TEST(cfg.max_store_bytes == 1024 * 1024 * 1024);
  BOOST_TEST(cfg.max_value_bytes == 512 * 1024 * 1024);
  BOOST_TEST(cfg.stalled_frame_timeout == 250ms);
  BOOST_TEST(cfg.frame_grace == 3s);
  BOOST_TEST(cfg.min_frame_rate == 1024 * 1024);
  BOOST_TEST((cfg.quorum == 5));
  BOOST_TEST(cfg.rescale_quorum);
  BOOST_TEST((cfg.max_staleness == 3));
  BOOST_TEST(cfg.max_rounds_ahead == 4);
  BOOST_TEST(cfg.server_device == "gpu(1)");
  BOOST_TEST(cfg.checkpoint_dir == "/var/lib/troupe/j");
  BOOST_TEST(cfg.checkpoint_every_rounds == 50);
  BOOST_TEST(cfg.checkpoint_every == 10min);
  BOOST_TEST(cfg.checkpoint_recover);
  BOOST_TEST(cfg.server_rejoin == 2min);
  BOOST_TEST(!cfg.tls_enabled);
  BOOST_TEST(cfg.tls_ca_file == "/ca.crt");
  BOOST_TEST(cfg.tls_cert_file == "/{role}.crt");
  BOOST_TEST(cfg.tls_key_file == "/{role}.key");
  BOOST_TEST(cfg.tls_allow_shared_memory);
  BOOST_TEST(cfg.trace_file == "/tmp/job.trace");
  BOOST_TEST(cfg.summary);
  std::size_t with_flag = 0;
  for (const auto& key : config_keys())
    with_flag += key.flag.empty() ? 0 : 1;
  BOOST_TEST(flags.values.size() == with_flag); // the list above covers every flag

  BOOST_TEST(load_error(std::nullopt, {}, parse_flags({"--num-workers", "two"})).message() ==
             "--num-workers must be a positive integer, got \"two\"");
  BOOST_TEST(load_error(std::nullopt, {}, parse_flags({"--timeout", "5"})).message() ==
             "--timeout must be a positive duration such as \"500ms\", \"5s\" or \"2m\", got "
             "\"5\"");
  // A period that may be off: "0s" turns it off, a bad one is named.
  BOOST_TEST(
      load_ok(std::nullopt, {}, parse_flags({"--checkpoint-every", "0s"})).checkpoint_every == 0ms);
  BOOST_TEST(load_error(std::nullopt, {}, parse_flags({"--checkpoint-every", "often"})).message() ==
             "--checkpoint-every must be a duration such as \"30s\" or \"10m\", or \"0s\" for "
             "never, got \"often\"");
}

BOOST_AUTO_TEST_CASE(values_that_contradict_each_other_name_both_keys) {
  auto heartbeat = load_error(std::nullopt, {}, parse_flags({"--heartbeat", "5s"}));
  BOOST_TEST(heartbeat.message() ==
             "--heartbeat (5s) must be shorter than timeouts.peer (5s, the default)");
  BOOST_TEST(load_error(std::nullopt, {}, parse_flags({"--num-workers", "2", "--quorum", "3"}))
                 .message() == "--quorum (3) must not exceed --num-workers (2)");
  BOOST_TEST(load_error(std::nullopt, {}, parse_flags({"--rescale-quorum", "yes"})).message() ==
             "--rescale-quorum must be true or false, got \"yes\"");
  temp_dir dir;
  auto file = dir.write("c.toml", "[data]\nmax_frame_bytes = 65536\nchunk_bytes = \"1MiB\"\n");
  BOOST_TEST(load_error(file).message() ==
             file.string() + ":3:15: data.chunk_bytes (1048576) must not exceed " + file.string() +
                 ":2:19: data.max_frame_bytes (65536)");
  auto both = dir.write("t.toml", "[job]\ntoken = \"a\"\ntoken_file = \"/nonexistent\"\n", 0600);
  BOOST_TEST(load_error(both).message().find("both set the token") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(a_token_file_gives_the_token_and_a_missing_one_is_named) {
  temp_dir dir;
  auto token = dir.write("token", "secret\n", 0600);
  auto file = dir.write("c.toml", "[job]\ntoken = \"inline\"\n", 0600);
  BOOST_TEST(load_ok(file).auth_token == "inline");
  // A later layer's token file replaces the file's inline token.
  BOOST_TEST(load_ok(file, {}, parse_flags({"--token-file", token.string()})).auth_token ==
             "secret");
  auto err = load_error(std::nullopt, {}, parse_flags({"--token-file", "/nonexistent/tok"}));
  BOOST_TEST((err.code() == errc::io_error));
  BOOST_TEST(err.message().find("--token-file: cannot read token file /nonexistent/tok") == 0,
             err.message());
}

BOOST_AUTO_TEST_CASE(a_cluster_or_token_file_beyond_1_mib_is_refused_without_reading_it_all) {
  temp_dir dir;
  // A comment line is valid TOML, so only the size can be what is refused.
  auto huge = dir.write("c.toml", "# " + std::string(std::size_t{1} << 20, 'x') + "\n", 0600);
  auto err = load_error(huge);
  BOOST_TEST((err.code() == errc::invalid_argument));
  BOOST_TEST(err.message().find("config file " + huge.string() + " holds more than 1 MiB") !=
                 std::string::npos,
             err.message());
  err = load_error(std::nullopt, {}, parse_flags({"--token-file", "/dev/zero"}));
  BOOST_TEST(err.message().find("--token-file: token file /dev/zero holds more than 1 MiB") == 0,
             err.message());
}

BOOST_AUTO_TEST_CASE(a_token_file_others_may_read_or_write_is_refused_naming_its_mode_and_the_fix) {
  temp_dir dir;
  for (unsigned mode : {0640u, 0604u, 0620u, 0602u, 0644u, 0666u, 0660u, 0610u}) {
    auto token = dir.write("token", "t0ps3cret\n", mode);
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", mode);
    auto err = load_error(std::nullopt, {}, parse_flags({"--token-file", token.string()}));
    BOOST_TEST((err.code() == errc::invalid_argument));
    BOOST_TEST(err.message() == "--token-file: token file " + token.string() +
                                    " may be read or written by group or others (mode " + octal +
                                    "); run chmod 600 " + token.string(),
               err.message());
    require_no_secret(err, "t0ps3cret");
    fs::remove(token);
  }
  // The key names the file as the file layer gives it.
  auto token = dir.write("token", "t0ps3cret\n", 0644);
  auto file = dir.write("c.toml", "[job]\ntoken_file = \"" + token.string() + "\"\n", 0644);
  auto err = load_error(file);
  BOOST_TEST(err.message().find(file.string() + ":2:14: job.token_file: token file " +
                                token.string() + " may be read") == 0,
             err.message());
  // Private files are the owner's business, read-only or not.
  for (unsigned mode : {0600u, 0400u}) {
    fs::remove(token);
    token = dir.write("token", "t0ps3cret\n", mode);
    BOOST_TEST(load_ok(file).auth_token == "t0ps3cret");
  }
}

BOOST_AUTO_TEST_CASE(a_token_in_a_cluster_file_others_may_read_is_refused_and_the_variable_is_not) {
  temp_dir dir;
  auto open = dir.write("c.toml", "[job]\nnum_workers = 2\ntoken = \"t0ps3cret\"\n", 0644);
  auto err = load_error(open);
  BOOST_TEST((err.code() == errc::invalid_argument));
  BOOST_TEST(err.message() ==
                 open.string() +
                     ":3:9: job.token is set in a config file that group or others may read or "
                     "write (mode 0644): put the token in a private file named by job.token_file "
                     "(chmod 600) or in TROUPE_JOB_TOKEN, or chmod 600 " +
                     open.string(),
             err.message());
  require_no_secret(err, "t0ps3cret");
  // Through TROUPE_CONFIG too, and whichever later layer sets the token: the file shows it.
  BOOST_TEST(
      !load_config(
           std::nullopt,
           environment_from({{"TROUPE_CONFIG", open.string()}, {"TROUPE_JOB_TOKEN", "other"}}), {})
           .has_value());
  for (unsigned mode : {0640u, 0604u, 0620u}) {
    fs::permissions(open, static_cast<fs::perms>(mode));
    BOOST_TEST(!load_config(open, environment_from({}), {}).has_value(), mode);
  }

  fs::permissions(open, static_cast<fs::perms>(0600));
  BOOST_TEST(load_ok(open).auth_token == "t0ps3cret");
  // An empty token is no secret (the sample file writes one), and the variable is allowed.
  auto empty = dir.write("e.toml", "[job]\ntoken = \"\"\n", 0644);
  BOOST_TEST(load_ok(empty).auth_token.empty());
  BOOST_TEST(load_ok(empty, {{"TROUPE_JOB_TOKEN", "t0ps3cret"}}).auth_token == "t0ps3cret");
}

BOOST_AUTO_TEST_CASE(no_message_shows_the_token) {
  temp_dir dir;
  // A bad token from the environment, from a private cluster file, from a token file.
  auto from_env = load_error(std::nullopt, {{"TROUPE_JOB_TOKEN", "t0ps\nsecret"}});
  BOOST_TEST(from_env.message() ==
             "TROUPE_JOB_TOKEN must be a token without newlines, got a value of 11 bytes (not "
             "shown)");
  require_no_secret(from_env, "t0ps");
  require_no_secret(from_env, "secret");
  auto file = dir.write("c.toml", "[job]\ntoken = \"\"\"t0ps\nsecret\"\"\"\n", 0600);
  auto from_file = load_error(file);
  BOOST_TEST(from_file.message().find(file.string() + ":2:9: job.token must be a token without "
                                                      "newlines, got a value of ") == 0,
             from_file.message());
  require_no_secret(from_file, "t0ps");
  require_no_secret(from_file, "secret");
  auto number = dir.write("n.toml", "[job]\ntoken = 123456789\n", 0600);
  require_no_secret(load_error(number), "123456789");
  auto two_lines = dir.write("token", "t0ps\nsecret\n", 0600);
  auto from_token_file =
      load_error(std::nullopt, {}, parse_flags({"--token-file", two_lines.string()}));
  require_no_secret(from_token_file, "t0ps");
  require_no_secret(from_token_file, "secret");
  // Both set: the message names the places, not the token.
  auto both = dir.write("b.toml", "[job]\ntoken = \"t0ps3cret\"\ntoken_file = \"/x\"\n", 0600);
  require_no_secret(load_error(both), "t0ps3cret");
}

BOOST_AUTO_TEST_CASE(a_scheduler_or_server_listening_beyond_loopback_needs_a_token_or_insecure) {
  temp_dir dir;
  const env_map job{
      {"DMLC_PS_ROOT_PORT", "9000"}, {"DMLC_NUM_WORKER", "2"}, {"DMLC_NUM_SERVER", "1"}};
  auto with = [&](env_map extra, std::vector<std::string> args = {}) {
    env_map env = job;
    env.insert(extra.begin(), extra.end());
    return load_ok(std::nullopt, env, parse_flags(std::move(args)));
  };
  const std::string why = " without a job token lets any host join and read the job; set "
                          "job.token_file or TROUPE_JOB_TOKEN, or pass --insecure";

  auto wildcard = with({{"DMLC_NODE_HOST", "10.0.0.9"}}, {"--bind", "0.0.0.0"});
  BOOST_TEST(refusal(wildcard, node_role::server) == "a server listening on 0.0.0.0" + why);
  BOOST_TEST(validate_for_role(wildcard, node_role::worker).has_value()); // workers do not listen

  auto server = with({{"DMLC_NODE_HOST", "10.0.0.9"}});
  BOOST_TEST(refusal(server, node_role::server) == "a server listening on 10.0.0.9" + why);
  auto scheduler = with({{"DMLC_PS_ROOT_URI", "10.0.0.1"}});
  BOOST_TEST(refusal(scheduler, node_role::scheduler) == "a scheduler listening on 10.0.0.1" + why);
  auto scheduler_bind = with({}, {"--bind", "::"});
  BOOST_TEST(refusal(scheduler_bind, node_role::scheduler) == "a scheduler listening on ::" + why);
  // A name that is not "localhost" may resolve anywhere.
  auto named = with({{"DMLC_PS_ROOT_URI", "localhost.example.com"}});
  BOOST_TEST(refusal(named, node_role::scheduler) ==
             "a scheduler listening on localhost.example.com" + why);

  // A token, from any place, or --insecure (TROUPE_INSECURE, job.insecure), lets them listen.
  auto token = dir.write("token", "t0ps3cret\n", 0600);
  for (const auto& allowed :
       {with({{"DMLC_NODE_HOST", "10.0.0.9"}, {"TROUPE_JOB_TOKEN", "t"}}, {"--bind", "0.0.0.0"}),
        with({{"DMLC_NODE_HOST", "10.0.0.9"}},
             {"--bind", "0.0.0.0", "--token-file", token.string()}),
        with({{"DMLC_NODE_HOST", "10.0.0.9"}}, {"--bind", "0.0.0.0", "--insecure"}),
        with({{"DMLC_NODE_HOST", "10.0.0.9"}, {"TROUPE_INSECURE", "1"}}, {"--bind", "0.0.0.0"})})
    for (auto role : {node_role::scheduler, node_role::server, node_role::worker})
      BOOST_TEST(validate_for_role(allowed, role).has_value(), to_string(role));
  auto file =
      dir.write("c.toml", "[job]\ninsecure = true\n[node]\nbind = \"0.0.0.0\"\nhost = \"h\"\n");
  auto from_file = load_ok(file, job);
  BOOST_TEST(from_file.insecure);
  BOOST_TEST(validate_for_role(from_file, node_role::server).has_value());
  refusal(with({}, {"--bind", "0.0.0.0", "--host", "h", "--insecure", "false"}), node_role::server);

  // Loopback in all its spellings needs nothing.
  for (const std::string address : {"127.0.0.1", "127.1.2.3", "127.255.255.254", "::1", "[::1]",
                                    "::ffff:127.0.0.1", "localhost"}) {
    auto loopback = with({{"DMLC_PS_ROOT_URI", address}}, {"--bind", address});
    for (auto role : {node_role::scheduler, node_role::server})
      BOOST_TEST(validate_for_role(loopback, role).has_value(), address << " " << to_string(role));
  }
  for (const std::string address :
       {"128.0.0.1", "10.127.0.1", "::2", "::ffff:10.0.0.1", "0.0.0.0", "::"}) {
    auto open = with({{"DMLC_PS_ROOT_URI", address}}, {"--bind", address, "--host", "h"});
    for (auto role : {node_role::scheduler, node_role::server})
      BOOST_TEST(refusal(open, role).find("listening on " + address + " without") !=
                     std::string::npos,
                 address);
  }
}

BOOST_AUTO_TEST_CASE(a_boolean_flag_alone_means_true) {
  BOOST_TEST(load_ok(std::nullopt, {}, parse_flags({"--insecure"})).insecure);
  BOOST_TEST(load_ok(std::nullopt, {}, parse_flags({"--rescale-quorum"})).rescale_quorum);
  BOOST_TEST(!load_ok(std::nullopt, {}, parse_flags({"--insecure", "false"})).insecure);
  BOOST_TEST(load_ok(std::nullopt, {{"TROUPE_INSECURE", "true"}}).insecure);
  BOOST_TEST(!load_ok(std::nullopt, {{"TROUPE_INSECURE", "0"}}).insecure);
  auto flags = parse_flags({"--insecure", "--num-workers", "2"});
  auto cfg = load_ok(std::nullopt, {}, flags);
  BOOST_TEST(cfg.insecure);
  BOOST_TEST((cfg.num_workers == 2));
  BOOST_TEST(load_error(std::nullopt, {{"TROUPE_INSECURE", "yes"}}).message() ==
             "TROUPE_INSECURE must be true or false, got \"yes\"");
}

BOOST_AUTO_TEST_CASE(chunk_bytes_the_chunker_would_refuse_are_refused_naming_the_key_and_the_rule) {
  const std::string rule =
      "a size in bytes that wire::chunker accepts: a multiple of 8 from 4096 to " +
      std::to_string(wire::max_chunk_bytes);
  BOOST_TEST(load_error(std::nullopt, {}, parse_flags({"--chunk-bytes", "4100"})).message() ==
             "--chunk-bytes must be " + rule + ", got \"4100\"");
  temp_dir dir;
  auto file = dir.write("c.toml", "[data]\nchunk_bytes = 4100\n");
  auto err = load_error(file);
  BOOST_TEST((err.code() == errc::invalid_argument));
  BOOST_TEST(err.message() ==
             file.string() + ":2:15: data.chunk_bytes must be " + rule + ", got 4100");
  // Above the chunker's largest chunk, even where frames may be larger.
  auto huge = load_error(std::nullopt, {},
                         parse_flags({"--max-frame-bytes", "1GiB", "--chunk-bytes", "1GiB"}));
  BOOST_TEST(huge.message() == "--chunk-bytes must be " + rule + ", got \"1GiB\"");

  // The configuration takes exactly the sizes the chunker takes, from 4096 up to the frame size.
  for (std::int64_t size :
       {std::int64_t{4096}, std::int64_t{4097}, std::int64_t{4100}, std::int64_t{4104},
        std::int64_t{65540}, std::int64_t{1} << 20, (std::int64_t{1} << 20) + 4,
        std::int64_t{3} * 1000 * 1000, std::int64_t{(1 << 29) - 16}, std::int64_t{(1 << 29) - 8},
        std::int64_t{(1 << 29) - 4}, std::int64_t{1} << 29}) {
    auto loaded = load_config(
        std::nullopt, environment_from({}),
        parse_flags({"--max-frame-bytes", "1GiB", "--chunk-bytes", std::to_string(size)}));
    BOOST_TEST(loaded.has_value() == chunker_accepts(size), size);
    BOOST_TEST(wire::valid_chunk_bytes(static_cast<std::size_t>(size)) == chunker_accepts(size),
               size);
  }
}

BOOST_AUTO_TEST_CASE(validate_for_role_names_every_missing_value) {
  auto empty = load_ok(std::nullopt);
  auto missing = validate_for_role(empty, node_role::server);
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().message() ==
             "a server needs DMLC_PS_ROOT_PORT ([scheduler] port or --scheduler-port), "
             "DMLC_NUM_WORKER ([job] num_workers or --num-workers) and DMLC_NUM_SERVER ([job] "
             "num_servers or --num-servers)");

  env_map env{{"DMLC_PS_ROOT_PORT", "9000"}, {"DMLC_NUM_WORKER", "2"}, {"DMLC_NUM_SERVER", "1"}};
  auto job = load_ok(std::nullopt, env);
  for (auto role : {node_role::scheduler, node_role::server, node_role::worker})
    BOOST_TEST(validate_for_role(job, role).has_value(), to_string(role));

  env["DMLC_PS_ROOT_PORT"] = "0";
  auto port0 = load_ok(std::nullopt, env);
  BOOST_TEST(validate_for_role(port0, node_role::scheduler).has_value());
  BOOST_TEST(!validate_for_role(port0, node_role::worker).has_value());

  env["DMLC_PS_ROOT_PORT"] = "9000";
  env["DMLC_ROLE"] = "worker";
  auto worker = load_ok(std::nullopt, env);
  auto mismatch = validate_for_role(worker, node_role::server);
  BOOST_TEST_REQUIRE(!mismatch.has_value());
  BOOST_TEST(mismatch.error().message().find("role worker (DMLC_ROLE") != std::string::npos);

  env.erase("DMLC_ROLE");
  auto wildcard = load_ok(std::nullopt, env, parse_flags({"--bind", "0.0.0.0"}));
  BOOST_TEST(!validate_for_role(wildcard, node_role::server).has_value());
  BOOST_TEST(validate_for_role(wildcard, node_role::worker).has_value());
}

BOOST_AUTO_TEST_CASE(load_worker_config_is_load_config_then_validate_for_role_of_a_worker) {
  const env_map job{
      {"DMLC_PS_ROOT_PORT", "9000"}, {"DMLC_NUM_WORKER", "2"}, {"DMLC_NUM_SERVER", "1"}};
  auto ok = load_worker_config(environment_from(job), parse_flags({"--quorum", "1"}));
  BOOST_TEST_REQUIRE(ok.has_value());
  BOOST_TEST((ok->num_workers == 2));
  BOOST_TEST((ok->quorum == 1));
  auto bad = load_worker_config(environment_from({{"DMLC_NUM_WORKER", "abc"}}), {});
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message() == "DMLC_NUM_WORKER must be a positive integer, got \"abc\"");
  auto missing = load_worker_config(environment_from({{"DMLC_NUM_WORKER", "2"}}), {});
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().message().find("a worker needs DMLC_PS_ROOT_PORT") == 0,
             missing.error().message());
  env_map port0 = job;
  port0["DMLC_PS_ROOT_PORT"] = "0";
  auto unreachable = load_worker_config(environment_from(port0), {});
  BOOST_TEST_REQUIRE(!unreachable.has_value());
  BOOST_TEST(unreachable.error().message().find("a worker cannot reach a scheduler on port 0") == 0,
             unreachable.error().message());
  env_map server = job;
  server["DMLC_ROLE"] = "server";
  BOOST_TEST(!load_worker_config(environment_from(server), {}).has_value());
}

namespace {

/// A job's environment with TLS on and the three files given.
env_map tls_job(const std::string& ca, const std::string& cert, const std::string& key) {
  return {{"DMLC_PS_ROOT_PORT", "9000"}, {"DMLC_NUM_WORKER", "2"}, {"DMLC_NUM_SERVER", "1"},
          {"TROUPE_TLS", "1"},           {"TROUPE_TLS_CA", ca},    {"TROUPE_TLS_CERT", cert},
          {"TROUPE_TLS_KEY", key}};
}

} // namespace

BOOST_AUTO_TEST_CASE(tls_needs_its_three_files_and_one_cluster_file_serves_every_role) {
  auto err = load_error(std::nullopt, {{"TROUPE_TLS", "true"}});
  BOOST_TEST(
      err.message() ==
          "TROUPE_TLS turns TLS on, which needs TROUPE_TLS_CA ([tls] ca_file or --tls-ca), "
          "TROUPE_TLS_CERT ([tls] cert_file or --tls-cert) and TROUPE_TLS_KEY ([tls] key_file "
          "or --tls-key)",
      err.message());
  err = load_error(std::nullopt, {}, parse_flags({"--tls", "--tls-ca", job_certs().ca()}));
  BOOST_TEST(err.message().find("--tls turns TLS on, which needs TROUPE_TLS_CERT") == 0,
             err.message());

  BOOST_TEST(path_for_role("/etc/{role}/{role}.crt", node_role::server) ==
             "/etc/server/server.crt");
  // "{role}" stands for each node's role: one file serves the whole job.
  temp_dir dir;
  auto file = dir.write("tls.toml", "[tls]\nenabled = true\nca_file = \"" + job_certs().ca() +
                                        "\"\ncert_file = \"" + job_certs().cert_pattern() +
                                        "\"\nkey_file = \"" + job_certs().key_pattern() + "\"\n");
  auto cfg = load_ok(
      file, tls_job(job_certs().ca(), job_certs().cert_pattern(), job_certs().key_pattern()));
  BOOST_TEST(cfg.tls_enabled);
  BOOST_TEST(!cfg.tls_allow_shared_memory);
  for (auto role : {node_role::scheduler, node_role::server, node_role::worker}) {
    BOOST_TEST(validate_for_role(cfg, role).has_value(), to_string(role));
    auto credentials = load_tls_credentials(cfg, role);
    BOOST_TEST_REQUIRE(credentials.has_value(),
                       (credentials ? std::string() : credentials.error().message()));
    BOOST_TEST_REQUIRE(*credentials != nullptr);
    BOOST_TEST(((*credentials)->role() == role));
    BOOST_TEST((*credentials)->cert_file() == job_certs().cert(std::string(to_string(role))));
  }
  // Off, no credentials and no file is read.
  auto off = load_ok(std::nullopt, {{"TROUPE_TLS_CA", "/nonexistent/ca.crt"}});
  auto none = load_tls_credentials(off, node_role::worker);
  BOOST_TEST_REQUIRE(none.has_value());
  BOOST_TEST(*none == nullptr);
}

BOOST_AUTO_TEST_CASE(a_bad_tls_setup_is_refused_naming_the_file_and_the_reason) {
  const auto& job = job_certs();
  temp_dir dir;
  auto open_key = dir.path() / "open.key";
  fs::copy_file(job.key("server"), open_key);
  fs::permissions(open_key, static_cast<fs::perms>(0644));
  auto not_pem = dir.write("garbage.crt", "not a certificate\n");
  auto huge = dir.write("huge.crt", std::string(std::size_t{2} << 20, 'A'));
  const std::string missing = (dir.path() / "missing.crt").string();
  struct bad_setup {
    const char* what;
    env_map env;
    node_role role;
    std::string says;
  };
  const std::vector<bad_setup> setups{
      {"no CA file", tls_job(missing, job.cert("server"), job.key("server")), node_role::server,
       "cannot read CA file " + missing + ": No such file or directory"},
      {"no certificate file", tls_job(job.ca(), missing, job.key("server")), node_role::server,
       "cannot read certificate file " + missing + ": No such file or directory"},
      {"a certificate file without a certificate",
       tls_job(job.ca(), not_pem.string(), job.key("server")), node_role::server,
       "certificate file " + not_pem.string() + " holds no PEM certificate"},
      {"a key others may read", tls_job(job.ca(), job.cert("server"), open_key.string()),
       node_role::server,
       "key file " + open_key.string() +
           " may be read or written by group or others (mode 0644); run chmod 600 " +
           open_key.string()},
      {"a key of another certificate", tls_job(job.ca(), job.cert("server"), job.key("worker")),
       node_role::server,
       "key file " + job.key("worker") + " does not match certificate file " + job.cert("server")},
      {"a certificate from another CA",
       tls_job(job.ca(), other_certs().cert("server"), other_certs().key("server")),
       node_role::server,
       "certificate file " + other_certs().cert("server") + " is not from the CA of " + job.ca()},
      {"a certificate of another role", tls_job(job.ca(), job.cert("worker"), job.key("worker")),
       node_role::server,
       "certificate file " + job.cert("worker") + " is for a worker, but this node is a server"},
      {"the scheduler's certificate on a worker",
       tls_job(job.ca(), job.cert("scheduler"), job.key("scheduler")), node_role::worker,
       "certificate file " + job.cert("scheduler") +
           " is for a scheduler, but this node is a worker"},
      // A wrong path to something endless or huge is not read into memory.
      {"a device for the CA file", tls_job("/dev/zero", job.cert("server"), job.key("server")),
       node_role::server, "CA file /dev/zero holds more than 1 MiB, more than any CA file needs"},
      {"a certificate file of 2 MiB", tls_job(job.ca(), huge.string(), job.key("server")),
       node_role::server,
       "certificate file " + huge.string() +
           " holds more than 1 MiB, more than any certificate file needs"},
  };
  for (const auto& setup : setups) {
    BOOST_TEST_CONTEXT(setup.what) {
      auto cfg = load_ok(std::nullopt, setup.env);
      auto valid = validate_for_role(cfg, setup.role);
      BOOST_TEST_REQUIRE(!valid.has_value());
      const auto& message = valid.error().message();
      BOOST_TEST(message.find("TLS ([tls] of the configuration): " + setup.says) == 0, message);
      BOOST_TEST(message.find('\n') == std::string::npos, message);
    }
  }
  // A worker's program checks the same before it starts (exit 2).
  auto worker = load_worker_config(
      environment_from(tls_job(job.ca(), job.cert("server"), job.key("server"))), {});
  BOOST_TEST_REQUIRE(!worker.has_value());
  BOOST_TEST(worker.error().message().find("is for a server, but this node is a worker") !=
                 std::string::npos,
             worker.error().message());
}

BOOST_AUTO_TEST_CASE(a_port_in_use_is_detected_and_a_free_one_is_not) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  BOOST_TEST_REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  BOOST_TEST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  BOOST_TEST_REQUIRE(::listen(fd, 1) == 0);
  socklen_t len = sizeof addr;
  BOOST_TEST_REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const auto port = ntohs(addr.sin_port);

  auto in_use = check_port_free("127.0.0.1", port);
  BOOST_TEST_REQUIRE(!in_use.has_value());
  BOOST_TEST((in_use.error().code() == errc::io_error));
  BOOST_TEST(in_use.error().message() ==
             "port " + std::to_string(port) + " on 127.0.0.1 is in use");
  ::close(fd);
  BOOST_TEST(check_port_free("127.0.0.1", port).has_value());
  BOOST_TEST(check_port_free("127.0.0.1", 0).has_value());
  // 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
  auto foreign = check_port_free("192.0.2.1", port);
  BOOST_TEST_REQUIRE(!foreign.has_value());
  BOOST_TEST(foreign.error().message().starts_with(
                 "192.0.2.1 is not an address of this host (its addresses: "),
             foreign.error().message());
}

// What a node says when the address it must listen on is not this host's: the launcher's ssh mode
// names each remote node by its hostfile name, which must resolve there to one of its addresses.
BOOST_AUTO_TEST_CASE(an_address_not_of_this_host_is_named_with_the_host_s_own) {
  for (const char* local : {"127.0.0.1", "127.0.0.2", "localhost", "0.0.0.0", "::", "::1", "[::1]"})
    BOOST_TEST(nonlocal_address_reason(local).empty(), local);
  const auto foreign = nonlocal_address_reason("192.0.2.1");
  BOOST_TEST(foreign.starts_with("192.0.2.1 is not an address of this host (its addresses: "),
             foreign);
  BOOST_TEST(foreign.find("127.0.0.1") != std::string::npos, foreign);
  BOOST_TEST(foreign.ends_with(")"), foreign);
}

BOOST_AUTO_TEST_CASE(durations_read_and_print_with_units) {
  BOOST_TEST(parse_duration("250ms").value() == 250ms);
  BOOST_TEST(parse_duration("5s").value() == 5s);
  BOOST_TEST(parse_duration("2m").value() == 2min);
  BOOST_TEST(parse_duration("1h").value() == 1h);
  for (auto bad : {"5", "s", "", "1.5s", "5 s", "-1s", "5sec"})
    BOOST_TEST(!parse_duration(bad).has_value(), bad);
  for (auto ms : {0, 1, 500, 1000, 1500, 60'000, 90'000, 3'600'000})
    BOOST_TEST(parse_duration(format_duration(std::chrono::milliseconds{ms})).value().count() ==
               ms);
  BOOST_TEST(format_duration(500ms) == "500ms");
  BOOST_TEST(format_duration(5s) == "5s");
}

BOOST_AUTO_TEST_CASE(roles_print_and_parse_with_ps_lite_names) {
  for (auto role : {node_role::scheduler, node_role::server, node_role::worker})
    BOOST_TEST((parse_role(to_string(role)) == role));
  BOOST_TEST(!parse_role("Worker").has_value());
}

BOOST_AUTO_TEST_SUITE_END()
