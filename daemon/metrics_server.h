// MetricsServer: a small HTTP/1.1 server (Boost.Beast) for Prometheus scrapes.
// GET /metrics answers with the text `render` returns (Prometheus text format 0.0.4);
// GET / says where the metrics are; anything else is 404 or 405.
//
// Limits: requests with a body or headers over 8 KiB are refused, at most 16 scrapes
// at once (further connections are closed), and an idle connection is dropped after
// 30 s, so a slow or hostile client cannot pin the daemon's resources.
//
// Thread-safety: runs on the control thread's io_context; `render` is called there, so
// it may read the daemon's state without locks.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvtier::daemon {

class MetricsServer {
 public:
  MetricsServer(boost::asio::io_context& io, std::function<std::string()> render);
  ~MetricsServer();

  // Binds HOST:PORT (port 0 picks a free one). ResourceExhausted when the address is
  // in use, InvalidArgument when it is malformed.
  Status listen(const std::string& host_port);
  // The bound address ("127.0.0.1:9478"); empty before listen().
  std::string address() const;
  // Stops accepting and closes every scrape connection.
  void stop();

 private:
  class Session;
  void accept_next();

  std::function<std::string()> render_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::vector<std::weak_ptr<Session>> sessions_;
};

}  // namespace kvtier::daemon
