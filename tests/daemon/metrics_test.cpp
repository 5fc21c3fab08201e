// The Prometheus text kvtierd writes, and the HTTP server that serves it, over a real
// loopback TCP connection.
#include <gtest/gtest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <thread>

#include "daemon/metrics.h"
#include "daemon/metrics_server.h"
#include "schema/kvtier.capnp.h"

namespace kvtier::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

TEST(LatencyHistogram, BucketsAreCumulativeInTheText) {
  LatencyHistogram h;
  h.observe(10e-6);  // first bucket
  h.observe(0.003);  // ≤ 5 ms
  h.observe(100.0);  // only +Inf
  PrometheusText out;
  out.family("x_seconds", "histogram", "test");
  out.histogram("x_seconds", "op=\"save\"", h);
  const std::string& text = out.text();
  EXPECT_NE(text.find("# TYPE x_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{op=\"save\",le=\"2.5e-05\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{op=\"save\",le=\"0.0025\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{op=\"save\",le=\"0.005\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{op=\"save\",le=\"10\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_bucket{op=\"save\",le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_count{op=\"save\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("x_seconds_sum{op=\"save\"} 100.00301"), std::string::npos);
}

TEST(RequestMetrics, NamesComeFromTheSchemaAndErrorsAreByCode) {
  const size_t save = wire::Request::SAVE;
  EXPECT_EQ(request_kind_name(wire::Request::HELLO), "hello");
  EXPECT_EQ(request_kind_name(save), "save");
  EXPECT_EQ(request_kind_name(wire::Request::LIST_SESSIONS), "listSessions");
  EXPECT_EQ(request_kind_name(wire::Request::GET_CONFIG), "getConfig");
  EXPECT_EQ(request_kind_name(RequestMetrics::kUnknownKind), "unknown");
  RequestMetrics metrics;
  metrics.observe(save, std::chrono::microseconds(40), StatusCode::kOk);
  metrics.observe(save, std::chrono::microseconds(80), StatusCode::kResourceExhausted);
  metrics.count_hit(Tier::kRam);
  metrics.count_reload(false);
  PrometheusText out;
  metrics.render(out);
  const std::string& text = out.text();
  EXPECT_NE(text.find("kvtier_request_duration_seconds_count{op=\"save\"} 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("kvtier_request_errors_total{op=\"save\",code=\"resource_exhausted\"} 1\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvtier_lookup_hits_by_tier_total{tier=\"ram\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_config_reloads_total{result=\"failed\"} 1\n"), std::string::npos);
  EXPECT_EQ(text.find("op=\"hello\""), std::string::npos) << "kinds never seen are left out";
}

// A Lookup's blocks found in the remote tier count as remote hits, not as another tier's.
TEST(RequestMetrics, RemoteHitsHaveTheirOwnLabel) {
  RequestMetrics metrics;
  metrics.count_hit(Tier::kRemote);
  metrics.count_hit(Tier::kRemote);
  metrics.count_hit(Tier::kNvme);
  PrometheusText out;
  metrics.render(out);
  const std::string& text = out.text();
  EXPECT_NE(text.find("kvtier_lookup_hits_by_tier_total{tier=\"remote\"} 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("kvtier_lookup_hits_by_tier_total{tier=\"nvme\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvtier_lookup_hits_by_tier_total{tier=\"hbm\"} 0\n"), std::string::npos);
}

// A MetricsServer on its own io_context thread, and a plain HTTP client.
class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<MetricsServer>(io_, [this] {
      ++renders_;
      return std::string("kvtier_test_metric 42\n");
    });
    ASSERT_TRUE(server_->listen("127.0.0.1:0").is_ok());
    address_ = server_->address();
    thread_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    asio::post(io_, [this] { server_->stop(); });
    thread_.join();
  }

  tcp::socket connect() {
    tcp::socket socket(client_io_);
    const auto colon = address_.rfind(':');
    socket.connect(
        tcp::endpoint(asio::ip::make_address(address_.substr(0, colon)),
                      static_cast<unsigned short>(std::stoi(address_.substr(colon + 1)))));
    return socket;
  }

  http::response<http::string_body> request(tcp::socket& socket, http::verb verb,
                                            const std::string& target) {
    http::request<http::empty_body> req{verb, target, 11};
    req.set(http::field::host, address_);
    http::write(socket, req);
    beast::flat_buffer buffer;
    http::response<http::string_body> response;
    if (verb == http::verb::head) {
      http::response_parser<http::string_body> parser;
      parser.skip(true);
      http::read(socket, buffer, parser);
      return parser.release();
    }
    http::read(socket, buffer, response);
    return response;
  }

  asio::io_context io_{1};
  asio::io_context client_io_;
  std::unique_ptr<MetricsServer> server_;
  std::string address_;
  std::thread thread_;
  std::atomic<int> renders_{0};
};

TEST_F(MetricsServerTest, ServesMetricsAndRefusesTheRest) {
  EXPECT_EQ(address_.rfind("127.0.0.1:", 0), 0u) << address_;
  auto socket = connect();
  auto metrics = request(socket, http::verb::get, "/metrics");
  EXPECT_EQ(metrics.result(), http::status::ok);
  EXPECT_EQ(metrics.body(), "kvtier_test_metric 42\n");
  EXPECT_NE(std::string(metrics[http::field::content_type]).find("version=0.0.4"),
            std::string::npos);
  // Keep-alive: the same connection serves the next scrape.
  EXPECT_EQ(request(socket, http::verb::get, "/metrics?x=1").result(), http::status::ok);
  EXPECT_EQ(request(socket, http::verb::get, "/").result(), http::status::ok);
  EXPECT_EQ(request(socket, http::verb::get, "/sessions").result(), http::status::not_found);
  EXPECT_EQ(request(socket, http::verb::post, "/metrics").result(),
            http::status::method_not_allowed);
  auto head = request(socket, http::verb::head, "/metrics");
  EXPECT_EQ(head.result(), http::status::ok);
  EXPECT_EQ(renders_.load(), 3);
}

TEST_F(MetricsServerTest, OversizedHeadersCloseTheConnection) {
  auto socket = connect();
  const std::string huge =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(64 * 1024, 'a') + "\r\n\r\n";
  boost::system::error_code ec;
  asio::write(socket, asio::buffer(huge), ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(socket, buffer, response, ec);
  EXPECT_TRUE(ec) << "the server answered a request with 64 KiB of headers";
  // And it still serves others.
  auto fresh = connect();
  EXPECT_EQ(request(fresh, http::verb::get, "/metrics").result(), http::status::ok);
}

TEST(MetricsServer, AnAddressInUseIsReported) {
  asio::io_context io;
  MetricsServer first(io, [] { return std::string(); });
  ASSERT_TRUE(first.listen("127.0.0.1:0").is_ok());
  MetricsServer second(io, [] { return std::string(); });
  Status taken = second.listen(first.address());
  EXPECT_FALSE(taken.is_ok());
  EXPECT_NE(taken.message().find(first.address()), std::string::npos) << taken.to_string();
  EXPECT_EQ(second.listen("localhost:1").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::daemon
