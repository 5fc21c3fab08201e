// GapModel bins and counts, SessionTable's lifecycle bookkeeping, and the
// ReturnPredictor built from them, on a ManualClock.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "policy/clock.h"
#include "policy/gap_model.h"
#include "policy/return_predictor.h"
#include "policy/session_table.h"
#include "tests/policy/fake_placement_view.h"

namespace kvtier::policy {
namespace {

using fake::hashes_of;
using fake::kLayout;

TEST(GapModelTest, BinsAreLogSpacedFromOneSecond) {
  EXPECT_EQ(GapModel::bin_of(0), 0);
  EXPECT_EQ(GapModel::bin_of(999), 0);
  EXPECT_EQ(GapModel::bin_of(1'000), 1);
  EXPECT_EQ(GapModel::bin_of(1'499), 1);
  EXPECT_EQ(GapModel::bin_of(1'500), 2);
  EXPECT_EQ(GapModel::bin_of(2'250), 3);
  EXPECT_EQ(GapModel::bin_of(1e12), GapModel::kBins - 1);  // open-ended last bin
  for (int b = 1; b < GapModel::kBins - 1; ++b) {
    EXPECT_EQ(GapModel::bin_of(GapModel::bin_start_ms(b)), b);
    EXPECT_DOUBLE_EQ(GapModel::bin_end_ms(b), GapModel::bin_start_ms(b + 1));
  }
  EXPECT_TRUE(std::isinf(GapModel::bin_end_ms(GapModel::kBins - 1)));
}

TEST(GapModelTest, CountsReturnsAndCensoredPeriodsPerStratum) {
  GapModel model;
  model.record_return(0, 10'000);
  model.record_return(5, 10'000);  // stratum 2: twice or more
  model.record_censored(1, 60'000);
  EXPECT_EQ(model.returns_in(0, GapModel::bin_of(10'000)), 1);
  EXPECT_EQ(model.returns_in(2, GapModel::bin_of(10'000)), 1);
  EXPECT_EQ(model.censored_in(1, GapModel::bin_of(60'000)), 1);
  EXPECT_EQ(model.total_returns(), 2u);
  EXPECT_NEAR(model.mean_log_gap(), std::log(10'001.0), 1e-9);
}

TEST(SessionLifecycleTest, ReturnsRecordGapsAndClosingIdleIsCensored) {
  ManualClock clock(1'000);
  SessionTable table(clock);
  Session& s = *table.get_or_create(7, "s", kLayout).value();
  (void)table.record_save(s, hashes_of({1}), true);  // idle from 1000
  clock.set_ms(5'000);
  table.record_activity(s);  // BeginTurn: back after 4 s
  EXPECT_EQ(s.returns, 1u);
  EXPECT_NEAR(s.sum_log_gap, std::log(4'001.0), 1e-9);
  table.record_activity(s);  // already active: not another return
  EXPECT_EQ(s.returns, 1u);
  (void)table.record_save(s, hashes_of({2}), true);  // idle from 5000
  clock.set_ms(6'000);
  (void)table.record_save(s, hashes_of({3}), true);  // a turn with no BeginTurn also returns
  EXPECT_EQ(s.returns, 2u);
  const GapModel& model = table.gap_model();
  EXPECT_EQ(model.returns_in(0, GapModel::bin_of(4'000)), 1);
  EXPECT_EQ(model.returns_in(1, GapModel::bin_of(1'000)), 1);
  EXPECT_EQ(model.total_returns(), 2u);

  clock.set_ms(66'000);  // idle 60 s, then closed: stayed away at least that long
  ASSERT_TRUE(table.close(7, "s").is_ok());
  EXPECT_EQ(model.censored_in(2, GapModel::bin_of(60'000)), 1);
  EXPECT_EQ(table.get_or_create(7, "d", kLayout).value()->priority, kDefaultPriority);
  table.set_priority(*table.find(7, "d"), 90);
  EXPECT_EQ(table.find(7, "d")->priority, 90);
}

class ReturnPredictorTest : public ::testing::Test {
 protected:
  Session& idle_session(const std::string& id, uint32_t returns, uint64_t since_ms) {
    clock_.set_ms(since_ms);
    Session& s = *table_.get_or_create(kLayout.namespace_id, id, kLayout).value();
    (void)table_.record_save(s, hashes_of({1}), true);
    s.returns = returns;  // as if it had come back that often, at the population's pace
    s.sum_log_gap = returns * std::log(10'001.0);
    return s;
  }

  ManualClock clock_{0};
  SessionTable table_{clock_};
};

TEST_F(ReturnPredictorTest, WithoutDataThePriorSaysHalfComeBackWithinAnHour) {
  Session& s = idle_session("s", 0, 0);
  ReturnPredictor predictor(table_, 0);
  EXPECT_NEAR(predictor.probability_within(s, 3'600'000), 0.5, 0.1);
  EXPECT_NEAR(predictor.probability_ever(s), 0.5, 0.1);
  EXPECT_LT(predictor.probability_within(s, 10'000), predictor.probability_within(s, 600'000));
}

TEST_F(ReturnPredictorTest, LearnsWhoComesBackAndWhen) {
  // 40 regulars come back after 10 s, four times; 40 one-shots never come back.
  const uint64_t t = fake::teach_population(clock_, table_, 40, 4, 10'000, 40, 3'600'000, 0);
  Session& fresh = idle_session("fresh", 0, t);
  Session& regular = idle_session("regular", 3, t);
  ReturnPredictor now(table_, t);
  // Half of first idle periods end in a return, all within ~10 s.
  EXPECT_NEAR(now.probability_ever(fresh), 0.5, 0.1);
  EXPECT_NEAR(now.probability_within(fresh, 20'000), 0.5, 0.1);
  // A session that came back before does so again.
  EXPECT_GT(now.probability_within(regular, 20'000), 0.85);
  EXPECT_GT(now.probability_within(regular, 20'000), now.probability_within(fresh, 20'000));
  // Once well past the usual gap, a return has become unlikely.
  ReturnPredictor later(table_, t + 120'000);
  EXPECT_LT(later.probability_ever(fresh), 0.1);
  EXPECT_LT(later.probability_within(regular, 20'000), 0.3);
  // Active sessions are certain; the median return of a regular is about the gap.
  table_.record_activity(regular);
  EXPECT_EQ(now.probability_within(regular, 1), 1.0);
  EXPECT_EQ(now.median_return_in_ms(regular), 0.0);
  EXPECT_NEAR(now.median_return_in_ms(fresh), 10'000, 4'000);
}

TEST_F(ReturnPredictorTest, SessionsIdleNowCountAgainstReturning) {
  const uint64_t t = fake::teach_population(clock_, table_, 20, 1, 10'000, 0, 0, 0);
  Session& probe = idle_session("probe", 0, t);
  const double before = ReturnPredictor(table_, t + 1).probability_ever(probe);
  // 60 sessions idle for a minute and still away: they are censored observations.
  for (int i = 0; i < 60; ++i) (void)idle_session("away-" + std::to_string(i), 0, t);
  const double after = ReturnPredictor(table_, t + 60'000).survival(0, 30'000);
  EXPECT_GT(before, 0.8);
  EXPECT_GT(after, 0.6);  // most first idle periods now last past 30 s
}

TEST_F(ReturnPredictorTest, ASessionsOwnRhythmStretchesThePopulationCurve) {
  const uint64_t t = fake::teach_population(clock_, table_, 40, 3, 60'000, 0, 0, 0);
  Session& typical = idle_session("typical", 2, t);
  typical.sum_log_gap = 2 * std::log(60'001.0);  // the population's pace
  Session& quick = idle_session("quick", 2, t);
  quick.sum_log_gap = 2 * std::log(6'001.0);  // answers ten times faster than others
  ReturnPredictor predictor(table_, t + 5'000);
  EXPECT_GT(predictor.probability_within(quick, 10'000),
            predictor.probability_within(typical, 10'000) + 0.2);
  EXPECT_LT(predictor.median_return_in_ms(quick), predictor.median_return_in_ms(typical));
}

}  // namespace
}  // namespace kvtier::policy
