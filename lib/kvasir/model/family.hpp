// A model family as data: everything kvasir knows about one architecture
// family — its Hugging Face names, the defaults of its config class, the
// reader of its own config keys, its GGUF architecture, the tensor names
// that differ from the common scheme, and which decoder layer of the forward
// pass it is made of — in one record, written in one file under
// model/families/<family>.cpp. parse_model_config, the GGUF reader, the
// tensor naming and the forward pass (arch/architecture.cpp) read these
// records; none of them names a family.
//
// Adding a family: its file here (a Family and its line in builtin_families()
// in family.cpp), its fixture and tests. A family defined elsewhere (a test's
// toy family) joins with register_family().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {

enum class Architecture : std::uint8_t;
struct ModelConfig;
struct LayerTensorNames;
class ConfigKeys;
class GgufFile;
struct GgufModelParams;

// Which decoder layer of the forward pass (arch/graph.hpp LayerGraph) a family
// is made of: the standard pre-norm layer (the families differ only in which
// weights a layer has), multi-head latent attention (MLA), or the hybrid stack
// of Gated DeltaNet and gated full attention.
enum class LayerKind : std::uint8_t { standard, mla, hybrid };

// The defaults of the family's transformers config class for the keys every
// family reads (parse_model_config's common part): a key absent from
// config.json means this value to transformers. Sizes have none: they are
// required (ConfigKeys::size).
struct FamilyDefaults {
    std::int64_t kv_heads = 0;  // 0: None, i.e. num_attention_heads
    std::int64_t max_positions = 0;
    double rms_eps = 1e-6;
    double rope_theta = 10000.0;
    std::int64_t head_dim = 0;  // a head_dim field with a default (0: hidden_size / num_attention_heads)
};

// How a family's checkpoints store the routed experts (Model's loader
// implements each): one tensor per expert or fused [E, …] tensors (told apart
// by the tensor names), or GptOssExperts' layout — every expert of a layer in
// two tensors, gate and up interleaved, MXFP4 blocks or plain, a bias on each
// projection and on the router's logits.
enum class ExpertStorage : std::uint8_t { per_expert_or_fused, gate_up_interleaved };

// Which checkpoints a GGUF architecture string maps to this family: llama.cpp
// writes one string for a dense and a MoE family (Mixtral is "llama" with experts).
enum class GgufExperts : std::uint8_t { with, without };

struct Family {
    Architecture id{};
    std::string_view model_type{};                // config.json model_type, the family's name everywhere
    std::string_view class_prefix{};              // of the `architectures` class names (Qwen3MoeForCausalLM)
    std::vector<std::string_view> other_model_types{};  // read as this family (text-only configs, remote-code names)
    FamilyDefaults defaults{};
    // The family's own config keys, after the common ones: attention biases and
    // norms, its MoE block and router, which layers are MoE, its sliding rule.
    void (*read)(const ConfigKeys& keys, ModelConfig& config) = nullptr;
    // The multimodal wrapper (…ForConditionalGeneration): the text model's
    // config is text_config, its tensors model.language_model.*.
    bool text_config_wrapper = false;
    // The config key counting the routed experts (named in messages).
    std::string_view experts_key = "num_experts";
    // Tensor names that differ from the common Hugging Face scheme
    // (layer_tensor_names), set after it: nullptr when none differ.
    void (*name_layer)(const ModelConfig& config, std::int64_t layer, LayerTensorNames& names) = nullptr;
    // llama.cpp's general.architecture for this family, and whether it needs
    // experts ("" when no GGUF file of the family is read).
    std::string_view gguf_architecture{};
    GgufExperts gguf_experts = GgufExperts::with;
    // The family's feed-forward and router from llama.cpp's keys, after the
    // parts every GGUF shares (model_config_from_gguf, gguf_config.hpp); set
    // exactly when gguf_architecture is.
    void (*read_gguf)(const GgufFile& file, const GgufModelParams& params, const std::string& path,
                      ModelConfig& config) = nullptr;
    // llama.cpp's rules for the architecture that a GGUF does not spell out
    // (the families sharing one agree): its converter permuted q/k for
    // adjacent-pair rope (llama); the period of the sliding layers when the
    // file has a window but no pattern (gpt-oss: every other layer; 0: such a
    // file is refused); the top-k weights renormalised when the file has no
    // expert_weights_norm.
    bool gguf_rope_permuted = false;
    std::int64_t gguf_swa_period = 0;
    bool gguf_norm_topk = true;
    // Loader layouts: the experts' (above), and llama.cpp's qwen35moe DeltaNet
    // (beta and alpha as two tensors, the value heads tiled by key head).
    ExpertStorage experts = ExpertStorage::per_expert_or_fused;
    bool gguf_deltanet_tiled = false;
    // The forward pass: which decoder layer, and whether a sliding window in
    // the config is run (its window rule is checked against transformers by a
    // fixture) or refused.
    LayerKind layer = LayerKind::standard;
    bool sliding_checked = false;
};

// Every family kvasir reads: the built-in ones in a fixed order, then the
// registered ones.
std::vector<const Family*> all_families();
// The family of an id; Error(internal) when none has it.
const Family& family_of(Architecture id);
// The family whose model_type (or one of its other_model_types) is `type`;
// nullptr when none.
const Family* family_for_model_type(std::string_view type);
// The family of a Hugging Face class name (<prefix>For… or <prefix>Model);
// nullptr when none.
const Family* family_for_class(std::string_view class_name);
// Adds a family defined outside model/families (it must outlive every use).
// Error(bad_input) when its id, model_type or class prefix is taken.
void register_family(const Family& family);

// The config.json `model_type`: "qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "glm4_moe", ….
const char* architecture_name(Architecture a) noexcept;
// For messages: every model_type read, comma separated.
std::string supported_architectures();

}  // namespace kvasir
