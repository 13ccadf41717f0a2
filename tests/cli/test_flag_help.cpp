// The closest-flag suggestion of unknown flags (cli/flag_help.h) and the help groups.
#include <gtest/gtest.h>

#include "ampipe/cli/flag_help.h"

using namespace ampipe::cli;

TEST(FlagHelp, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("--hiden-size", "--hidden-size"), 1u);    // one insertion
  EXPECT_EQ(edit_distance("--seq-lenght", "--seq-length"), 2u);     // a swap is two substitutions
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(FlagHelp, ClosestFlagOrNone) {
  CLI::App app;
  int x = 0;
  app.add_option("--hidden-size", x);
  app.add_option("--hidden-dropout", x);
  app.add_option("--seq-length", x);
  EXPECT_EQ(closest_flag(app, "--hiden-size"), "--hidden-size");
  EXPECT_EQ(closest_flag(app, "--seq-lenght=64"), "--seq-length");  // the value after '=' is not compared
  EXPECT_EQ(closest_flag(app, "--hidden-dropuot"), "--hidden-dropout");
  EXPECT_EQ(closest_flag(app, "--zzzzzz"), "");                    // nothing close: no suggestion
  EXPECT_EQ(closest_flag(app, "--seq-len"), "--seq-length");        // a prefix
}

TEST(FlagHelp, NoOppositeAndNothingFar) {
  CLI::App app;
  int x = 0;
  app.add_option("--add-bias-linear", x);
  app.add_option("--use-rts", x);
  app.add_option("--sequence-parallel", x);
  app.add_option("--num-layers", x);
  EXPECT_EQ(closest_flag(app, "--disable-bias-linear"), "");
  EXPECT_EQ(closest_flag(app, "--no-add-bias-linear"), "");
  EXPECT_EQ(closest_flag(app, "--no-use-rts"), "");
  EXPECT_EQ(closest_flag(app, "--no-sequence-parallel"), "");
  EXPECT_EQ(closest_flag(app, "--num-workers"), "");  // 4 edits: too far
  EXPECT_EQ(closest_flag(app, "--sequence-paralel"), "--sequence-parallel");
}

TEST(FlagHelp, GroupsFollowMegatron) {
  CLI::App app;
  int x = 0;
  app.add_option("--hidden-size", x);
  app.add_option("--lr-decay-style", x);
  app.add_option("--not-a-known-flag", x);
  group_flags(app);
  EXPECT_EQ(app.get_option("--hidden-size")->get_group(), "Model");
  EXPECT_EQ(app.get_option("--lr-decay-style")->get_group(), "Learning rate");
  EXPECT_EQ(app.get_option("--not-a-known-flag")->get_group(), "Options");
}
