#!/usr/bin/env python3
"""Feeds random option values to every subcommand of kvasir-equiv (issue #22).

Every option of every subcommand is read from the command's own --help (so
an option added later is covered). Each case starts from a cheap, valid
command line for the subcommand and sets ONE option (or a positional) to a
value drawn, with a fixed seed, from a pool of hostile values: negative,
zero, overflowing and fractional numbers, nan/inf, hex, spaces, empty
strings, separators, non-UTF-8 bytes, and special files (a FIFO, a socket,
a folder, a symlink loop, /dev/zero for inputs). Asserts:
  * the exit code is 0, 1 or 2 — never 3 (an internal error), never a signal,
    never a hang (60 s);
  * a malformed number given to a numeric option (INT/UINT/FLOAT in --help)
    is exit 2 and the one-line message names the option;
  * stderr of an exit 2 is one line.
Output options only ever get paths inside the scratch folder: a regression
must not be able to write over a device of the machine running the test.

Usage: cli_fuzz.py BIN SCRATCH_DIR [--cases N] [--seed S]
"""
import argparse
import os
import random
import re
import socket
import subprocess
import sys

OUTPUT_OPTIONS = {"-o", "--output", "--junit", "--markdown", "--csv", "--svg-heatmap", "--svg-drift", "--html"}
MALFORMED = ["abc", "1e999", "-1e999", "nan", "inf", "0x10", " 3", "3 ", "", "1,5", "--"]
# Integers that overflow 64 bits (a valid double), and fractions (a valid double too).
MALFORMED_INTEGERS = ["18446744073709551616", "-9223372036854775809", "1.5", "1e3"]


