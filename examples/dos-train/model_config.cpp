#include "model_config.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace dos_train {

std::size_t ParamTensor::numel() const {
  std::size_t n = 1;
  for (auto d : shape)
    if (d < 0 || __builtin_mul_overflow(n, std::size_t(d), &n))
      throw std::invalid_argument("tensor '" + name + "': its element count overflows 64 bits");
  return n;
}

std::size_t count_params(const std::vector<ParamTensor>& tensors, const std::string& model) {
  std::size_t total = 0;
  long double exact = 0;  // the true count even where 64 bits overflow, for the message
  bool over = false;
  for (const ParamTensor& t : tensors) {
    long double n = 1;
    for (auto d : t.shape) n *= (long double)d;
    exact += n;
    std::size_t sum = 0;
    if (over) continue;
    if (n > (long double)kMaxParams || __builtin_add_overflow(total, t.numel(), &sum) || sum > kMaxParams)
      over = true;
    else
      total = sum;
  }
  if (over) {
    char msg[320];
    std::snprintf(msg, sizeof msg,
                  "model '%s' has about %.3Lg parameters, more than dos-train handles (at most 2^53 = %zu): check "
                  "its dimensions",
                  model.c_str(), exact, kMaxParams);
    throw std::invalid_argument(msg);
  }
  return total;
}

std::string describe_architecture(const ModelConfig& c) {
  return c.arch + " layers " + std::to_string(c.layers) + " hidden " + std::to_string(c.hidden) + " intermediate " +
         std::to_string(c.intermediate) + " heads " + std::to_string(c.heads) + " kv_heads " +
         std::to_string(c.kv_heads) + " vocab " + std::to_string(c.vocab) + " positions " +
         std::to_string(c.positions) + (c.tie_embeddings ? " tied" : " untied") +
         (c.head_dim > 0 && c.head_dim * c.heads != c.hidden ? " head_dim " + std::to_string(c.head_dim) : "") +
         (c.attention_bias ? " attention_bias" : "") + (c.mlp_bias ? " mlp_bias" : "") + (c.qkv_bias ? " qkv_bias" : "");
}

namespace {
ModelConfig make(const char* name, const char* arch, std::int64_t layers, std::int64_t hidden, std::int64_t inter,
                 std::int64_t heads, std::int64_t kv_heads, std::int64_t vocab, std::int64_t positions, bool tie) {
  ModelConfig c;
  c.name = name;
  c.arch = arch;
  c.layers = layers;
  c.hidden = hidden;
  c.intermediate = inter;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.vocab = vocab;
  c.positions = positions;
  c.tie_embeddings = tie;
  return c;
}

// Sources: Hugging Face config.json of openai-community/gpt2 and gpt2-xl, meta-llama/Llama-2-7b-hf
// and Llama-2-13b-hf; the 20B Llama-style model is the paper's 20B configuration on H100
// (40 layers, hidden 5120, FFN 20480, 64 heads, vocabulary 50304: Maurya et al., "Deep Optimizer
// States", arXiv 2410.21316).
const std::vector<ModelConfig>& presets() {
  static const std::vector<ModelConfig> p = {
      make("tiny", "gpt2", 2, 128, 512, 4, 4, 1000, 128, true),
      make("gpt2-124m", "gpt2", 12, 768, 3072, 12, 12, 50257, 1024, true),
      make("gpt2-xl", "gpt2", 48, 1600, 6400, 25, 25, 50257, 1024, true),
      make("llama2-7b", "llama", 32, 4096, 11008, 32, 32, 32000, 4096, false),
      make("llama2-13b", "llama", 40, 5120, 13824, 40, 40, 32000, 4096, false),
      make("llama-20b", "llama", 40, 5120, 20480, 64, 64, 50304, 4096, false),
  };
  return p;
}
}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> n;
  for (const auto& c : presets()) n.push_back(c.name);
  return n;
}

ModelConfig preset(const std::string& name) {
  std::string list;
  for (const auto& c : presets()) {
    if (c.name == name) return c;
    list += (list.empty() ? "" : ", ") + c.name;
  }
  throw std::invalid_argument("unknown preset '" + name + "': choose one of " + list + ", or give --config FILE");
}

