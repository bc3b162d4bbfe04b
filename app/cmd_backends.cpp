#include "commands.hpp"

#include "kvasir/backend/registry.hpp"
#include "kvasir/core/dtype.hpp"
#include "kvasir/backend/capabilities_json.hpp"
#include "kvasir/core/tool_info.hpp"
#include "kvasir/report/text.hpp"

#include <fmt/format.h>

#include <iostream>
#include <memory>

namespace kvasir::app {

namespace {

struct BackendsOptions {
    bool json = false;
};

void run_backends(const BackendsOptions& opt) {
    const auto statuses = list_backends();
    if (opt.json) {
        nlohmann::ordered_json j;
        j["schema"] = "kvasir-equiv/backends/1";
        j["tool"] = tool_json();
        j["backends"] = nlohmann::ordered_json::array();
        for (const BackendStatus& s : statuses) {
            nlohmann::ordered_json b;
            b["name"] = s.name;
            b["description"] = s.description;
            b["compiled"] = s.compiled;
            b["available"] = s.available;
            if (!s.available) b["reason"] = s.reason;
            b["devices"] = nlohmann::ordered_json::array();
            for (const BackendDevice& d : s.devices) {
                nlohmann::ordered_json dj;
                dj["index"] = d.index;
                dj["name"] = d.name;
                const std::string spec = s.name == "cpu" || s.name == "cpu-ref" ? s.name : fmt::format("{}:{}", s.name, d.index);
                dj["capabilities"] = to_json(create_backend(spec)->capabilities());
                b["devices"].push_back(std::move(dj));
            }
            j["backends"].push_back(std::move(b));
        }
        std::cout << j.dump(2) << '\n';
        return;
    }
    const Style st = style_for(stdout);
    TextTable t({"node", "status", "storage", "acc", "fma", "threads", "device"});
    // An absent backend's reason can be a paragraph (a driver's own words):
    // it goes below the table, wrapped, so the columns stay readable.
    std::string absent;
    for (const BackendStatus& s : statuses) {
        if (!s.available) {
            t.add_row({s.name, st.dim("absent"), "", "", "", "", st.dim("(why: below)")});
            absent += "  " + s.name + ": ";
            std::size_t col = 4 + s.name.size();
            std::string word;
            for (std::size_t i = 0; i <= s.reason.size(); ++i) {
                if (i < s.reason.size() && s.reason[i] != ' ') {
                    word += s.reason[i];
                    continue;
                }
                if (word.empty()) continue;
                if (col + word.size() > 100 && col > 4 + s.name.size()) {
                    absent.back() = '\n';  // the space after the last word
                    absent += "      ";
                    col = 6;
                }
                absent += word + " ";
                col += word.size() + 1;
                word.clear();
            }
            absent.back() = '\n';
            continue;
        }
        for (const BackendDevice& d : s.devices) {
            const std::string spec = s.name == "cpu" || s.name == "cpu-ref" ? s.name : fmt::format("{}:{}", s.name, d.index);
            const Capabilities c = create_backend(spec)->capabilities();
            t.add_row({c.node, st.green("available"), dtype_name(c.storage), dtype_name(c.accumulation),
                       c.fma ? "yes" : "no", std::to_string(c.threads), c.device});
        }
    }
    std::cout << t.render();
    if (!absent.empty()) std::cout << "\nAbsent (not a failure: nothing of it is used):\n" << absent;
    std::cout << "\nVariants: NAME[:DEVICE][:key=value,...] — e.g. cpu:acc=f16, cpu:storage=bf16, "
                 "cpu:storage=f16,acc=f16, cpu:threads=1;\n"
                 "contrasts: cpu:split_k=shape (a batch-variant matmul: split-K below 64 rows, for the invariance step);\n"
                 "runtimes: cpu:qdot=llamacpp (llama.cpp's CPU arithmetic on quantised GGUF weights: activations in "
                 "Q8_0 / Q8_K / f16 / bf16 for the weight's format)\n";
}

}  // namespace

void set_backends_command(CLI::App& app) {
    auto opt = std::make_shared<BackendsOptions>();
    CLI::App* cmd = app.add_subcommand("backends", "List the compute backends, their devices and capabilities");
    cmd->add_flag("--json", opt->json, "Print as JSON");
    cmd->callback([opt] { run_backends(*opt); });
}

}  // namespace kvasir::app
