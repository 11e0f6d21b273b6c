#include "actors/gluon/update_policy.hpp"

#include <string>

namespace troupe {

result<bool> resolve_update_on_kvstore(std::string_view kvstore_type, bool optimizer_capable,
                                       std::optional<bool> user_choice) {
  // model.py::_create_kvstore:
  //   update_on_kvstore = bool(int(os.getenv('MXNET_UPDATE_ON_KVSTORE', "1")))
  //   ...
  //   update_on_kvstore &= kv.is_capable(kvs.KVStoreBase.OPTIMIZER)
  // The capability is applied below, after the async rule, where trainer.py applies it again
  // (the result is the same: the async rule only ever sets true, and rule 4 clears it).
  bool update_on_kvstore = true;

  // trainer.py::_init_kvstore (dense weight, dense gradient):
  //   self._distributed = 'dist' in kvstore.type if kvstore else False
  //   if self._distributed and 'async' in kvstore.type:
  //       update_on_kvstore = True
  //       if config['update_on_kvstore'] is False:
  //           raise ValueError("Please set update_on_kvstore=True "
  //                            "when training in async mode.")
  const bool distributed = kvstore_type.find("dist") != std::string_view::npos;
  if (distributed && kvstore_type.find("async") != std::string_view::npos) {
    update_on_kvstore = true;
    if (user_choice == false)
      return error{errc::invalid_argument,
                   "kvstore '" + std::string(kvstore_type) +
                       "' was given update_on_kvstore=False. Please set update_on_kvstore=True "
                       "when training in async mode."};
  }

  //   if config['update_on_kvstore'] is not None:
  //       update_on_kvstore = config['update_on_kvstore']
  if (user_choice.has_value())
    update_on_kvstore = *user_choice;

  //   if update_on_kvstore and not kvstore.is_capable('optimizer'):
  //       if config['update_on_kvstore']:
  //           raise ValueError("Please set update_on_kvstore=False "
  //                            "when training with {}".format(type(kvstore)))
  //       update_on_kvstore = False
  if (update_on_kvstore && !optimizer_capable) {
    if (user_choice == true)
      return error{errc::invalid_argument,
                   "Please set update_on_kvstore=False when training with kvstore '" +
                       std::string(kvstore_type) +
                       "', which is not capable of running the optimizer."};
    update_on_kvstore = false;
  }
  return update_on_kvstore;
}

} // namespace troupe
