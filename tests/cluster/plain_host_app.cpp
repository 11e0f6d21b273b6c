// plain_host_app: a host app that creates a dist KVStore without calling serve_if_node_role
// first, for the test that such an app, started as a server or scheduler (DMLC_ROLE), gets a
// clear error from kvstore::create instead of serving or vanishing.
//
//   DMLC_ROLE=server ... plain_host_app [TYPE]   (TYPE: dist_sync by default)
//
// Prints "plain_host_app: rank R of N" and exits 0 when it got a store (it is a worker); prints
// create's error on stderr and exits 1 otherwise.

#include <iostream>
#include <string>

#include "actors/kvstore/kvstore.hpp"

int main(int argc, char** argv) {
  const std::string type = argc > 1 ? argv[1] : "dist_sync";
  auto created = troupe::kvstore::create(type);
  if (!created) {
    std::cerr << "plain_host_app: " << created.error().to_string() << "\n";
    return 1;
  }
  std::cout << "plain_host_app: rank " << (*created)->rank() << " of " << (*created)->num_workers()
            << "\n";
  return 0;
}
