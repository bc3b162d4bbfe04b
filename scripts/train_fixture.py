#!/usr/bin/env python3
"""Train the realistic fixture of kvasir-equiv: a tiny Qwen3-MoE trained on real English prose.

The other fixtures (scripts/make_fixtures.py) are random models: their logits and router gaps are
those of random weights. This one is trained, on the CPU (one thread), for ~10 minutes, so that perplexity and
a multiple-choice task give the numbers a real (if tiny) language model gives: a held-out perplexity
far below the vocabulary size and a cloze accuracy far above chance.

    apt-get install jargon-text                           # the corpus (Debian main, public domain)
    pip install -r scripts/requirements-fixtures.txt      # pinned torch / transformers / tokenizers ...
    python3 scripts/train_fixture.py                      # writes the files below (~10 min, 1 CPU thread)

Outputs:

  fixtures/models/qwen3_moe_trained/   config.json, generation_config.json, model.safetensors
                                       (save_pretrained), tokenizer.json, tokenizer_config.json,
                                       reference.safetensors + REFERENCE.md (scripts/make_fixtures.py's
                                       compute_reference / save_reference / reference_md on a 24-token
                                       held-out prompt: the same names and format as every other fixture),
                                       text_reference.json (perplexity and cloze, float32 and float64),
                                       TRAINING.md (corpus, hyper-parameters, loss curve, results,
                                       text_reference.json field by field)
  fixtures/text/qwen3_moe_trained_heldout.txt   ~3 KB of held-out prose (perplexity text)
  fixtures/tasks/qwen3_moe_trained_cloze.jsonl  multiple-choice items built from held-out text only
  fixtures/models/README.md             its bullet (make_fixtures.py's index_lines) is inserted / replaced

Corpus: the Jargon File 4.4.7 as Debian's package jargon-text 4.4.7-4.1 ships it
(/usr/share/doc/jargon-text/jargon.txt.gz, 1,681,817 bytes of UTF-8 text once gunzipped, sha256
40dfb4b98191a670a09a183d5798d50f243d23fdbd1495dcc0aca2ce5895ba97). Licence: public domain ("This
document (the Jargon File) is in the public domain, to be freely used, shared, and modified",
/usr/share/doc/jargon-text/copyright). Why: real, human-written English prose (2,307 glossary
entries, essays on hacker culture and folklore), ~1.7 MB, one plain-text file in Debian main with
the clearest possible licence; prose with a vocabulary of its own (cross-references in braces,
curly quotes), so a model of 0.6 million parameters learns it measurably in minutes. The script
refuses any other file (sha256). Candidates not taken: fortunes (short quotations of mixed and
unclear authorship), python3.11-doc (PSF licence, but reStructuredText and code more than prose),
debian-reference-en (HTML / PDF only).

Documents: the chapters and appendices split at their unindented headings, the glossary split at its
entries (":headword: ..." lines); the table of contents and the glossary's headword index are left
out (documents without a prose paragraph of 10 words are dropped). A paragraph (lines separated by
blank lines) whose lines all carry the File's 3-space indent is prose and is re-flowed to one line;
any other paragraph (tables, code, verses) is kept line by line minus the 3-space indent. A
document's text is its heading line and paragraphs joined by blank lines. Split: document i is
HELD OUT iff i % 20 == 10 (5 %, spread over the whole File); the tokenizer and the model see only
the others. The training stream is every training document's ids followed by <|endoftext|>.

Tokenizer: byte-level BPE trained with Hugging Face tokenizers 0.23.3 on the training documents, in
the Qwen2 style (normalizer NFC; pre-tokenizer Split(Qwen2's regex, isolated) + ByteLevel(no prefix
space, no regex); decoder ByteLevel; post-processor ByteLevel (adds nothing: no BOS); special tokens
<|endoftext|> (id 0, also the eos), <|im_start|>, <|im_end|>). Its vocabulary is exactly the model's
vocab_size (asserted).

Determinism: torch.manual_seed, a seeded torch.Generator for the batches, torch deterministic
algorithms, no dropout (attention_dropout 0), float32 on the CPU, eager attention and eager experts,
and a FIXED thread count for training (TRAIN_THREADS = 1; 2 threads give other weights, and on a
loaded 2-core machine OpenMP's spinning made them 6x slower): byte-identical model.safetensors needs
the same thread count, the same pinned versions (scripts/requirements-fixtures.txt) and the same CPU
kind (BLAS kernels). The references are then computed with make_fixtures.py's setup_torch (1 thread),
like every other fixture. TRAINING.md holds the loss log and wall times (the times differ from run to
run; the losses do not).

Usage:  python3 scripts/train_fixture.py [--arch qwen3_moe|qwen3_5_moe] [--out DIR] [--steps N]
        --arch: qwen3_moe (default: the fixture above) or qwen3_5_moe (fixtures/models/qwen3_5_moe_trained:
        a tiny hybrid Qwen3.5-MoE, Gated DeltaNet + gated attention, in the multimodal-wrapper layout of
        make_fixtures.py's qwen3_5_moe_tiny); --out: fixtures folder (default: the repository's fixtures/);
        --steps: for trials only (the committed fixtures are the arch's default STEPS).

--arch qwen3_5_moe: the same corpus, split and tokenizer (its tokenizer.json is byte-identical to
qwen3_moe_trained's: asserted when that folder is there), the same held-out text and cloze task
(fixtures/text/qwen3_moe_trained_heldout.txt, fixtures/tasks/qwen3_moe_trained_cloze.jsonl: checked
byte for byte, not rewritten); Qwen3_5MoeForConditionalGeneration trained as it is (the vision tower
gets no gradient and is never run), saved with fused 3D expert tensors like qwen3_5_moe_tiny; its
float64 references use make_fixtures.py's pure_float64 for the hybrids (every float32 island of
transformers' double mode replaced, the gated delta rule in its recurrent form).
"""

from __future__ import annotations

import argparse
import copy
import gzip
import hashlib
import json
import math
import random
import re
import shutil
import sys
import time
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Importing make_fixtures checks the pinned versions (its _check_versions) before torch is imported.
import make_fixtures as mf  # noqa: E402

PINNED_TOKENIZERS = "0.23.3"  # scripts/requirements-fixtures.txt


def _check_versions() -> None:
    have = metadata.version("tokenizers") if _installed("tokenizers") else "not installed"
    if have != PINNED_TOKENIZERS:
        sys.exit(f"train_fixture.py: version mismatch: tokenizers {have} (want {PINNED_TOKENIZERS}) -- "
                 "pip install -r scripts/requirements-fixtures.txt")


def _installed(pkg: str) -> bool:
    try:
        metadata.version(pkg)
        return True
    except metadata.PackageNotFoundError:
        return False


_check_versions()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file as st_load_file  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402
from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration  # noqa: E402
from transformers.models.qwen3_moe import modeling_qwen3_moe  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe  # noqa: E402

