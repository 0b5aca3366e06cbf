// KeyValue over any c10d::Store (the job's TCPStore), so the plan store can share the
// store the process groups rendezvous on. Private to runtime/ (includes c10d).
#pragma once

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

#include "dynapipe/runtime/plan_store.h"

namespace dynapipe::runtime {

std::unique_ptr<KeyValue> key_value_over(c10::intrusive_ptr<c10d::Store> store);

// The job's rendezvous store (store_server.h): rank 0 (`is_server`) hosts it on
// `bind_host`:port only, then every rank connects to host:port. Errors name the address.
c10::intrusive_ptr<c10d::Store> make_rendezvous_store(const std::string& host, int port, bool is_server,
                                                     const std::string& bind_host, Millis timeout);

// A LibTorch TCPStore at host:port (`--plan-store tcp://`; it listens on every interface) (server when `is_server`; port 0 then picks a free port).
c10::intrusive_ptr<c10d::Store> make_tcp_store(const std::string& host, int port, bool is_server,
                                              Millis timeout);
int tcp_store_port(const c10::intrusive_ptr<c10d::Store>& store);

}  // namespace dynapipe::runtime
