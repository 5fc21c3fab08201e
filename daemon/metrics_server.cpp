#include "daemon/metrics_server.h"

#include <boost/asio/ip/address.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <charconv>

#include "common/log.h"

namespace kvtier::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kMaxSessions = 16;
constexpr std::chrono::seconds kIdleTimeout{30};
constexpr uint32_t kHeaderLimitBytes = 8 * 1024;

}  // namespace

// One scrape connection: read a request, write the answer, repeat while keep-alive.
class MetricsServer::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const std::function<std::string()>& render)
      : stream_(std::move(socket)), render_(render) {}

  void start() { read_next(); }
  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

 private:
  void read_next() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimitBytes);
    parser_->body_limit(0);
    stream_.expires_after(kIdleTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->close();
                       self->answer(self->parser_->release());
                     });
  }

  void answer(const http::request<http::empty_body>& request) {
    auto response = std::make_shared<http::response<http::string_body>>();
    response->version(request.version());
    response->keep_alive(request.keep_alive());
    response->set(http::field::server, "kvtierd");
    const std::string_view target(request.target().data(), request.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      response->result(http::status::method_not_allowed);
      response->set(http::field::allow, "GET, HEAD");
      response->body() = "only GET and HEAD\n";
    } else if (path == "/metrics") {
      response->result(http::status::ok);
      response->set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response->body() = render_();
    } else if (path == "/") {
      response->result(http::status::ok);
      response->set(http::field::content_type, "text/plain; charset=utf-8");
      response->body() = "kvtierd: Prometheus metrics are at /metrics\n";
    } else {
      response->result(http::status::not_found);
      response->body() = "not found; the metrics are at /metrics\n";
    }
    response->prepare_payload();
    if (request.method() == http::verb::head) response->body().clear();
    stream_.expires_after(kIdleTimeout);
    http::async_write(stream_, *response,
                      [self = shared_from_this(), response](beast::error_code ec, size_t) {
                        if (ec || !response->keep_alive()) return self->close();
                        self->read_next();
                      });
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::empty_body>> parser_;
  const std::function<std::string()>& render_;
};

MetricsServer::MetricsServer(asio::io_context& io, std::function<std::string()> render)
    : render_(std::move(render)), acceptor_(io) {}

MetricsServer::~MetricsServer() {
  stop();
}

Status MetricsServer::listen(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return invalid_argument("'{}' is not HOST:PORT", host_port);
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  unsigned short port = 0;
  const std::string port_text = host_port.substr(colon + 1);
  auto [end, parsed] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec || parsed != std::errc() || end != port_text.data() + port_text.size()) {
    return invalid_argument("'{}' is not IP:PORT", host_port);
  }
  const tcp::endpoint endpoint(address, port);
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    acceptor_.close();
    return errno_status(ec.value(), "listen on " + host_port);
  }
  accept_next();
  return Status::ok();
}

std::string MetricsServer::address() const {
  if (!acceptor_.is_open()) return "";
  beast::error_code ec;
  const auto endpoint = acceptor_.local_endpoint(ec);
  if (ec) return "";
  if (endpoint.address().is_v6()) {
    return fmt::format("[{}]:{}", endpoint.address().to_string(), endpoint.port());
  }
  return fmt::format("{}:{}", endpoint.address().to_string(), endpoint.port());
}

void MetricsServer::stop() {
  beast::error_code ignored;
  acceptor_.close(ignored);
  for (const auto& weak : sessions_) {
    if (auto session = weak.lock()) session->close();
  }
  sessions_.clear();
}

void MetricsServer::accept_next() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      KVTIER_LOG_WARN("metrics: accept failed: {}", ec.message());
    } else {
      std::erase_if(sessions_, [](const auto& weak) { return weak.expired(); });
      if (sessions_.size() >= kMaxSessions) {
        KVTIER_LOG_DEBUG("metrics: {} scrapes open; closing a new connection", kMaxSessions);
      } else {
        auto session = std::make_shared<Session>(std::move(socket), render_);
        sessions_.push_back(session);
        session->start();
      }
    }
    accept_next();
  });
}

}  // namespace kvtier::daemon
