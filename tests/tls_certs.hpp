#pragma once
// Certificates for the TLS tests, made by the project's own scripts/make-tls-certs.sh (so the
// script is tested too) into temp dirs of the test process: the job's CA with a certificate and
// key per role, and another CA with the same, whose certificates no node of the job may accept.

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <spawn.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/temp_dir.hpp"

extern char** environ;

namespace troupe::testing {

/// A CA and one certificate per role (dir/ca.crt; dir/ROLE.crt and dir/ROLE.key).
class tls_certs {
public:
  /// Runs scripts/make-tls-certs.sh DIR (within 60 s, else it is killed by its pid).
  tls_certs() {
    const std::string script = TROUPE_MAKE_TLS_CERTS;
    const std::string out = dir_.path().string();
    const std::string log = (dir_ / "make-tls-certs.log").string();
    std::vector<char*> argv{const_cast<char*>(script.c_str()), const_cast<char*>(out.c_str()),
                            nullptr};
    posix_spawn_file_actions_t files;
    posix_spawn_file_actions_init(&files);
    posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, script.c_str(), &files, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&files);
    BOOST_TEST_REQUIRE(spawned == 0, "cannot run " << script);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        BOOST_FAIL(script << " did not finish within 60 s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    BOOST_TEST_REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0),
                       script << " failed; see " << log);
  }

  std::string ca() const { return (dir_ / "ca.crt").string(); }
  std::string cert(const std::string& role) const { return (dir_ / (role + ".crt")).string(); }
  std::string key(const std::string& role) const { return (dir_ / (role + ".key")).string(); }
  /// "DIR/{role}.crt": the form a cluster file gives every role at once.
  std::string cert_pattern() const { return (dir_ / "{role}.crt").string(); }
  std::string key_pattern() const { return (dir_ / "{role}.key").string(); }
  const std::filesystem::path& dir() const { return dir_.path(); }

private:
  temp_dir dir_;
};

/// The job's certificates, made once per test process.
inline const tls_certs& job_certs() {
  static const tls_certs certs;
  return certs;
}

/// Another CA's certificates, made once per test process.
inline const tls_certs& other_certs() {
  static const tls_certs certs;
  return certs;
}

/// A TLS peer no port of a job may let in (it trusts the job's CA), and the alert it must get.
struct tls_stranger {
  const char* what;
  std::string cert;
  std::string key;
  const char* alert;
};

/// Another CA's worker, a peer without a certificate, and one with the scheduler's certificate,
/// a role no port takes from a connector.
inline std::vector<tls_stranger> tls_strangers() {
  return {{"another CA's worker certificate", other_certs().cert("worker"),
           other_certs().key("worker"), "unknown ca"},
          {"no certificate", "", "", "certificate required"},
          {"the scheduler's certificate", job_certs().cert("scheduler"),
           job_certs().key("scheduler"), "alert"}};
}

} // namespace troupe::testing
