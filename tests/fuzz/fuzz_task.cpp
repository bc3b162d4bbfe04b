// libFuzzer target for the task item parser (lib/kvasir/steps/task.cpp
// parse_task_items): the input is a JSONL file of {context, choices, gold}.
// Any input either parses into items whose gold index names one of their
// choices, or throws kvasir::Error naming the line — never a crash.
#include "kvasir/core/error.hpp"
#include "kvasir/steps/task.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        for (const kvasir::TaskItem& item : kvasir::parse_task_items(text, "fuzz/items.jsonl"))
            if (item.choices.size() < 2 || item.choices.size() > 64 || item.gold < 0 ||
                static_cast<std::size_t>(item.gold) >= item.choices.size())
                std::abort();
    } catch (const kvasir::Error&) {
    }
    return 0;
}
