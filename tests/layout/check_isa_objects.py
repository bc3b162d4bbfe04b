#!/usr/bin/env python3
"""The files compiled for an instruction set the CPU may lack (kernels/cpu/*_avx512.cpp)
must define no weak symbol.

A weak (COMDAT) definition — an inline function or template instantiation such as
std::fill<float*, float> or std::vector<double>'s constructor — is emitted by every
object that uses it, and the linker keeps ONE of the copies for the whole program.
If it keeps the copy compiled with -mavx512f, code that runs on any CPU (the generic
and AVX2 paths) calls AVX-512 instructions and dies of SIGILL on an AVX2-only CPU
such as the AMD EPYC (Zen 3) machines of this project. Keeping these files free of
weak symbols (everything they use inlined, or local to them) rules that out.

Usage: check_isa_objects.py LIBRARY.a   (nm from binutils)
"""
import subprocess
import sys

lib = sys.argv[1]
out = subprocess.run(["nm", "-C", "--defined-only", lib], check=True, capture_output=True, text=True).stdout
member, bad, seen = None, [], []
for line in out.splitlines():
    if line.endswith(".o:"):
        member = line[:-1].split("/")[-1]
        if "_avx512." in member:
            seen.append(member)
        continue
    if member is None or "_avx512." not in member:
        continue
    parts = line.split(None, 2)
    if len(parts) == 3 and parts[1] in ("W", "V", "u") and "DW.ref.__gxx_personality_v0" not in parts[2]:
        bad.append(f"{member}: {parts[1]} {parts[2]}")
if not seen:
    print(f"FAIL: no *_avx512 object in {lib}")
    sys.exit(1)
for b in bad:
    print("FAIL: weak symbol in an AVX-512 object (the linker may pick it for every CPU):", b)
print(f"{len(seen)} AVX-512 object(s) checked: {', '.join(seen)}; {len(bad)} weak symbol(s)")
sys.exit(1 if bad else 0)
