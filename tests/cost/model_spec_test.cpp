#include "dynapipe/cost/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dynapipe/core/error.h"

namespace dynapipe {
namespace {

using ::testing::HasSubstr;

// Runs `body`, expects an Error of `kind` whose message contains every fragment.
template <typename Body>
void expect_error(Body body, ErrorKind kind, std::initializer_list<std::string> fragments) {
  try {
    body();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& f : fragments) EXPECT_THAT(e.what(), HasSubstr(f));
  }
}

std::string write_temp(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("dynapipe_cost_test_" + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(ModelSpecTest, PaperPresetsHaveTheContractShapes) {
  const ModelSpec gpt = load_model_spec("gpt-6.7b");
  EXPECT_EQ(gpt.kind, ModelKind::Gpt);
  EXPECT_EQ(gpt.hidden, 4096);
  EXPECT_EQ(gpt.heads, 32);
  EXPECT_EQ(gpt.head_dim(), 128);
  EXPECT_EQ(gpt.ffn_hidden, 16384);
  EXPECT_EQ(gpt.layers, 32);
  EXPECT_EQ(gpt.dec_layers, 0);
  EXPECT_EQ(gpt.vocab, 50304);
  EXPECT_EQ(gpt.max_positions, 8192);

  const ModelSpec t5 = load_model_spec("t5-11b");
  EXPECT_EQ(t5.kind, ModelKind::T5);
  EXPECT_EQ(t5.hidden, 1024);
  EXPECT_EQ(t5.heads, 128);
  EXPECT_EQ(t5.kv_channels, 128);
  EXPECT_EQ(t5.attention_width(), 16384);
  EXPECT_EQ(t5.ffn_hidden, 65536);
  EXPECT_EQ(t5.layers, 24);
  EXPECT_EQ(t5.dec_layers, 24);
  EXPECT_EQ(t5.vocab, 32128);
}

TEST(ModelSpecTest, EveryPresetIsValidAndFitsTheByteTokenizer) {
  EXPECT_EQ(model_preset_names().size(), 6u);
  for (const auto& name : model_preset_names()) {
    const ModelSpec spec = load_model_spec(name);
    EXPECT_EQ(spec.name, name);
    EXPECT_NO_THROW(spec.validate());
    EXPECT_GE(spec.vocab, 259) << name;
    EXPECT_GE(spec.max_positions, 2048) << name;
  }
  // The tiny models must split over pp = 2 (and 4) for the CPU runtime tests.
  for (const char* name : {"gpt-tiny", "t5-tiny"}) {
    EXPECT_NO_THROW(assign_layers_uniform(load_model_spec(name), 2));
    EXPECT_NO_THROW(assign_layers_uniform(load_model_spec(name), 4));
  }
}

TEST(ModelSpecTest, ParameterCountsMatchHandComputedValues) {
  const ModelSpec gpt = load_model_spec("gpt-6.7b");
  // 4h^2 + 2hf (QKV, proj, MLP) + 9h + f (biases, two LNs).
  EXPECT_EQ(layer_parameter_count(gpt), 201'379'840);
  EXPECT_EQ(embedding_parameter_count(gpt), (50304 + 8192) * 4096);
  EXPECT_EQ(gpt.parameter_count(), 32 * 201'379'840LL + (50304 + 8192) * 4096LL + 2 * 4096);

  // The reference profile reports 402.9 MB (encoder) and 537.2 MB (decoder) of fp16
  // parameters per T5-11B layer.
  const ModelSpec t5 = load_model_spec("t5-11b");
  EXPECT_EQ(layer_parameter_count(t5), 201'447'424);
  EXPECT_EQ(decoder_layer_parameter_count(t5), 268'608'512);
}

TEST(ModelSpecTest, StageParametersAddUpWithOneTokenTableCopyForTheHead) {
  const ModelSpec gpt = load_model_spec("gpt-small");
  const auto one = assign_layers_uniform(gpt, 1);
  EXPECT_EQ(stage_parameter_count(gpt, one[0]), gpt.parameter_count());
  std::int64_t sum = 0;
  for (const auto& s : assign_layers_uniform(gpt, 4)) sum += stage_parameter_count(gpt, s);
  EXPECT_EQ(sum, gpt.parameter_count() + std::int64_t{gpt.vocab} * gpt.hidden);

  // T5 at pp 2: the decoder stage holds a second embedding (token + positions); its head
  // shares that stage's token table.
  const ModelSpec t5 = load_model_spec("t5-tiny");
  sum = 0;
  for (const auto& s : assign_layers_uniform(t5, 2)) sum += stage_parameter_count(t5, s);
  EXPECT_EQ(sum, t5.parameter_count() + embedding_parameter_count(t5));
}

TEST(LayerAssignmentTest, InterleavedVirtualStagesKeepEachDevicesLayerCount) {
  // t5-small: 4 encoder then 4 decoder layers. Devices hold 3 and 5 layers; 2 chunks give
  // virtual counts (chunk 0: 2, 3; chunk 1: 1, 2), run contiguously over the stack.
  const ModelSpec t5 = load_model_spec("t5-small");
  const auto stages = assign_layers_interleaved(t5, {3, 5}, 2);
  EXPECT_EQ(layers_per_stage(stages), (std::vector<int>{2, 3, 1, 2}));
  EXPECT_EQ(stages, assign_layers(t5, {2, 3, 1, 2}));
  EXPECT_EQ(stages[1].enc_begin, 2);
  EXPECT_EQ(stages[1].enc_end, 4);
  EXPECT_EQ(stages[1].dec_end, 1);
  EXPECT_TRUE(stages[1].has_dec_embedding);
  EXPECT_TRUE(stages[3].has_head);
  // Device d holds virtual stages d and d + 2: 2 + 1 and 3 + 2 layers.
  EXPECT_EQ(stages[0].num_layers() + stages[2].num_layers(), 3);
  EXPECT_EQ(stages[1].num_layers() + stages[3].num_layers(), 5);
  // An even split gives the uniform virtual stages.
  EXPECT_EQ(assign_layers_interleaved(t5, {4, 4}, 2), assign_layers_uniform(t5, 4));
  EXPECT_THROW(assign_layers_interleaved(t5, {1, 7}, 2), Error);
  EXPECT_THROW(assign_layers_interleaved(t5, {}, 2), Error);
}

TEST(LayerAssignmentTest, Gpt32LayersOverFourStagesGetEightEach) {
  const auto stages = assign_layers_uniform(load_model_spec("gpt-6.7b"), 4);
  ASSERT_EQ(stages.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(stages[i].enc_begin, 8 * i);
    EXPECT_EQ(stages[i].enc_end, 8 * i + 8);
    EXPECT_FALSE(stages[i].has_decoder());
    EXPECT_EQ(stages[i].has_embedding, i == 0);
    EXPECT_EQ(stages[i].has_head, i == 3);
    EXPECT_FALSE(stages[i].has_dec_embedding);
  }
}

TEST(LayerAssignmentTest, T5SplitsEncoderThenDecoder) {
  const auto stages = assign_layers_uniform(load_model_spec("t5-11b"), 4);
  ASSERT_EQ(stages.size(), 4u);
  EXPECT_EQ(stages[0], (StageLayers{.enc_begin = 0, .enc_end = 12, .has_embedding = true}));
  EXPECT_EQ(stages[1], (StageLayers{.enc_begin = 12, .enc_end = 24}));
  EXPECT_EQ(stages[2], (StageLayers{.enc_begin = 24, .enc_end = 24, .dec_begin = 0, .dec_end = 12,
                                    .has_dec_embedding = true}));
  EXPECT_EQ(stages[3], (StageLayers{.enc_begin = 24, .enc_end = 24, .dec_begin = 12, .dec_end = 24,
                                    .has_head = true}));
}

TEST(LayerAssignmentTest, UnevenSplitsGiveTheFirstStagesOneMore) {
  auto sizes = [](const std::vector<StageLayers>& stages) {
    std::vector<int> n;
    for (const auto& s : stages) n.push_back(s.num_layers());
    return n;
  };
  EXPECT_EQ(sizes(assign_layers_uniform(load_model_spec("gpt-tiny"), 3)), (std::vector<int>{2, 1, 1}));
  EXPECT_EQ(sizes(assign_layers_uniform(load_model_spec("gpt-6.7b"), 5)), (std::vector<int>{7, 7, 6, 6, 6}));

  // t5-small is 4 + 4: over 3 stages the middle one straddles the encoder/decoder border.
  const auto t5 = assign_layers_uniform(load_model_spec("t5-small"), 3);
  EXPECT_EQ(sizes(t5), (std::vector<int>{3, 3, 2}));
  EXPECT_EQ(t5[1], (StageLayers{.enc_begin = 3, .enc_end = 4, .dec_begin = 0, .dec_end = 2,
                                .has_dec_embedding = true}));
  EXPECT_EQ(t5[2].dec_begin, 2);
  EXPECT_EQ(t5[2].dec_end, 4);
  EXPECT_TRUE(t5[2].has_head);
  EXPECT_FALSE(t5[2].has_dec_embedding);

  // One stage holds everything.
  const auto single = assign_layers_uniform(load_model_spec("t5-tiny"), 1);
  EXPECT_TRUE(single[0].has_embedding && single[0].has_dec_embedding && single[0].has_head);
  EXPECT_EQ(single[0].num_layers(), 4);
}

TEST(LayerAssignmentTest, MoreStagesThanLayersIsAnError) {
  expect_error([] { assign_layers_uniform(load_model_spec("gpt-tiny"), 5); }, ErrorKind::InvalidArgument,
               {"at most the 4 layers", "gpt-tiny", "got 5"});
  expect_error([] { assign_layers_uniform(load_model_spec("gpt-tiny"), 0); }, ErrorKind::InvalidArgument,
               {">= 1", "got 0"});
}

TEST(ModelSpecTest, UnknownNameIsNotFoundAndListsPresets) {
  expect_error([] { load_model_spec("gpt-7b"); }, ErrorKind::NotFound, {"gpt-7b", "gpt-tiny", "t5-11b"});
}

TEST(ModelSpecTest, LoadsAJsonFileAndRoundTrips) {
  const std::string path = write_temp("model.json", R"({"kind": "t5", "hidden": 64, "heads": 2,
      "ffn_hidden": 128, "layers": 1, "dec_layers": 3, "vocab": 300, "max_positions": 512})");
  const ModelSpec spec = load_model_spec(path);
  EXPECT_EQ(spec.name, "dynapipe_cost_test_model");  // the file's stem
  EXPECT_EQ(spec.kind, ModelKind::T5);
  EXPECT_EQ(spec.head_dim(), 32);
  EXPECT_EQ(spec.total_layers(), 4);
  EXPECT_EQ(parse_model_spec(model_spec_to_json(spec), "round trip"), spec);
  const ModelSpec big = load_model_spec("t5-11b");
  EXPECT_EQ(parse_model_spec(model_spec_to_json(big), "round trip"), big);
}

TEST(ModelSpecTest, MalformedFilesNameTheField) {
  expect_error([] { parse_model_spec(R"({"kind": "gpt", "hidden": 64})", "m.json"); }, ErrorKind::ParseError,
               {"m.json", "heads must be present"});
  expect_error([] { parse_model_spec(R"({"kind": "bert"})", "m.json"); }, ErrorKind::ParseError,
               {"kind must be \"gpt\" or \"t5\"", "\"bert\""});
  expect_error(
      [] {
        parse_model_spec(R"({"kind": "gpt", "hidden": 64, "heads": 0, "ffn_hidden": 1, "layers": 1,
                            "vocab": 1, "max_positions": 1})", "m.json");
      },
      ErrorKind::ParseError, {"heads must be an integer in [1,", "got 0"});
  expect_error(
      [] {
        parse_model_spec(R"({"kind": "gpt", "hidden": 64, "heads": 4, "ffn_hidden": 1, "layers": 1,
                            "vocab": 1, "max_positions": 1, "hiden": 3})", "m.json");
      },
      ErrorKind::ParseError, {"m.json: hiden must be absent (not a field here; the fields are name, kind, hidden,", "got 3"});
  expect_error([] { parse_model_spec("{not json", "m.json"); }, ErrorKind::ParseError, {"m.json: the document must be valid JSON, got parse error at line 1"});
  expect_error([] { parse_model_spec(R"({"kind": "gpt", "hidden": 25769E803776})", "m.json"); }, ErrorKind::ParseError,
               {"m.json: hidden must be a number a double can hold, got 25769E803776"});
  expect_error([] { parse_model_spec(R"({"kind": "gpt", "hidden": "64"})", "m.json"); }, ErrorKind::ParseError,
               {"m.json: hidden must be an integer in [1, 1073741824], got \"64\""});
  // Well-formed but inconsistent: validate() names the field.
  expect_error(
      [] {
        parse_model_spec(R"({"kind": "gpt", "hidden": 66, "heads": 4, "ffn_hidden": 1, "layers": 2,
                            "dec_layers": 0, "vocab": 1, "max_positions": 1})", "m.json");
      },
      ErrorKind::InvalidArgument, {"hidden must be a multiple of heads", "got 66"});
  expect_error(
      [] {
        parse_model_spec(R"({"kind": "t5", "hidden": 64, "heads": 4, "ffn_hidden": 1, "layers": 2,
                            "vocab": 1, "max_positions": 1})", "m.json");
      },
      ErrorKind::InvalidArgument, {"dec_layers must be >= 1 for a T5 model"});
}

}  // namespace
}  // namespace dynapipe
