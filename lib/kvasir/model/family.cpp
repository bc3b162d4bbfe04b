#include "kvasir/model/family.hpp"

#include "kvasir/core/error.hpp"

#include <fmt/format.h>

#include <mutex>

namespace kvasir {

namespace families {
// The built-in families, each in its own file (model/families/).
const Family& qwen2_moe();
const Family& qwen3_moe();
const Family& mixtral();
const Family& qwen3_5_moe();
const Family& qwen3_next();
const Family& llama();
const Family& mistral();
const Family& qwen2();
const Family& qwen3();
const Family& qwen3_5();
const Family& olmoe();
const Family& gpt_oss();
const Family& deepseek_v3();
const Family& glm4_moe();
}  // namespace families

namespace {

const std::vector<const Family*>& builtin_families() {
    using namespace families;
    static const std::vector<const Family*> all{&qwen2_moe(), &qwen3_moe(), &mixtral(), &qwen3_5_moe(),
                                                &qwen3_next(), &llama(), &mistral(), &qwen2(),
                                                &qwen3(), &qwen3_5(), &olmoe(), &gpt_oss(),
                                                &deepseek_v3(), &glm4_moe()};
    return all;
}

struct Registered {
    std::mutex mutex;
    std::vector<const Family*> families;
};
Registered& registered() {
    static Registered r;
    return r;
}

bool names_type(const Family& f, std::string_view type) {
    if (type == f.model_type) return true;
    for (std::string_view t : f.other_model_types)
        if (type == t) return true;
    return false;
}

}  // namespace

std::vector<const Family*> all_families() {
    std::vector<const Family*> all = builtin_families();
    Registered& r = registered();
    const std::lock_guard lock(r.mutex);
    all.insert(all.end(), r.families.begin(), r.families.end());
    return all;
}

const Family& family_of(Architecture id) {
    for (const Family* f : all_families())
        if (f->id == id) return *f;
    fail(ErrorCode::internal, "no model family has the id {}", static_cast<int>(id));
}

const Family* family_for_model_type(std::string_view type) {
    for (const Family* f : all_families())
        if (names_type(*f, type)) return f;
    return nullptr;
}

const Family* family_for_class(std::string_view cls) {
    for (const Family* f : all_families()) {
        if (!cls.starts_with(f->class_prefix)) continue;
        const std::string_view rest = cls.substr(f->class_prefix.size());
        if (rest.starts_with("For") || rest == "Model") return f;
    }
    return nullptr;
}

void register_family(const Family& family) {
    KVASIR_CHECK(!family.model_type.empty() && !family.class_prefix.empty() && family.read != nullptr,
                 ErrorCode::bad_input, "a model family needs a model_type, a class prefix and a config reader");
    KVASIR_CHECK(family.gguf_architecture.empty() == (family.read_gguf == nullptr), ErrorCode::bad_input,
                 "model family {}: a GGUF architecture needs its GGUF reader, and a reader its architecture",
                 family.model_type);
    for (const Family* f : all_families()) {
        KVASIR_CHECK(f->id != family.id && !names_type(*f, family.model_type) && f->class_prefix != family.class_prefix,
                     ErrorCode::bad_input, "model family {}: its id, model_type or class prefix is taken by {}",
                     family.model_type, f->model_type);
    }
    Registered& r = registered();
    const std::lock_guard lock(r.mutex);
    r.families.push_back(&family);
}

const char* architecture_name(Architecture a) noexcept {
    for (const Family* f : builtin_families())
        if (f->id == a) return f->model_type.data();
    Registered& r = registered();
    const std::lock_guard lock(r.mutex);
    for (const Family* f : r.families)
        if (f->id == a) return f->model_type.data();
    return "?";
}

std::string supported_architectures() {
    std::string out;
    for (const Family* f : all_families()) out += (out.empty() ? "" : ", ") + std::string(f->model_type);
    return out;
}

}  // namespace kvasir