def parse_help(text):
    """[(names, type)] for each option line of CLI11's help; type '' for flags."""
    opts, positionals = [], []
    section = None
    for line in text.splitlines():
        if re.match(r"^\S", line):
            section = line.strip().rstrip(":")
            continue
        m = re.match(r"^  (\S+)(?: ([A-Z]+)\S*)?", line)
        if not m:
            continue
        names, typ = m.group(1), m.group(2) or ""
        if section == "Positionals":
            positionals.append((names, typ))
        elif section == "Options":
            parts = names.split(",")
            if "--help" in parts:
                continue
            opts.append((parts, typ))
    return opts, positionals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("scratch")
    ap.add_argument("--cases", type=int, default=160)
    ap.add_argument("--seed", type=int, default=20261202)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    s = a.scratch
    fifo, sock, folder, loop = (os.path.join(s, n) for n in ("fifo", "sock", "dir", "loop"))
    os.mkfifo(fifo)
    socket.socket(socket.AF_UNIX).bind(sock)
    os.mkdir(folder)
    os.symlink("loop", loop)
    ci = "protocols/ci.json"
    ref, cpu = os.path.join(s, "ref.st"), os.path.join(s, "cpu.st")
    for node, out in (("cpu-ref", ref), ("cpu", cpu)):
        subprocess.run([a.bin, "capture", "--backend", node, "-p", ci, "--steps", "ops", "-o", out], check=True,
                       stdout=subprocess.DEVNULL)
    steps = ["-b", "cpu-ref,cpu", "--tokens", "6"]
    base = {
        "audit": ["-p", ci, "-b", "cpu-ref,cpu", "--in-process"],
        "capture": ["--backend", "cpu", "-p", ci, "--steps", "ops", "-o", os.path.join(s, "c.st")],
        "compare": ["-p", ci, "--only-steps", "ops", ref, cpu],
        "backends": [],
        "ops": ["-b", "cpu-ref,cpu", "--ops", "matmul", "--hidden", "32", "--intermediate", "16", "--tokens", "2"],
        "matrix": ["-b", "cpu-ref,cpu", "--tokens", "2"],
        "drift": steps, "logits": steps, "decide": steps,
        "generate": steps + ["-n", "2"],
        "perplexity": ["-b", "cpu-ref,cpu", "--tokens", "12", "--context", "4"],
        "inspect": ["fixtures/models/qwen3_moe_tiny"],
    }
    values = ["-1", "0", "1", "2", "3", "-9223372036854775809", "9223372036854775808", "18446744073709551616", "1e999",
              "-1e999", "nan", "inf", "1e-400", "0.5", "0x10", " 3", "3 ", "abc", "", "-", ",", "a,,b", "cpu:acc=f8",
              "cpu-ref,cpu-ref", "ops,warmup", "\u00e9\u4e2d", "x" * 5000]
    inputs = [fifo, sock, folder, loop, "/dev/zero", os.path.join(s, "missing"), ci, ref]

    helps = {}
    for sub in base:
        text = subprocess.run([a.bin, sub, "--help"], capture_output=True, text=True, check=True).stdout
        helps[sub] = parse_help(text)
    failures, runs = 0, 0

    def run(sub, argv, numeric_option=None):
        nonlocal failures, runs
        runs += 1
        cmd = [a.bin, sub] + argv
        env = dict(os.environ, OMP_NUM_THREADS="1")
        try:
            p = subprocess.run(cmd, capture_output=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            print(f"FAIL (hang > 60 s): {cmd}")
            failures += 1
            return
        err = p.stderr.decode("utf-8", "replace").strip()
        bad = None
        if p.returncode < 0:
            bad = f"killed by signal {-p.returncode}"
        elif p.returncode not in (0, 1, 2):
            bad = f"exit {p.returncode}"
        elif p.returncode == 2 and len(err.splitlines()) != 1:
            bad = f"exit 2 with {len(err.splitlines())} stderr lines"
        elif numeric_option is not None and (p.returncode != 2 or numeric_option not in err):
            bad = f"malformed number for {numeric_option}: exit {p.returncode} (wanted 2 naming the option)"
        if bad:
            print(f"FAIL ({bad}): {cmd!r}\n  stderr: {err[:300]}")
            failures += 1

    # Every numeric option, every malformed number class (a deterministic sweep).
    for sub, (opts, _) in helps.items():
        for names, typ in opts:
            if typ in ("INT", "UINT", "FLOAT"):
                long = [n for n in names if n.startswith("--")][0]
                for v in MALFORMED + (MALFORMED_INTEGERS if typ != "FLOAT" else []):
                    run(sub, base[sub] + [f"{long}={v}"], numeric_option=long)
    # Random cases: one option (or positional) of one subcommand set to a hostile value.
    subs = sorted(base)
    for _ in range(a.cases):
        sub = rng.choice(subs)
        opts, positionals = helps[sub]
        choices = [("opt", o) for o in opts] + [("pos", p) for p in positionals]
        if not choices:
            run(sub, base[sub] + [rng.choice(values)])
            continue
        kind, (names, typ) = rng.choice(choices)
        if kind == "pos":
            argv = [x for x in base[sub] if x not in (ref, cpu, "fixtures/models/qwen3_moe_tiny")]
            run(sub, argv + [rng.choice(values + inputs)])
            continue
        long = [n for n in names if n.startswith("--")][0]
        if typ == "":  # a flag: given, or given a value it does not take
            run(sub, base[sub] + ([long] if rng.random() < 0.5 else [f"{long}={rng.choice(values)}"]))
            continue
        if long in OUTPUT_OPTIONS or set(names) & OUTPUT_OPTIONS:
            v = rng.choice([fifo, sock, folder, loop, "", os.path.join(s, f"out{runs}.x"), os.path.join(s, "no/such/dir/x")])
        elif long in ("--model", "--protocol", "--tokens-file", "--stream"):
            v = rng.choice(inputs + values)
        else:
            v = rng.choice(values)
        # Replace the base's own value of this option, if it has one.
        argv = list(base[sub])
        for n in names:
            if n in argv:
                i = argv.index(n)
                del argv[i:i + 2]
        run(sub, argv + [f"{long}={v}"])
    print(f"{runs} runs, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
