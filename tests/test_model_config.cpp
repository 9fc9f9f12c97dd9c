// dos-train's model shapes (examples/dos-train/model_config.h) against published parameter counts:
// the presets (Hugging Face's gpt2, Llama-2-7b-hf and Llama-2-13b-hf model cards and checkpoints),
// Mistral-7B-v0.1 and Mistral-NeMo (whose head_dim, 128, is not hidden / heads), Qwen2-7B and
// Qwen2.5-0.5B (q/k/v biases), Gemma-2B and Gemma-7B (head_dim 256, tied) from their config.json fields, and a small Llama-style decoder with head_dim, attention_bias and mlp_bias
// counted by hand. Two names of one field that disagree, and Llama-only fields on a gpt2 model,
// are refused; a checkpoint's description of a model without the new fields is as before.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

#include "cmocka_cpp.h"
#include "model_config.h"

using dos_train::ModelConfig;

namespace {

std::string g_dir;

/// Writes `json` to a file of the test's folder and returns its path.
std::string write_config(const std::string& name, const std::string& json) {
  const std::string path = g_dir + "/" + name;
  std::ofstream(path) << json;
  return path;
}

std::size_t count(const ModelConfig& c) { return dos_train::count_params(dos_train::param_tensors(c), c.name); }

/// The message of the std::runtime_error that load_hf_config throws for `path` ("" if none).
std::string refusal(const std::string& path) {
  try {
    dos_train::load_hf_config(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

void test_presets_published_counts(void**) {
  assert_int_equal(count(dos_train::preset("gpt2-124m")), 124439808);
  assert_int_equal(count(dos_train::preset("llama2-7b")), 6738415616ll);
  assert_int_equal(count(dos_train::preset("llama2-13b")), 13015864320ll);
  assert_string_equal(dos_train::describe_architecture(dos_train::preset("gpt2-124m")).c_str(),
                      "gpt2 layers 12 hidden 768 intermediate 3072 heads 12 kv_heads 12 vocab 50257 positions 1024 tied");
}

void test_mistral_configs(void**) {
  // Mistral-7B-v0.1's config.json (the fields that shape the parameters): 7,241,732,096
  const ModelConfig m7 = dos_train::load_hf_config(write_config(
      "mistral7b.json",
      R"({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
          "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000, "tie_word_embeddings": false,
          "max_position_embeddings": 32768})"));
  assert_int_equal(count(m7), 7241732096ll);
  // Mistral-NeMo-Base-2407: head_dim 128 where hidden / heads is 160: 12,247,782,400
  const ModelConfig nemo = dos_train::load_hf_config(write_config(
      "nemo.json",
      R"({"model_type": "mistral", "hidden_size": 5120, "head_dim": 128, "intermediate_size": 14336,
          "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "vocab_size": 131072,
          "tie_word_embeddings": false})"));
  assert_int_equal(count(nemo), 12247782400ll);
  const std::string d = dos_train::describe_architecture(nemo);
  assert_true(d.find(" head_dim 128") != std::string::npos);
  // a head_dim equal to hidden / heads (Llama-3's config.json writes it) changes nothing
  const ModelConfig same = dos_train::load_hf_config(write_config(
      "same.json",
      R"({"model_type": "llama", "hidden_size": 4096, "head_dim": 128, "intermediate_size": 14336,
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000})"));
  assert_int_equal(count(same), 7241732096ll);
  assert_true(dos_train::describe_architecture(same).find("head_dim") == std::string::npos);
}

void test_qwen2_and_gemma(void**) {
  // Qwen2-7B (q/k/v biases, o_proj none, untied): 7,615,616,512; Qwen2.5-0.5B (tied): 494,032,768
  const ModelConfig q7 = dos_train::load_hf_config(write_config(
      "qwen2-7b.json",
      R"({"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
          "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": false})"));
  assert_int_equal(count(q7), 7615616512ll);
  const ModelConfig q05 = dos_train::load_hf_config(write_config(
      "qwen25-05b.json",
      R"({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
          "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": true})"));
  assert_int_equal(count(q05), 494032768);
  for (const auto& t : dos_train::param_tensors(q05)) assert_true(t.name.find("o_proj.bias") == std::string::npos);
  // Gemma-2B and Gemma-7B (head_dim 256, embeddings tied by default): 2,506,172,416 and 8,537,680,896
  const ModelConfig g2 = dos_train::load_hf_config(write_config(
      "gemma-2b.json",
      R"({"model_type": "gemma", "hidden_size": 2048, "intermediate_size": 16384, "num_attention_heads": 8,
          "num_hidden_layers": 18, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 256000})"));
  assert_int_equal(count(g2), 2506172416ll);
  const ModelConfig g7 = dos_train::load_hf_config(write_config(
      "gemma-7b.json",
      R"({"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576, "num_attention_heads": 16,
          "num_hidden_layers": 28, "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 256000})"));
  assert_int_equal(count(g7), 8537680896ll);
}

void test_biases_and_head_dim_by_hand(void**) {
  // 2 layers, hidden 64, intermediate 128, 4 heads of 32 (q 128 wide), 2 kv heads (k, v 64 wide),
  // vocabulary 100, untied, every projection with a bias. Per layer: weights q 128x64, k 64x64,
  // v 64x64, o 64x128, gate 128x64, up 128x64, down 64x128 = 49152; biases 128 + 64 + 64 + 64 +
  // 128 + 128 + 64 = 640; two norms 128: 49920. Two layers 99840, embeddings and head 2 x 6400,
  // final norm 64: 112704.
  const ModelConfig c = dos_train::load_hf_config(write_config(
      "bias.json",
      R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 100,
          "attention_bias": true, "mlp_bias": true})"));
  assert_int_equal(count(c), 112704);
  bool q_bias = false, down_bias = false;
  for (const auto& t : dos_train::param_tensors(c)) {
    if (t.name == "model.layers.1.self_attn.q_proj.bias") q_bias = t.shape == std::vector<std::int64_t>{128};
    if (t.name == "model.layers.0.mlp.down_proj.bias") down_bias = t.shape == std::vector<std::int64_t>{64};
    if (t.name == "model.layers.0.self_attn.o_proj.weight") assert_true((t.shape == std::vector<std::int64_t>{64, 128}));
  }
  assert_true(q_bias && down_bias);
  assert_true(dos_train::describe_architecture(c).find(" head_dim 32 attention_bias mlp_bias") != std::string::npos);
  // head_dim lets hidden not divide by heads; without it that is refused
  ModelConfig odd = c;
  odd.hidden = 100;
  odd.heads = 3;
  odd.kv_heads = 1;
  assert_true(count(odd) > 0);
  odd.head_dim = 0;
  assert_true(throws_invalid_argument([&] { dos_train::param_tensors(odd); }));
}

void test_refusals(void**) {
  // two names of one field that disagree (GPT-2's and Hugging Face's)
  std::string m = refusal(write_config(
      "two.json", R"({"model_type": "gpt2", "num_hidden_layers": 2, "n_layer": 8, "n_embd": 64, "n_head": 4,
                     "vocab_size": 100, "n_positions": 64})"));
  assert_true(m.find("'num_hidden_layers' (2) and 'n_layer' (8)") != std::string::npos);
  // the same value under both names is one field
  const ModelConfig agree = dos_train::load_hf_config(write_config(
      "agree.json", R"({"model_type": "gpt2", "num_hidden_layers": 2, "n_layer": 2, "n_embd": 64, "n_head": 4,
                       "vocab_size": 100, "n_positions": 64})"));
  assert_int_equal(agree.layers, 2);
  // fields dos-train's gpt2 does not model
  m = refusal(write_config("gpt2hd.json", R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
                                              "head_dim": 32, "vocab_size": 100, "n_positions": 64})"));
  assert_true(m.find("'head_dim'") != std::string::npos);
  m = refusal(write_config("gpt2b.json", R"({"n_layer": 2, "n_embd": 64, "n_head": 4, "mlp_bias": true,
                                             "vocab_size": 100, "n_positions": 64})"));
  assert_true(m.find("'mlp_bias'") != std::string::npos);
  // wrong types
  m = refusal(write_config("bias_type.json", R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100, "attention_bias": "yes"})"));
  assert_true(m.find("'attention_bias' must be true or false") != std::string::npos);
  // heads x head_dim beyond 2^24 (the projections' sizes would overflow the count's bounds)
  assert_true(throws_invalid_argument([&] {
    dos_train::load_hf_config(write_config("hdbig.json", R"({"model_type": "llama", "num_hidden_layers": 2,
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 65536, "num_key_value_heads": 1,
        "head_dim": 65536, "vocab_size": 100})"));
  }));
  m = refusal(write_config("hd0.json", R"({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100, "head_dim": 0})"));
  assert_true(m.find("'head_dim' must be a positive integer") != std::string::npos);
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/dos-model-config-XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  g_dir = tmpl;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_presets_published_counts),
      cmocka_unit_test(test_mistral_configs),
      cmocka_unit_test(test_qwen2_and_gemma),
      cmocka_unit_test(test_biases_and_head_dim_by_hand),
      cmocka_unit_test(test_refusals),
  };
  const int rc = cmocka_run_group_tests(tests, nullptr, nullptr);
  std::system(("rm -rf '" + g_dir + "'").c_str());
  return rc;
}