REPO = mf.REPO
NAME = "qwen3_moe_trained"

# ---- corpus -------------------------------------------------------------------------
CORPUS_PACKAGE = "jargon-text"
CORPUS_VERSION = "4.4.7-4.1"
CORPUS_FILE = Path("/usr/share/doc/jargon-text/jargon.txt.gz")
CORPUS_SHA256 = "40dfb4b98191a670a09a183d5798d50f243d23fdbd1495dcc0aca2ce5895ba97"  # of the gunzipped text
HELDOUT_MOD, HELDOUT_REM = 20, 10  # document i held out iff i % 20 == 10
ENTRY = re.compile(r"^   :[^ ].*:")

# ---- tokenizer ----------------------------------------------------------------------
# Qwen2's pre-tokenizer regex, from the tokenizer fixtures' script
from make_tokenizer_fixtures import QWEN2_PATTERN  # noqa: E402  (one home for Qwen2's pre-tokenizer regex)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 1536

# ---- model and training -------------------------------------------------------------
SEED = 1301
CONFIG = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=192, moe_intermediate_size=64,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[2],
    rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    max_position_embeddings=1024, tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
    router_aux_loss_coef=0.01, bos_token_id=None, eos_token_id=0, pad_token_id=0,
)
TRAIN_THREADS = 1
SEQ = 128          # training window (tokens); also the longest context of the perplexity / cloze references
BATCH = 32
STEPS = 1500
LR, LR_MIN, WARMUP = 3e-3, 3e-4, 100
BETAS, WEIGHT_DECAY, CLIP = (0.9, 0.95), 0.1, 1.0
LOG_EVERY, EVAL_EVERY = 100, 500

# ---- --arch: the values above are qwen3_moe's; use_arch() rebinds them for the others -----------------
ARCH = "qwen3_moe"
DATA_NAME = NAME   # the held-out text / cloze task files: qwen3_moe_trained's, for every arch
MODEL_CLS, MODULE = Qwen3MoeForCausalLM, modeling_qwen3_moe
SAVE_ORIGINAL_FORMAT = True   # save_pretrained: one tensor per expert (qwen3_moe_tiny's layout)
VISION = None
# Qwen3.5-MoE (hybrid): the text model under text_config as make_fixtures.py's qwen3_5_moe_tiny, at the
# trained fixture's sizes (vocab 1536, hidden 64, 4 layers, 8 experts top-2); full_attention_interval 4:
# layer_types linear_attention at 0, 1, 2, full_attention at 3.
QWEN3_5_MOE = dict(
    ARCH="qwen3_5_moe", NAME="qwen3_5_moe_trained",
    CONFIG=dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, full_attention_interval=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=False,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        max_position_embeddings=1024, tie_word_embeddings=False, attention_dropout=0.0,
        router_aux_loss_coef=0.01, bos_token_id=None, eos_token_id=0, pad_token_id=0,
    ),
    # the smallest vision tower the class builds (qwen3_5_moe_tiny's); never trained, never run
    VISION=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, patch_size=2, temporal_patch_size=1,
                spatial_merge_size=1, out_hidden_size=64, num_position_embeddings=4),
    MODEL_CLS=Qwen3_5MoeForConditionalGeneration, MODULE=modeling_qwen3_5_moe,
    SAVE_ORIGINAL_FORMAT=False,  # fused 3D experts (gate_up_proj / down_proj), as qwen3_5_moe_tiny
    BATCH=16, STEPS=1000,        # the DeltaNet's torch fallback is slower: fewer tokens in < 20 min
)


def use_arch(arch: str) -> None:
    """Rebind the module's per-arch settings (NAME, CONFIG, STEPS, ...) for --arch."""
    if arch == "qwen3_moe":
        return
    assert arch == "qwen3_5_moe", arch
    globals().update(QWEN3_5_MOE, NOTES=NOTES_QWEN3_5_MOE)


def make_config():
    if VISION is None:
        return Qwen3MoeConfig(**CONFIG, **mf.IMPL)
    return Qwen3_5MoeConfig(text_config=CONFIG, vision_config=VISION, tie_word_embeddings=False, **mf.IMPL)


def cmd() -> str:
    return "scripts/train_fixture.py" + ("" if ARCH == "qwen3_moe" else f" --arch {ARCH}")


def write_or_check(path: Path, text: str) -> None:
    """qwen3_moe writes the shared held-out text / task file; the other arches only check it is the same."""
    if ARCH == "qwen3_moe" or not path.exists():
        path.write_text(text, encoding="utf-8", newline="")
    elif path.read_bytes() != text.encode("utf-8"):
        sys.exit(f"train_fixture.py: {path} differs from what --arch {ARCH} would write (it must be shared)")

# ---- references ---------------------------------------------------------------------
PPL_CONTEXTS = (64, 128)
HELDOUT_TEXT_MIN, HELDOUT_TEXT_MAX = 2500, 4000  # bytes
CLOZE_SEED = 1302
CLOZE_ITEMS = 250
CLOZE_CHOICES = 4
CLOZE_CTX_WORDS = (20, 36)
CLOZE_CONT_WORDS = (1, 3)  # longer continuations: acc 0.31 (4-8 words) .. 0.36 (3-6) for this model; 1-3: ~0.46
MAX_LENGTH = SEQ   # lm-eval's max_length: every item fits (asserted), so nothing is truncated


# ---------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------
def read_corpus() -> str:
    if not CORPUS_FILE.exists():
        sys.exit(f"train_fixture.py: needs the Debian package {CORPUS_PACKAGE} (apt-get install {CORPUS_PACKAGE}): "
                 f"{CORPUS_FILE} not found")
    raw = gzip.decompress(CORPUS_FILE.read_bytes())
    sha = hashlib.sha256(raw).hexdigest()
    if sha != CORPUS_SHA256:
        sys.exit(f"train_fixture.py: {CORPUS_FILE} is not the text of {CORPUS_PACKAGE} {CORPUS_VERSION} "
                 f"(sha256 {sha}, want {CORPUS_SHA256})")
    return raw.decode("utf-8")


def paragraphs(block: list[str]) -> list[tuple[str, str]]:
    """(kind, text) per paragraph: "prose" (every line indented exactly 3 spaces: re-flowed to one line)
    or "verbatim" (kept line by line, the 3-space indent removed)."""
    out, cur = [], []
    for line in block + [""]:
        if line.strip():
            cur.append(line.rstrip())
            continue
        if not cur:
            continue
        if all(ln.startswith("   ") and not ln.startswith("    ") for ln in cur):
            out.append(("prose", " ".join(ln.strip() for ln in cur)))
        else:
            out.append(("verbatim", "\n".join(ln[3:] if ln.startswith("   ") else ln.lstrip() for ln in cur)))
        cur = []
    return out


