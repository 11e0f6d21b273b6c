#pragma once
// The one bridge between a caller's thread and troupe's actors (docs/architecture.md):
// completion<T>, which a blocking facade hands an actor with its request and waits on. It lives
// in actors/logic/completion.hpp, without CAF, so that the logic an actor runs (the KVStore
// worker's rules, actors/logic/worker_core.hpp) delivers to callers as the actor would.

#include "actors/logic/completion.hpp"
