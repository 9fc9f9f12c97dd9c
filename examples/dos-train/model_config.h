// Transformer configurations for dos-train: published presets and Hugging Face config.json files,
// and the list of parameter tensors (names and shapes) they imply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dos_train {

/// A decoder-only transformer's shape.
/// arch: "gpt2" (learned positions, LayerNorm with bias, fused QKV with bias, GELU MLP, tied
/// lm_head) or "llama" (RMSNorm, separate q/k/v/o without bias, SwiGLU MLP, untied lm_head unless
/// tie_embeddings, grouped-query attention with kv_heads).
struct ModelConfig {
  std::string name;
  std::string arch;
  std::int64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, vocab = 0, positions = 0;
  bool tie_embeddings = false;
};

/// One parameter tensor: its name (Hugging Face naming), shape and kind (how it is initialised).
enum class TensorKind { weight, norm, bias };
struct ParamTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  TensorKind kind;
  /// Elements (the product of the shape). Throws std::invalid_argument when it overflows 64 bits.
  std::size_t numel() const;
};

/// The most parameters a model may have (2^53: every count stays exact in a double).
constexpr std::size_t kMaxParams = std::size_t(1) << 53;

/// The parameter count of `tensors` (the sum of their elements), every product and sum checked.
/// Throws std::invalid_argument naming `model` and the true count (approximately) when it exceeds
/// kMaxParams.
std::size_t count_params(const std::vector<ParamTensor>& tensors, const std::string& model);

/// `c`'s shape in words ("gpt2 layers 12 hidden 768 intermediate 3072 heads 12 kv_heads 12 vocab
/// 50257 positions 1024 tied"): what a checkpoint records to recognise the model.
std::string describe_architecture(const ModelConfig& c);

/// Names of the presets: gpt2-124m, gpt2-xl, llama2-7b, llama2-13b, llama-20b (and "tiny").
std::vector<std::string> preset_names();

/// The preset `name`. Throws std::invalid_argument listing the presets when it is unknown.
ModelConfig preset(const std::string& name);

/// Reads a Hugging Face config.json (fields num_hidden_layers|n_layer, hidden_size|n_embd,
/// intermediate_size|n_inner, num_attention_heads|n_head, num_key_value_heads, vocab_size,
/// max_position_embeddings|n_positions, tie_word_embeddings, model_type). Without model_type, GPT-2's
/// field names (n_layer, n_embd, n_head) make it gpt2, and otherwise it is a Llama-style decoder.
/// Throws std::runtime_error naming the file and the missing or invalid field (or, without
/// model_type, field names of both kinds), and
/// std::invalid_argument when the dimensions are out of range or the parameter count exceeds
/// kMaxParams (count_params).
ModelConfig load_hf_config(const std::string& path);

/// The parameter tensors of `c`, in the order of the Hugging Face implementation.
/// Throws std::invalid_argument when a dimension is not positive or hidden % heads != 0.
std::vector<ParamTensor> param_tensors(const ModelConfig& c);

}  // namespace dos_train