def documents(text: str) -> list[dict]:
    """The File's documents in order: {"heading", "paras": [(kind, text)], "text"}."""
    lines = text.split("\n")
    def find(pattern: str, start: int = 0) -> int:  # (the headings hold no-break spaces: \s)
        return next(i for i in range(start, len(lines)) if re.fullmatch(pattern, lines[i]))

    start = find(r"Chapter\s1\.\sHacker Slang and Hacker Culture")
    gloss = find(r"Glossary", start)
    first_entry = next(i for i in range(gloss, len(lines)) if ENTRY.match(lines[i]))
    appx = find(r"Appendix\sA\.\sHacker Folklore", first_entry)
    col0 = lambda ln: bool(ln) and not ln[0].isspace()  # noqa: E731
    raw = []
    for a, b, head in ((start, gloss, col0), (first_entry, appx, ENTRY.match), (appx, len(lines), col0)):
        cur = None
        for i in range(a, b):
            if head(lines[i]):
                if cur:
                    raw.append(cur)
                cur = [lines[i]]
            elif cur is not None:
                cur.append(lines[i])
        if cur:
            raw.append(cur)
    docs = []
    for block in raw:
        heading = block[0].strip()
        paras = paragraphs(block[1:])
        if not any(k == "prose" and len(t.split()) >= 10 for k, t in paras):
            continue  # a table of contents, an empty heading
        docs.append(dict(heading=heading, paras=paras, text="\n\n".join([heading] + [t for _, t in paras])))
    return docs


def split(docs: list[dict]) -> tuple[list[dict], list[dict]]:
    train = [d for i, d in enumerate(docs) if i % HELDOUT_MOD != HELDOUT_REM]
    held = [d for i, d in enumerate(docs) if i % HELDOUT_MOD == HELDOUT_REM]
    return train, held


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------
def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    assert tok.token_to_id("<|endoftext|>") == CONFIG["eos_token_id"]
    return tok


def tokenizer_config() -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False, "add_eos_token": False,
            "model_max_length": SEQ, "clean_up_tokenization_spaces": False}


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------
def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    t = (step - WARMUP) / max(1, steps - WARMUP)
    return LR_MIN + 0.5 * (LR - LR_MIN) * (1 + math.cos(math.pi * t))


