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
/// lm_head) or "llama" (RMSNorm, separate q/k/v/o, SwiGLU MLP, untied lm_head unless
/// tie_embeddings, grouped-query attention with kv_heads).
/// head_dim: elements per attention head; 0 means hidden / heads (GPT-2 always). A Llama-style
/// decoder's q_proj is [heads * head_dim, hidden], k_proj and v_proj [kv_heads * head_dim, hidden],
/// o_proj [hidden, heads * head_dim] (Hugging Face's LlamaAttention; Mistral-NeMo and Gemma set a
/// head_dim other than hidden / heads). attention_bias, mlp_bias: a Llama-style decoder's q/k/v/o
/// and gate/up/down projections carry biases (Hugging Face's LlamaConfig fields of those names);
/// qkv_bias: q/k/v carry biases and o_proj none (Qwen2).
struct ModelConfig {
  std::string name;
  std::string arch;
  std::int64_t layers = 0, hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, vocab = 0, positions = 0;
  std::int64_t head_dim = 0;
  bool tie_embeddings = false;
  bool attention_bias = false, mlp_bias = false, qkv_bias = false;
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
/// 50257 positions 1024 tied", then " head_dim D" where head_dim is set and differs from hidden /
/// heads, " attention_bias", " mlp_bias" and " qkv_bias" where set): what a checkpoint records to
/// recognise the model (a model without those reads as it did before they existed).
std::string describe_architecture(const ModelConfig& c);

/// Names of the presets: gpt2-124m, gpt2-xl, llama2-7b, llama2-13b, llama-20b (and "tiny").
std::vector<std::string> preset_names();

/// The preset `name`. Throws std::invalid_argument listing the presets when it is unknown.
ModelConfig preset(const std::string& name);

/// Reads a Hugging Face config.json (fields num_hidden_layers|n_layer, hidden_size|n_embd,
/// intermediate_size|n_inner, num_attention_heads|n_head, num_key_value_heads, vocab_size,
/// max_position_embeddings|n_positions, tie_word_embeddings, model_type; for Llama-style decoders
/// also head_dim, attention_bias and mlp_bias). model_type gpt2, llama, mistral, qwen2 (q/k/v with
/// biases, o_proj without: Hugging Face's Qwen2Attention) or gemma (embeddings tied unless
/// tie_word_embeddings says otherwise); without model_type, GPT-2's field names (n_layer, n_embd,
/// n_head) make it gpt2, and otherwise it is a Llama-style decoder.
/// Throws std::runtime_error naming the file and the missing or invalid field, two names of one
/// field that disagree (num_hidden_layers 2 beside n_layer 8), a field that changes the parameter
/// count of a gpt2 model but that dos-train does not model there (head_dim, attention_bias,
/// mlp_bias), or, without model_type, field names of both kinds; and std::invalid_argument when the
/// dimensions are out of range or the parameter count exceeds kMaxParams (count_params).
ModelConfig load_hf_config(const std::string& path);

/// The parameter tensors of `c`, in the order of the Hugging Face implementation.
/// Throws std::invalid_argument when a dimension is not positive (head_dim may be 0: hidden /
/// heads), hidden % heads != 0 without a head_dim, heads % kv_heads != 0, or a dimension is out of
/// range (hidden, intermediate, vocabulary, positions, heads, head_dim and heads x head_dim above
/// 2^24, layers above 100000: bounds no real transformer nears, which keep every size in 64 bits).
std::vector<ParamTensor> param_tensors(const ModelConfig& c);

}  // namespace dos_train