ModelConfig load_hf_config(const std::string& path) {
  if (std::filesystem::is_directory(path))
    throw std::runtime_error("cannot read the configuration file " + path + ": it is a folder (give the model's "
                             "config.json in it, or --preset)");
  errno = 0;
  std::ifstream f(path);
  if (!f) {
    const int err = errno;  // the open's own reason (no such file, permission)
    throw std::runtime_error("cannot read the configuration file " + path + ": " +
                             (err ? std::strerror(err) : "unknown reason") + " (give a model's config.json, or --preset)");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(path + ": expected a JSON object like a Hugging Face config.json");
  // a field under any of its names (Hugging Face's and GPT-2's); two names given must agree
  auto get = [&](std::initializer_list<const char*> keys, bool required, std::int64_t dflt) -> std::int64_t {
    const char* found = nullptr;
    std::int64_t value = 0;
    for (const char* k : keys)
      if (j.contains(k) && !j[k].is_null()) {
        if (!j[k].is_number_integer() || j[k].get<std::int64_t>() <= 0)
          throw std::runtime_error(path + ": field '" + k + "' must be a positive integer");
        const std::int64_t v = j[k].get<std::int64_t>();
        if (found && v != value)
          throw std::runtime_error(path + ": fields '" + found + "' (" + std::to_string(value) + ") and '" + k + "' (" +
                                   std::to_string(v) + ") name the same dimension and disagree: keep one");
        if (!found) found = k, value = v;
      }
    if (found) return value;
    if (required) throw std::runtime_error(path + ": missing field '" + *keys.begin() + "'");
    return dflt;
  };
  auto get_bool = [&](const char* key, bool dflt) -> bool {
    if (!j.contains(key) || j[key].is_null()) return dflt;
    if (!j[key].is_boolean()) throw std::runtime_error(path + ": field '" + std::string(key) + "' must be true or false");
    return j[key].get<bool>();
  };
  ModelConfig c;
  c.name = path;
  if (j.contains("model_type") && !j["model_type"].is_string())
    throw std::runtime_error(path + ": field 'model_type' must be a string");
  // Without model_type, the field names tell: GPT-2's n_layer, n_embd, n_head against the Llama
  // family's num_hidden_layers, hidden_size, num_attention_heads; names of both kinds are refused.
  std::string type;
  if (j.contains("model_type")) {
    type = j["model_type"].get<std::string>();
  } else {
    const bool gpt2_names = j.contains("n_layer") || j.contains("n_embd") || j.contains("n_head");
    const bool llama_names =
        j.contains("num_hidden_layers") || j.contains("hidden_size") || j.contains("num_attention_heads");
    if (gpt2_names && llama_names)
      throw std::runtime_error(path + ": no model_type, and fields of both GPT-2 (n_layer, n_embd, n_head) and the "
                                      "Llama family (num_hidden_layers, hidden_size, num_attention_heads): add "
                                      "\"model_type\": \"gpt2\" or \"llama\"");
    type = gpt2_names ? "gpt2" : "llama";
  }
  if (type != "gpt2" && type != "llama" && type != "mistral" && type != "qwen2" && type != "gemma")
    throw std::runtime_error(path + ": model_type '" + type +
                             "' is not supported: dos-train knows gpt2 and Llama-style decoders (llama, mistral, "
                             "qwen2, gemma)");
  c.arch = type == "gpt2" ? "gpt2" : "llama";
  c.layers = get({"num_hidden_layers", "n_layer"}, true, 0);
  c.hidden = get({"hidden_size", "n_embd"}, true, 0);
  c.heads = get({"num_attention_heads", "n_head"}, true, 0);
  c.intermediate = get({"intermediate_size", "n_inner"}, c.arch != "gpt2", 4 * c.hidden);
  c.kv_heads = get({"num_key_value_heads"}, false, c.heads);
  c.vocab = get({"vocab_size"}, true, 0);
  c.positions = get({"max_position_embeddings", "n_positions"}, c.arch == "gpt2", 0);
  c.tie_embeddings = get_bool("tie_word_embeddings", c.arch == "gpt2" || type == "gemma");
  c.qkv_bias = type == "qwen2";
  c.head_dim = get({"head_dim"}, false, 0);
  c.attention_bias = get_bool("attention_bias", false);
  c.mlp_bias = get_bool("mlp_bias", false);
  if (c.arch == "gpt2" && (c.head_dim > 0 || c.attention_bias || c.mlp_bias)) {
    const char* f = c.head_dim > 0 ? "head_dim" : c.attention_bias ? "attention_bias" : "mlp_bias";
    throw std::runtime_error(path + ": field '" + f + "' is not part of dos-train's gpt2 model (its attention heads " +
                             "are hidden / n_head wide and every projection has a bias): remove it, or give a " +
                             "Llama-style model_type");
  }
  count_params(param_tensors(c), c.name);  // validates the dimensions and the parameter count
  return c;
}

std::vector<ParamTensor> param_tensors(const ModelConfig& c) {
  if (c.layers <= 0 || c.hidden <= 0 || c.intermediate <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.vocab <= 0 ||
      c.head_dim < 0)
    throw std::invalid_argument("model '" + c.name + "': every dimension must be positive");
  // Bounds that no real transformer comes near, so that the sizes below cannot overflow 64 bits.
  const std::int64_t kMaxDim = std::int64_t(1) << 24, kMaxLayers = 100000;
  if (c.hidden > kMaxDim || c.intermediate > kMaxDim || c.vocab > kMaxDim || c.positions > kMaxDim ||
      c.heads > kMaxDim || c.layers > kMaxLayers || c.head_dim > kMaxDim ||
      (c.head_dim > 0 && c.heads * c.head_dim > kMaxDim))
    throw std::invalid_argument("model '" + c.name + "': a dimension is out of range (hidden, intermediate, vocabulary, "
                                "positions, heads, head_dim and heads x head_dim at most 2^24, layers at most 100000)");
  if ((c.head_dim == 0 && c.hidden % c.heads != 0) || c.heads % c.kv_heads != 0)
    throw std::invalid_argument("model '" + c.name + "': hidden size must divide by heads (or give head_dim) and heads "
                                "by kv_heads");
  const std::int64_t H = c.hidden, I = c.intermediate, V = c.vocab;
  const std::int64_t hd = c.head_dim > 0 ? c.head_dim : H / c.heads, q = c.heads * hd, kv = c.kv_heads * hd;
  std::vector<ParamTensor> t;
  auto add = [&](std::string n, std::vector<std::int64_t> s, TensorKind k) { t.push_back({std::move(n), std::move(s), k}); };
  if (c.arch == "gpt2") {
    add("wte.weight", {V, H}, TensorKind::weight);
    add("wpe.weight", {c.positions, H}, TensorKind::weight);
    for (std::int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      add(p + "ln_1.weight", {H}, TensorKind::norm);
      add(p + "ln_1.bias", {H}, TensorKind::bias);
      add(p + "attn.c_attn.weight", {H, 3 * H}, TensorKind::weight);
      add(p + "attn.c_attn.bias", {3 * H}, TensorKind::bias);
      add(p + "attn.c_proj.weight", {H, H}, TensorKind::weight);
      add(p + "attn.c_proj.bias", {H}, TensorKind::bias);
      add(p + "ln_2.weight", {H}, TensorKind::norm);
      add(p + "ln_2.bias", {H}, TensorKind::bias);
      add(p + "mlp.c_fc.weight", {H, I}, TensorKind::weight);
      add(p + "mlp.c_fc.bias", {I}, TensorKind::bias);
      add(p + "mlp.c_proj.weight", {I, H}, TensorKind::weight);
      add(p + "mlp.c_proj.bias", {H}, TensorKind::bias);
    }
    add("ln_f.weight", {H}, TensorKind::norm);
    add("ln_f.bias", {H}, TensorKind::bias);
    if (!c.tie_embeddings) add("lm_head.weight", {V, H}, TensorKind::weight);
  } else {
    add("model.embed_tokens.weight", {V, H}, TensorKind::weight);
    for (std::int64_t l = 0; l < c.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      // Hugging Face's LlamaAttention and LlamaMLP: each projection's weight, then its bias where set
      auto proj = [&](const std::string& n, std::int64_t out, std::int64_t in, bool bias) {
        add(p + n + ".weight", {out, in}, TensorKind::weight);
        if (bias) add(p + n + ".bias", {out}, TensorKind::bias);
      };
      proj("self_attn.q_proj", q, H, c.attention_bias || c.qkv_bias);
      proj("self_attn.k_proj", kv, H, c.attention_bias || c.qkv_bias);
      proj("self_attn.v_proj", kv, H, c.attention_bias || c.qkv_bias);
      proj("self_attn.o_proj", H, q, c.attention_bias);
      proj("mlp.gate_proj", I, H, c.mlp_bias);
      proj("mlp.up_proj", I, H, c.mlp_bias);
      proj("mlp.down_proj", H, I, c.mlp_bias);
      add(p + "input_layernorm.weight", {H}, TensorKind::norm);
      add(p + "post_attention_layernorm.weight", {H}, TensorKind::norm);
    }
    add("model.norm.weight", {H}, TensorKind::norm);
    if (!c.tie_embeddings) add("lm_head.weight", {V, H}, TensorKind::weight);
  }
  return t;
}

}  // namespace dos_train