def windows_of(ids: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Consecutive non-overlapping windows of n tokens; the last kept if it has >= 2 tokens."""
    return [ids[i:i + n] for i in range(0, len(ids), n) if len(ids[i:i + n]) >= 2]


@torch.no_grad()
def stream_loss(model, ids: torch.Tensor) -> float:
    """Mean next-token NLL over SEQ-token windows of a stream (float32, for the training log)."""
    model.eval()
    tot, n = 0.0, 0
    for w in windows_of(ids, SEQ):
        lg = model(input_ids=w[None], use_cache=False).logits[0, :-1].double()
        tot += float(F.cross_entropy(lg, w[1:], reduction="sum"))
        n += len(w) - 1
    model.train()
    return tot / n


def train(stream: torch.Tensor, held_stream: torch.Tensor, steps: int):
    torch.set_num_threads(TRAIN_THREADS)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(SEED)
    config = make_config()
    model = MODEL_CLS(config)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "norm" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=1e-8)
    gen = torch.Generator().manual_seed(SEED + 1)
    ar = torch.arange(SEQ + 1)
    log, acc, acc_aux, t0 = [], 0.0, 0.0, time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        off = torch.randint(0, len(stream) - SEQ - 1, (BATCH,), generator=gen)
        chunk = stream[off[:, None] + ar]
        out = model(input_ids=chunk[:, :-1], use_cache=False, output_router_logits=True)
        ce = F.cross_entropy(out.logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1))
        loss = ce + config.get_text_config().router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        acc += float(ce.detach())
        acc_aux += float(out.aux_loss.detach())
        if (step + 1) % LOG_EVERY == 0 or step + 1 == steps:
            k = LOG_EVERY if (step + 1) % LOG_EVERY == 0 else (step + 1) % LOG_EVERY
            row = dict(step=step + 1, train_loss=acc / k, aux_loss=acc_aux / k, lr=lr_at(step, steps),
                       elapsed_s=time.time() - t0)
            if (step + 1) % EVAL_EVERY == 0 or step + 1 == steps:
                row["heldout_loss"] = stream_loss(model, held_stream)
            log.append(row)
            print(f"   step {step + 1:5d}  train loss {row['train_loss']:.4f}  aux {row['aux_loss']:.4f}  "
                  + (f"held-out {row['heldout_loss']:.4f}  " if "heldout_loss" in row else "")
                  + f"lr {row['lr']:.2e}  {row['elapsed_s']:.0f} s", flush=True)
            acc, acc_aux = 0.0, 0.0
    model.eval()
    return model, log, time.time() - t0


# ---------------------------------------------------------------------------
# Perplexity and cloze, as the C++ tool / lm-evaluation-harness define them
# ---------------------------------------------------------------------------
@torch.no_grad()
def logprobs(model, ids: list[int]) -> torch.Tensor:
    """log_softmax (float64, from the model's logits) of one forward pass from an empty cache: [T, V]."""
    lg = model(input_ids=torch.tensor([ids], dtype=torch.int64), use_cache=False).logits[0]
    return torch.log_softmax(lg.to(torch.float64), dim=-1)


def perplexity(model, ids: list[int], n: int) -> dict:
    wins = [ids[i:i + n] for i in range(0, len(ids), n) if len(ids[i:i + n]) >= 2]
    sums, total, count = [], 0.0, 0
    for w in wins:
        lp = logprobs(model, w)
        nll = -lp[torch.arange(len(w) - 1), torch.tensor(w[1:])]
        sums.append(float(nll.sum()))
        total += float(nll.sum())
        count += len(w) - 1
    mean = total / count
    return dict(mean_nll=mean, perplexity=math.exp(mean), window_nll_sums=sums, n_predictions=count,
                window_lengths=[len(w) for w in wins])


def encode_pair(tok: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's _encode_pair: trailing whitespace of the context moves to the continuation; the
    continuation's ids are those of encode(context + continuation) after len(encode(context))."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation).ids
    ctx = tok.encode(context).ids
    return ctx, whole[len(ctx):]


def loglikelihood(model, ctx: list[int], cont: list[int]) -> float:
    """sum of log p(cont_i | ctx, cont_<i), one forward over (ctx + cont)[:-1] (lm-eval, no truncation)."""
    inp = (ctx + cont)[:-1]
    assert len(inp) <= MAX_LENGTH
    lp = logprobs(model, inp)
    pos = torch.arange(len(ctx) - 1, len(inp))
    return float(lp[pos, torch.tensor(cont)].sum())


def mean_stderr(xs: list[float]) -> float:
    """lm-eval's mean_stderr: sample standard deviation (n - 1) / sqrt(n); = sqrt(p(1-p)/(n-1)) for 0/1."""
    n = len(xs)
    mu = sum(xs) / n
    return math.sqrt(sum((x - mu) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)


def heldout_text(held: list[dict]) -> str:
    """Held-out documents of prose only, in order, joined by blank lines: HELDOUT_TEXT_MIN..MAX bytes."""
    parts, size = [], 0
    for d in held:
        if any(k != "prose" for k, _ in d["paras"]):
            continue
        add = len(d["text"].encode()) + 2
        if size + add > HELDOUT_TEXT_MAX:
            continue
        parts.append(d["text"])
        size += add
        if size >= HELDOUT_TEXT_MIN:
            break
    assert size >= HELDOUT_TEXT_MIN
    return "\n\n".join(parts) + "\n"


def cloze_items(held: list[dict], tok: Tokenizer) -> list[dict]:
    """CLOZE_ITEMS items from held-out prose paragraphs: a context of 20..36 words (successive spans of a
    paragraph overlap by half a context), the true next 1..3 words against CLOZE_CHOICES - 1 distractors
    (gold continuations of other items, from other held-out documents, with as many words), shuffled
    with random.Random(CLOZE_SEED)."""
    rng = random.Random(CLOZE_SEED)
    spans = []
    for di, d in enumerate(held):
        for kind, text in d["paras"]:
            if kind != "prose":
                continue
            words = text.split(" ")
            pos = 0
            while True:
                c, n = rng.randint(*CLOZE_CTX_WORDS), rng.randint(*CLOZE_CONT_WORDS)
                if pos + c + n > len(words):
                    break
                spans.append(dict(doc=di, context=" ".join(words[pos:pos + c]),
                                  cont=" " + " ".join(words[pos + c:pos + c + n]), n_words=n))
                pos += c // 2 + n  # the next context starts halfway into this one
    order = list(range(len(spans)))
    rng.shuffle(order)
    items = []
    for i in order:
        s = spans[i]
        pool = sorted({t["cont"] for t in spans if t["n_words"] == s["n_words"] and t["doc"] != s["doc"]
                       and t["cont"] != s["cont"]})
        choices = [s["cont"]] + rng.sample(pool, CLOZE_CHOICES - 1)
        rng.shuffle(choices)
        ctx = tok.encode(s["context"]).ids
        ok = True
        for ch in choices:
            whole = tok.encode(s["context"] + ch).ids
            ok &= whole[:len(ctx)] == ctx and len(whole) <= MAX_LENGTH
        if not ok:
            continue
        items.append(dict(span=i, context=s["context"], choices=choices, gold=choices.index(s["cont"])))
        if len(items) == CLOZE_ITEMS:
            break
    assert len(items) == CLOZE_ITEMS, len(items)
    items.sort(key=lambda it: it["span"])
    return [dict(context=it["context"], choices=it["choices"], gold=it["gold"]) for it in items]


def score_cloze(models_: dict, tok: Tokenizer, items: list[dict]) -> dict:
    rows = []
    res = {p: {"acc": [], "acc_norm": [], "acc_norm_bytes": []} for p in models_}
    for it in items:
        ctx = None
        row = {"choices": []}
        for ch in it["choices"]:
            c, cont = encode_pair(tok, it["context"], ch)
            assert ctx is None or c == ctx
            ctx = c
            entry = {"cont_ids": cont, "n_tokens": len(cont), "n_chars": len(ch), "n_bytes": len(ch.encode("utf-8"))}
            for p, m in models_.items():
                entry[f"ll_{p}"] = loglikelihood(m, c, cont)
            row["choices"].append(entry)
        row = {"ctx_ids": ctx, **row, "gold": it["gold"]}
        for p in models_:
            ll = [e[f"ll_{p}"] for e in row["choices"]]
            # lm-eval: completion_len = len(choice) -- the str, i.e. characters (code points)
            norm = [e[f"ll_{p}"] / e["n_chars"] for e in row["choices"]]
            norm_b = [e[f"ll_{p}"] / e["n_bytes"] for e in row["choices"]]
            row[f"pred_{p}"] = int(np.argmax(ll))
            row[f"pred_norm_{p}"] = int(np.argmax(norm))
            row[f"pred_norm_bytes_{p}"] = int(np.argmax(norm_b))
            for key, pred in (("acc", "pred"), ("acc_norm", "pred_norm"), ("acc_norm_bytes", "pred_norm_bytes")):
                res[p][key].append(float(row[f"{pred}_{p}"] == it["gold"]))
        rows.append(row)
    totals = {p: {k2: v for key, xs in r.items() for k2, v in ((key, sum(xs) / len(xs)),
                                                                 (key + "_stderr", mean_stderr(xs)))}
              for p, r in res.items()}
    return dict(items=rows, totals=totals)


# ---------------------------------------------------------------------------
# Documentation
# ---------------------------------------------------------------------------
NOTES = ("TRAINED weights (scripts/train_fixture.py: the Jargon File, Debian jargon-text, ~12 min on 1 CPU thread), "
         "not random ones: router gaps, logits and greedy margins are those of a (tiny) real language model. "
         "Architecture as qwen3_moe_tiny: q/k norm (RMSNorm over head_dim per head, before rope); head_dim 32 "
         "explicit (!= hidden/heads = 16); mlp_only_layers [2]: layer 2 is a dense SwiGLU MLP (intermediate_size "
         "192), layers 0, 1, 3 MoE (8 experts, moe_intermediate_size 64, top-2, norm_topk_prob true); no attention "
         "biases; untied lm_head. A tokenizer.json (byte-level BPE, Qwen2 style) ships beside the weights; the "
         "prompt is 24 ids of held-out text.")

NOTES_QWEN3_5_MOE = (
    "TRAINED weights (scripts/train_fixture.py --arch qwen3_5_moe: the Jargon File, Debian jargon-text, 1 CPU "
    "thread; TRAINING.md), not random ones. Architecture as qwen3_5_moe_tiny (Qwen3_5MoeForConditionalGeneration, "
    "multimodal wrapper: config under `text_config`, text weights `model.language_model.*`, a tiny vision tower "
    "`model.visual.*` never trained nor run, `lm_head.weight` at top level, untied), at other sizes: "
    "full_attention_interval 4: Gated DeltaNet (linear attention; 2 key heads / 4 value heads of 16, conv kernel 4) "
    "at layers 0, 1, 2, gated full attention (4 heads / 2 kv heads, head_dim 32, q/k norm, partial rotary 0.25, "
    "theta 1e7) at layer 3. Every layer MoE: softmax router over 8 experts (moe_intermediate_size 64), top-2, "
    "always renormalised, plus a shared expert (intermediate 64) scaled by sigmoid(x . shared_expert_gate^T). "
    "Experts FUSED (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]). RMSNorm weights "
    "zero-centred (y = x/rms(x) * (1 + w)) except the DeltaNet's gated norm. A tokenizer.json (byte-level BPE, "
    "Qwen2 style; the same file as qwen3_moe_trained's) ships beside the weights; the prompt is 24 ids of "
    "held-out text.")

TEXT_REFERENCE_DOC = """\
## text_reference.json

What transformers computes on this folder's weights (float32, `from_pretrained`, eager attention and
experts, 1 thread) and in float64 (`model.double()` under make_fixtures.py's `pure_float64`: RMSNorm,
rotary cos/sin, router softmax and attention softmax in float64 too — the same float64 mode as every
fixture's `f64.*` references). Every log-probability is `log_softmax` taken in float64 of the logits of
that forward (float32 logits upcast for `f32`). Floats are written with Python's `repr` (round-trip exact).

Top level:

* `generator` (`"scripts/train_fixture.py"`), `fixture` (`"qwen3_moe_trained"`), `versions` (the pinned
  torch / transformers / tokenizers), `tokenizer` (`"tokenizer.json"`: ids are
  `Tokenizer.from_file(...).encode(text).ids`, post-processor applied — it adds no BOS / EOS).
* `perplexity`:
  * `text_file` — `fixtures/text/qwen3_moe_trained_heldout.txt`, `text_sha256` / `text_bytes` of its bytes
  * `token_ids` — the ids of the whole file (one encode of its full text, final newline included), `n_tokens`
  * `contexts` — one entry per context length, key the length as a string (`"64"`, `"128"`):
    * `n_windows`, `window_lengths` — the id stream cut into consecutive non-overlapping windows of
      `context` ids, the last one kept if it has >= 2 ids; each window is ONE forward pass from an empty cache
    * `n_predictions` — sum over windows of (length − 1): position t predicts id t + 1 of the same window
    * `f32` / `f64` — `mean_nll` (mean over all predictions of all windows of −log_softmax(logits[t])[id t+1]),
      `perplexity` = exp(mean_nll), `window_nll_sums` (per window, the sum of its NLLs)
* `cloze`:
  * `task_file` — `fixtures/tasks/qwen3_moe_trained_cloze.jsonl`, `task_sha256`, `n_items`, `n_choices`,
    `max_length` (128: lm-eval's max_length; no item needs truncation)
  * `items` — one per line of the task file, in order: `ctx_ids` (encode(context)), `gold`, `choices` (per
    choice: `cont_ids` = encode(context + choice)[len(ctx_ids):] — lm-eval's `_encode_pair`, context never
    ends with whitespace here; `n_tokens`; `n_chars` = length of the choice string in characters (Unicode
    code points, leading space included); `n_bytes` = its UTF-8 length; `ll_f32` / `ll_f64` = Σ log p of
    the `cont_ids`, each predicted in one forward of (ctx_ids + cont_ids)[:-1]), and per precision p in
    {f32, f64}: `pred_p` (argmax of ll: acc's answer), `pred_norm_p` (argmax of ll / n_chars: acc_norm's
    answer — lm-eval's code divides by `len(choice)`, the Python string's length, i.e. characters, not
    bytes), `pred_norm_bytes_p` (argmax of ll / n_bytes; the "byte-length" normalisation lm-eval's docs
    speak of; equal to pred_norm_p wherever the choices are ASCII). Argmax ties: the first index (numpy).
  * `f32` / `f64` — `acc`, `acc_stderr`, `acc_norm`, `acc_norm_stderr`, `acc_norm_bytes`,
    `acc_norm_bytes_stderr`: lm-evaluation-harness's definitions (acc = mean over items of [pred == gold];
    stderr = its `mean_stderr`, sample standard deviation / √n = √(p(1−p)/(n−1)))

The task file (`fixtures/tasks/qwen3_moe_trained_cloze.jsonl`, see `fixtures/tasks/README.md`) holds the
strings; text_reference.json the ids and numbers, item i of one = line i of the other.
"""


def text_reference_doc() -> str:
    if ARCH == "qwen3_moe":
        return TEXT_REFERENCE_DOC
    doc = TEXT_REFERENCE_DOC
    for old, new in (
            ('`fixture` (`"qwen3_moe_trained"`)', f'`fixture` (`"{NAME}"`)'),
            ("rotary cos/sin, router softmax and attention softmax in float64 too — the same float64 mode as every\n"
             "fixture's `f64.*` references).",
             "rotary cos/sin, router softmax and attention softmax in float64 too, and for this hybrid also the (1 + w)\n"
             "RMSNorm, the DeltaNet's gated RMSNorm, its decay g and the gated delta rule, run in its recurrent form —\n"
             "the same float64 mode as every hybrid fixture's `f64.*` references; float32 runs transformers' own\n"
             "chunked delta rule over each forward).")):
        assert doc.count(old) == 1, old
        doc = doc.replace(old, new)
    return doc


def model_md(t: dict) -> str:
    """TRAINING.md's model paragraph."""
    if ARCH == "qwen3_moe":
        return ("Qwen3MoeForCausalLM: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in CONFIG.items()) + ". "
                f"{t['n_params']:,} parameters, F32. transformers' default init (seeded torch.manual_seed({SEED})).")
    return (f"{MODEL_CLS.__name__} (multimodal wrapper, as make_fixtures.py's qwen3_5_moe_tiny), text_config: "
            + ", ".join(f"{k} {json.dumps(v)}" for k, v in CONFIG.items())
            + f" (layer_types {json.dumps(t['layer_types'])}); vision_config: "
            + ", ".join(f"{k} {json.dumps(v)}" for k, v in VISION.items()) + ". "
            f"{t['n_params']:,} parameters in the text model and lm_head (+ {t['n_params_vision']:,} in the vision "
            "tower, which gets no gradient: left at its init, never run), F32; experts saved fused "
            "(save_original_format=False). transformers' default init (seeded "
            f"torch.manual_seed({SEED})).")


def training_md(info: dict) -> str:
    t = info
    L = [f"# {NAME} — how it was trained", "",
         f"`scripts/train_fixture.py` (run: `python3 {cmd()}`, after `apt-get install "
         f"{CORPUS_PACKAGE}` and `pip install -r scripts/requirements-fixtures.txt`). Torch {mf.PINNED['torch']}, "
         f"transformers {mf.PINNED['transformers']}, tokenizers {PINNED_TOKENIZERS}, float32 on the CPU, "
         f"{TRAIN_THREADS} thread{'s' if TRAIN_THREADS > 1 else ''} for training (byte-identical weights need the "
         "same thread count, versions and CPU kind), 1 thread for the references.", "",
         "## Corpus", "",
         f"* package: Debian `{CORPUS_PACKAGE}` {CORPUS_VERSION} (main), file `{CORPUS_FILE}` — the Jargon File "
         f"4.4.7 (Eric S. Raymond et al.), plain text",
         "* licence: public domain (\"This document (the Jargon File) is in the public domain, to be freely used, "
         "shared, and modified\", /usr/share/doc/jargon-text/copyright)",
         f"* sha256 of the gunzipped text: `{CORPUS_SHA256}` ({t['corpus_bytes']:,} bytes)",
         "* why: real, human-written English prose (essays on hacker culture, 2,307 glossary entries, folklore), "
         "1.7 MB in one plain-text file of Debian main under the clearest licence there is; learnable by a "
         f"{t['n_params'] / 1e6:.1f}-million-parameter model in minutes. Not taken: fortunes (quotations of mixed authorship and unclear "
         "licence), python3.11-doc (reST and code more than prose), debian-reference-en (HTML / PDF).",
         f"* documents: {t['n_docs']} (chapter and appendix sections split at unindented headings, glossary "
         "entries at their `:headword:` lines; tables of contents dropped); prose paragraphs re-flowed to one "
         "line, other paragraphs kept line by line",
         f"* split: document i held out iff i % {HELDOUT_MOD} == {HELDOUT_REM}: {t['n_train_docs']} training "
         f"documents ({t['train_bytes']:,} bytes, {t['train_tokens']:,} tokens with one `<|endoftext|>` after "
         f"each), {t['n_held_docs']} held out ({t['held_bytes']:,} bytes, {t['held_tokens']:,} tokens). Only "
         "held-out text is committed (`fixtures/text/`, `fixtures/tasks/`).", "",
         "## Tokenizer", "",
         f"`tokenizer.json`: byte-level BPE trained with tokenizers {PINNED_TOKENIZERS} (BpeTrainer, vocab_size "
         f"{VOCAB}, min_frequency 2, the 256 ByteLevel bytes as initial alphabet) on the training documents only. "
         "Qwen2 style: normalizer NFC; pre-tokenizer Sequence[Split(Qwen2's regex, behavior isolated), "
         "ByteLevel(add_prefix_space false, use_regex false)]; decoder ByteLevel; post-processor ByteLevel (no "
         "BOS, no EOS added); special tokens `<|endoftext|>` = 0 (eos, pad, document separator), `<|im_start|>` "
         f"= 1, `<|im_end|>` = 2. Vocabulary size = model vocab_size = {VOCAB} exactly. "
         f"`tokenizer_config.json`: a minimal PreTrainedTokenizerFast config (eos `<|endoftext|>`, no BOS). "
         f"Held-out text: {t['held_bytes_per_token']:.2f} bytes per token."
         + ("" if ARCH == "qwen3_moe" else
            f" The file is byte-identical to `qwen3_moe_trained/tokenizer.json` (sha256 `{t['tokenizer_sha256']}`, "
            "asserted): the same training documents and trainer."), "",
         "## Model", "",
         model_md(t), "",
         "## Training", "",
         f"* {t['steps']} steps of {BATCH} windows × {SEQ} tokens ({t['steps'] * BATCH * SEQ:,} tokens, "
         f"{t['steps'] * BATCH * SEQ / t['train_tokens']:.1f} epochs); window starts uniform over the training "
         f"stream from torch.Generator().manual_seed({SEED + 1}); loss = mean next-token cross-entropy + "
         f"{CONFIG['router_aux_loss_coef']} × transformers' load-balancing aux loss"
         + ("" if ARCH == "qwen3_moe" else "; the vision tower's parameters get no gradient (AdamW skips them)"),
         f"* AdamW, lr {LR:g} peak, linear warm-up {WARMUP} steps, cosine to {LR_MIN:g}; betas {BETAS}, "
         f"weight decay {WEIGHT_DECAY} (matrices only, not norms), gradient clipping {CLIP}; no dropout",
         f"* wall time: training {t['train_s']:.0f} s ({t['train_s'] / 60:.1f} min), whole script "
         f"{t['total_s']:.0f} s, {TRAIN_THREADS} thread{'s' if TRAIN_THREADS > 1 else ''} on a 2-core machine that "
         "was compiling C++ at the same time (per-step times: the elapsed column of the log below)", "",
         f"Loss every {LOG_EVERY} steps (train: mean over those steps; held-out: mean NLL over {SEQ}-token "
         f"windows of the held-out stream, float32):", "",
         "| step | train loss | aux loss | held-out loss | lr | elapsed s |", "|---|---|---|---|---|---|"]
    for r in t["log"]:
        L.append(f"| {r['step']} | {r['train_loss']:.4f} | {r['aux_loss']:.4f} | "
                 + (f"{r['heldout_loss']:.4f}" if "heldout_loss" in r else "")
                 + f" | {r['lr']:.2e} | {r['elapsed_s']:.0f} |")
    ppl, cz = t["ppl"], t["cloze"]
    L += ["", "## Results", "",
          f"Held-out perplexity of `fixtures/text/qwen3_moe_trained_heldout.txt` ({t['ppl_tokens']} tokens), "
          f"as the C++ tool computes it (non-overlapping windows, each from an empty cache), vocabulary {VOCAB}:", "",
          "| context | predictions | perplexity f32 | perplexity f64 | mean NLL f32 | mean NLL f64 |",
          "|---|---|---|---|---|---|"]
    for n in PPL_CONTEXTS:
        c = ppl[str(n)]
        L.append(f"| {n} | {c['n_predictions']} | {c['f32']['perplexity']:.4f} | {c['f64']['perplexity']:.4f} | "
                 f"{c['f32']['mean_nll']:.6f} | {c['f64']['mean_nll']:.6f} |")
    L += ["", f"Whole held-out stream ({t['held_tokens']:,} tokens, {SEQ}-token windows, float32): perplexity "
          f"{math.exp(t['log'][-1]['heldout_loss']):.2f}.", "",
          f"Cloze (`fixtures/tasks/qwen3_moe_trained_cloze.jsonl`, {CLOZE_ITEMS} items, {CLOZE_CHOICES} choices, "
          f"chance {1 / CLOZE_CHOICES:.2f}), lm-evaluation-harness definitions:", "",
          "| | acc | acc_stderr | acc_norm | acc_norm_stderr | acc_norm_bytes | acc_norm_bytes_stderr |",
          "|---|---|---|---|---|---|---|"]
    for p in ("f32", "f64"):
        c = cz[p]
        L.append(f"| {p} | {c['acc']:.4f} | {c['acc_stderr']:.4f} | {c['acc_norm']:.4f} | {c['acc_norm_stderr']:.4f} "
                 f"| {c['acc_norm_bytes']:.4f} | {c['acc_norm_bytes_stderr']:.4f} |")
    L += ["", f"f32 vs f64: max |Δ loglikelihood| over all cloze choices {t['cloze_max_d']:.3e}; items whose acc "
          f"answer differs {t['cloze_pred_diff']}; max |Δ mean NLL| {t['ppl_max_d']:.3e}.", "",
          "Reference prompt (`reference.safetensors` `input_ids`, 24 ids): the first 24 tokens of the held-out "
          f"text's first paragraph, {json.dumps(t['prompt_text'], ensure_ascii=False)}.", "",
          text_reference_doc()]
    return "\n".join(L)


def update_models_readme(models_dir: Path, fx: dict) -> None:
    """Insert (or replace) this fixture's bullet in models/README.md, after the last bullet of the index
    list. make_fixtures.py keeps it when it rewrites that file (the folder holds TRAINING.md)."""
    path = models_dir / "README.md"
    lines = path.read_text().split("\n") if path.exists() else ["# Fixture models", ""]
    lines = [ln for ln in lines if not ln.startswith(f"* `{NAME}/`")]
    bullet = mf.index_lines(fx, models_dir)[0] + (
        f" — TRAINED (not random): `scripts/train_fixture.py` on the Jargon File (Debian jargon-text, public "
        f"domain), with `tokenizer.json` (byte-level BPE, Qwen2 style), `text_reference.json` (held-out "
        f"perplexity at contexts 64 / 128 and a {CLOZE_ITEMS}-item cloze task, float32 and float64) and "
        f"`TRAINING.md`" + ("" if ARCH == "qwen3_moe" else
                            "; tokenizer, held-out text and cloze task the same as `qwen3_moe_trained`'s"))
    last = max([i for i, ln in enumerate(lines) if ln.startswith("* `")], default=len(lines) - 1)
    lines.insert(last + 1, bullet)
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "fixtures"), help="fixtures folder (default: repo fixtures/)")
    ap.add_argument("--arch", choices=["qwen3_moe", "qwen3_5_moe"], default="qwen3_moe",
                    help="qwen3_moe (default: qwen3_moe_trained) or qwen3_5_moe (qwen3_5_moe_trained)")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"training steps (default {STEPS} for qwen3_moe, {QWEN3_5_MOE['STEPS']} for qwen3_5_moe; "
                         "others for trials)")
    args = ap.parse_args()
    use_arch(args.arch)
    if args.steps is None:
        args.steps = STEPS
    t_start = time.time()
    out_root = Path(args.out)
    models_dir = out_root / "models"
    fdir = models_dir / NAME

    text = read_corpus()
    docs = documents(text)
    train_docs, held_docs = split(docs)
    print(f"== corpus: {len(docs)} documents, {len(train_docs)} train / {len(held_docs)} held out", flush=True)
    tok = train_tokenizer([d["text"] for d in train_docs])
    eos = tok.token_to_id("<|endoftext|>")
    train_ids = []
    for d in train_docs:
        train_ids += tok.encode(d["text"]).ids + [eos]
    held_ids = []
    for d in held_docs:
        held_ids += tok.encode(d["text"]).ids + [eos]
    stream = torch.tensor(train_ids, dtype=torch.int64)
    held_stream = torch.tensor(held_ids, dtype=torch.int64)
    print(f"   tokenizer: vocab {tok.get_vocab_size()}; train {len(train_ids)} tokens, held out {len(held_ids)}",
          flush=True)

    print(f"== training {args.steps} steps", flush=True)
    model, log, train_s = train(stream, held_stream, args.steps)

    # ---- save the model and the tokenizer --------------------------------------------
    if fdir.exists():
        shutil.rmtree(fdir)
    model.save_pretrained(str(fdir), save_original_format=SAVE_ORIGINAL_FORMAT)  # qwen3_moe: one tensor per expert
    tok.save(str(fdir / "tokenizer.json"), pretty=True)
    (fdir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    if ARCH != "qwen3_moe":  # the same tokenizer as qwen3_moe_trained, byte for byte
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shared = models_dir / DATA_NAME / f
            assert not shared.exists() or shared.read_bytes() == (fdir / f).read_bytes(), f
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(),
                                  mf.reload(MODEL_CLS, fdir).state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1
    write_references(out_root, dict(text=text, docs=docs, train_docs=train_docs, held_docs=held_docs,
                                    train_ids=train_ids, held_ids=held_ids, log=log, train_s=train_s,
                                    t_start=t_start, steps=args.steps))


def write_references(out_root: Path, run: dict) -> None:
    """Everything after training, from the folder's files: reference.safetensors, REFERENCE.md, the
    held-out text, the cloze task, text_reference.json, TRAINING.md, the models/README.md bullet."""
    text, docs, train_docs, held_docs = run["text"], run["docs"], run["train_docs"], run["held_docs"]
    train_ids, held_ids, log, train_s, t_start = (run[k] for k in ("train_ids", "held_ids", "log", "train_s",
                                                                    "t_start"))
    models_dir = out_root / "models"
    fdir = models_dir / NAME
    tok = Tokenizer.from_file(str(fdir / "tokenizer.json"))  # what is tested is the file, as saved
    cfg_json = json.loads((fdir / "config.json").read_text())

    # ---- references: make_fixtures.py's machinery, 1 thread ---------------------------
    mf.setup_torch()
    m = mf.reload(MODEL_CLS, fdir)
    m64 = copy.deepcopy(m).double().eval()
    module = MODULE

    # held-out text and the prompt
    htext = heldout_text(held_docs)
    (out_root / "text").mkdir(parents=True, exist_ok=True)
    text_path = out_root / "text" / f"{DATA_NAME}_heldout.txt"
    write_or_check(text_path, htext)
    first_para = htext.split("\n\n")[1]  # [0] is the first document's heading line
    prompt = tok.encode(first_para).ids[:mf.PROMPT_LEN]
    assert len(prompt) == mf.PROMPT_LEN
    ids = torch.tensor(prompt, dtype=torch.int64)

    fx = dict(name=NAME, arch=ARCH, seed=SEED, config=CONFIG, notes=NOTES)
    ref, stats, nums = mf.compute_reference(m, ids, module, greedy_tol=mf.greedy_tol_of(ARCH))
    nums["d_numpy_f64"] = mf.numpy_check(cfg_json, st_load_file(str(fdir / "model.safetensors")), ref)
    nums["E"] = mf.n_experts(cfg_json)
    mf.save_reference(fdir / "reference.safetensors", ref, NAME)
    extra = (f"Weights TRAINED by `{cmd()}` (see TRAINING.md), not made by make_fixtures.py; "
             f"the reference data is make_fixtures.py's compute_reference / save_reference / reference_md on them. "
             f"Prompt: 24 ids of held-out text, {json.dumps(tok.decode(prompt), ensure_ascii=False)}. No border "
             f"tokens are planted.")
    md = mf.reference_md(fx, cfg_json, ref, nums, [], extra)
    old_in = [w for k, w in mf.DESCRIPTIONS if k == "input_ids"][0]
    assert md.count(old_in) == 1 and md.count("Produced by `scripts/make_fixtures.py`") == 1
    md = md.replace(old_in, "the prompt: 24 ids, the first tokens (tokenizer.json) of the first paragraph of "
                            "fixtures/text/qwen3_moe_trained_heldout.txt (held-out text)")
    md = md.replace("Produced by `scripts/make_fixtures.py`", "Produced by `scripts/train_fixture.py` "
                    "(with scripts/make_fixtures.py's reference code)")
    (fdir / "REFERENCE.md").write_text(md)

    # ---- perplexity ---------------------------------------------------------------------
    print("== perplexity and cloze references", flush=True)
    pairs = {"f32": (m, None), "f64": (m64, module)}
    text_ids = tok.encode(htext).ids
    ppl = {}
    for n in PPL_CONTEXTS:
        entry = {}
        for p, (mm, mod) in pairs.items():
            if mod is None:
                r = perplexity(mm, text_ids, n)
            else:
                with mf.pure_float64(mod):
                    r = perplexity(mm, text_ids, n)
            entry[p] = dict(mean_nll=r["mean_nll"], perplexity=r["perplexity"], window_nll_sums=r["window_nll_sums"])
            entry["n_predictions"], entry["window_lengths"] = r["n_predictions"], r["window_lengths"]
        entry["n_windows"] = len(entry["window_lengths"])
        ppl[str(n)] = {k: entry[k] for k in ("n_windows", "window_lengths", "n_predictions", "f32", "f64")}
        print(f"   context {n}: perplexity f32 {entry['f32']['perplexity']:.4f}  f64 {entry['f64']['perplexity']:.4f}"
              f"  ({entry['n_predictions']} predictions; vocab {VOCAB})", flush=True)
        assert entry["f64"]["perplexity"] < VOCAB / 5, "held-out perplexity is not far below the vocabulary size"

    # ---- cloze ----------------------------------------------------------------------------
    items = cloze_items(held_docs, tok)
    (out_root / "tasks").mkdir(parents=True, exist_ok=True)
    task_path = out_root / "tasks" / f"{DATA_NAME}_cloze.jsonl"
    write_or_check(task_path, "".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items))
    sc32 = score_cloze({"f32": m}, tok, items)
    with mf.pure_float64(module):
        sc64 = score_cloze({"f64": m64}, tok, items)
    rows = []
    for r32, r64 in zip(sc32["items"], sc64["items"]):
        assert r32["ctx_ids"] == r64["ctx_ids"]
        ch = [dict(cont_ids=a["cont_ids"], n_tokens=a["n_tokens"], n_chars=a["n_chars"], n_bytes=a["n_bytes"],
                   ll_f32=a["ll_f32"], ll_f64=b["ll_f64"]) for a, b in zip(r32["choices"], r64["choices"])]
        rows.append(dict(ctx_ids=r32["ctx_ids"], gold=r32["gold"], choices=ch,
                         **{f"{k}_{p}": r[f"{k}_{p}"] for p, r in (("f32", r32), ("f64", r64))
                            for k in ("pred", "pred_norm", "pred_norm_bytes")}))
    totals = {"f32": sc32["totals"]["f32"], "f64": sc64["totals"]["f64"]}
    for p, c in totals.items():
        print(f"   cloze {p}: acc {c['acc']:.4f} ± {c['acc_stderr']:.4f}  acc_norm {c['acc_norm']:.4f} ± "
              f"{c['acc_norm_stderr']:.4f}  (chance {1 / CLOZE_CHOICES:.2f})", flush=True)
    assert totals["f64"]["acc"] > 1 / CLOZE_CHOICES + 3 * totals["f64"]["acc_stderr"], "cloze accuracy near chance"

    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    tref = {
        "generator": "scripts/train_fixture.py", "fixture": NAME,
        "versions": {"torch": mf.PINNED["torch"], "transformers": mf.PINNED["transformers"],
                     "tokenizers": PINNED_TOKENIZERS},
        "tokenizer": "tokenizer.json",
        "perplexity": {"text_file": f"fixtures/text/{text_path.name}", "text_sha256": sha(text_path),
                       "text_bytes": text_path.stat().st_size, "n_tokens": len(text_ids), "token_ids": text_ids,
                       "contexts": ppl},
        "cloze": {"task_file": f"fixtures/tasks/{task_path.name}", "task_sha256": sha(task_path),
                  "n_items": len(items), "n_choices": CLOZE_CHOICES, "max_length": MAX_LENGTH,
                  "f32": totals["f32"], "f64": totals["f64"], "items": rows},
    }
    # one item / window list per line: reviewable diffs
    body = json.dumps({k: v for k, v in tref.items() if k not in ("perplexity", "cloze")}, ensure_ascii=False)[:-1]
    pj = json.dumps(tref["perplexity"], ensure_ascii=False)
    cz = {k: v for k, v in tref["cloze"].items() if k != "items"}
    lines = [body + ',\n "perplexity": ' + pj + ',\n "cloze": ' + json.dumps(cz, ensure_ascii=False)[:-1]
             + ', "items": [']
    lines += [" " + json.dumps(r) + ("," if i + 1 < len(rows) else "") for i, r in enumerate(rows)]
    lines += ["]}}"]
    (fdir / "text_reference.json").write_text("\n".join(lines) + "\n")
    assert json.loads((fdir / "text_reference.json").read_text()) == json.loads(json.dumps(tref))

    # ---- TRAINING.md, README, summary -------------------------------------------------------
    all_ll = [(c["ll_f32"], c["ll_f64"]) for r in rows for c in r["choices"]]
    info = dict(
        corpus_bytes=len(text.encode()), n_docs=len(docs), n_train_docs=len(train_docs), n_held_docs=len(held_docs),
        train_bytes=sum(len(d["text"].encode()) for d in train_docs),
        held_bytes=sum(len(d["text"].encode()) for d in held_docs),
        train_tokens=len(train_ids), held_tokens=len(held_ids),
        held_bytes_per_token=sum(len(d["text"].encode()) for d in held_docs) / (len(held_ids) - len(held_docs)),
        n_params=sum(p.numel() for n, p in m.named_parameters() if not n.startswith("model.visual.")),
        n_params_vision=sum(p.numel() for n, p in m.named_parameters() if n.startswith("model.visual.")),
        layer_types=m.config.get_text_config().layer_types if ARCH != "qwen3_moe" else None,
        tokenizer_sha256=sha(fdir / "tokenizer.json"), steps=run["steps"], log=log, train_s=train_s,
        total_s=time.time() - t_start, ppl=ppl, ppl_tokens=len(text_ids), cloze=totals,
        cloze_max_d=max(abs(a - b) for a, b in all_ll),
        cloze_pred_diff=sum(r["pred_f32"] != r["pred_f64"] for r in rows),
        ppl_max_d=max(abs(ppl[str(n)]["f32"]["mean_nll"] - ppl[str(n)]["f64"]["mean_nll"]) for n in PPL_CONTEXTS),
        prompt_text=tok.decode(prompt),
    )
    (fdir / "TRAINING.md").write_text(training_md(info))
    update_models_readme(models_dir, fx)

    total = 0
    for rel, size in mf.file_sizes(fdir):
        total += size
        print(f"  {size:10d}  {sha(fdir / rel)[:12]}  {NAME}/{rel}")
    print(f"  {total:10d}  total {NAME}/ ({total / 2**20:.2f} MiB); training {train_s:.0f} s, "
          f"whole run {time.time() - t_start:.0f} s")
    assert total < 5 * 1024 * 1024, f"{NAME} is over 5 MB"


if __name__ == "__main__":
    main()
