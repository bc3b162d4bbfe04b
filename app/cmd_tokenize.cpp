// tokenize: a text through the model's own tokenizer.json (model/tokenizer.hpp)
// — the ids every --text option and text token stream of a protocol use.
//   kvasir-equiv tokenize [-m MODEL | --tokenizer FILE] (--text FILE | TEXT)
// prints the ids on one line; --json adds each token's piece and its byte
// offsets in the text; --decode reads ids (TEXT or --text FILE, whitespace-
// separated) and prints their text.
#include "commands.hpp"

#include "kvasir/core/error.hpp"
#include "kvasir/core/io.hpp"
#include "kvasir/model/tokenizer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <memory>
#include <sstream>

namespace kvasir::app {

void set_tokenize_command(CLI::App& app) {
    struct Opt {
        std::string model = default_model_path();
        std::string tokenizer;
        std::string text_file;
        std::string text;
        bool no_special = false;
        bool decode = false;
        bool skip_special = false;
        OutputOptions output;
    };
    auto opt = std::make_shared<Opt>();
    CLI::App* cmd = app.add_subcommand("tokenize", "Token ids of a text by the model's tokenizer.json (and --decode: the text of ids)");
    cmd->add_option("-m,--model", opt->model, "Model whose tokenizer.json (beside it) is used")->capture_default_str();
    cmd->add_option("--tokenizer", opt->tokenizer, "tokenizer.json FILE (default: the one beside the model)");
    cmd->add_option("--text", opt->text_file, "Read the text (with --decode: the ids) from FILE");
    cmd->add_option("TEXT", opt->text, "The text itself (or, with --decode, the ids)");
    cmd->add_flag("--no-special", opt->no_special, "Do not add the post-processor's special tokens (BOS)");
    cmd->add_flag("--decode", opt->decode, "Decode token ids to text");
    cmd->add_flag("--skip-special", opt->skip_special, "With --decode: leave special tokens out");
    add_output_options(*cmd, opt->output);
    cmd->callback([opt] {
        KVASIR_CHECK(opt->text_file.empty() != opt->text.empty(), ErrorCode::bad_input, "give the text as TEXT or --text FILE (one of them)");
        if (!opt->output.output_file.empty()) check_output_paths({{"--output", opt->output.output_file}});
        const Tokenizer tok = load_tokenizer_for(opt->model, opt->tokenizer);
        const std::string text = opt->text_file.empty() ? opt->text : read_text_file(opt->text_file);
        nlohmann::ordered_json j;
        j["tokenizer"] = tok.source();
        j["describe"] = tok.describe();
        std::string line;
        if (opt->decode) {
            std::vector<std::int32_t> ids;
            std::istringstream in(text);
            std::string word;
            while (in >> word) {
                KVASIR_CHECK(word.size() <= 10 && word.find_first_not_of("0123456789") == std::string::npos && std::stoll(word) < (1LL << 31),
                             ErrorCode::bad_input, "--decode: '{}' is not a token id", word.substr(0, 24));
                ids.push_back(static_cast<std::int32_t>(std::stoll(word)));
            }
            line = tok.decode(ids, opt->skip_special);
            j["ids"] = ids;
            j["text"] = line;
        } else {
            const auto spans = tok.encode_spans(text, !opt->no_special);
            std::vector<std::int32_t> ids;
            nlohmann::ordered_json tokens = nlohmann::ordered_json::array();
            for (const TokenSpan& s : spans) {
                ids.push_back(s.id);
                tokens.push_back({{"id", s.id}, {"piece", tok.piece(s.id).value_or("")}, {"begin", s.begin}, {"end", s.end},
                                  {"special", tok.is_special(s.id)}});
            }
            line = fmt::format("{}", fmt::join(ids, " "));
            j["count"] = ids.size();
            j["ids"] = ids;
            j["tokens"] = tokens;
        }
        if (!opt->output.output_file.empty()) write_file_atomic(opt->output.output_file, j.dump(2) + "\n");
        if (opt->output.json)
            std::cout << j.dump(2) << '\n';
        else
            std::cout << line << '\n';
    });
}

}  // namespace kvasir::app
