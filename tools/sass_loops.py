#!/usr/bin/env python3
"""tools/sass_loops.py — what ptxas made of a CUDA file's hot loops, without a GPU: compiles
one src/cuda/*.cu for sm_90a (nvcc -cubin, -Xptxas -v), disassembles it (cuobjdump -sass)
and prints, for every kernel matching --kernel, its registers and spills, and for each of its
backward branches (a loop) the loop's instruction count, the counts of the instructions that
matter for a GEMM-like loop (HGMMA / HMMA tensor instructions, BAR block barriers, LDGSTS
copies, LDS shared reads, HFMA2), the local-memory traffic inside it (LDL / STL: spills in
the loop) and S2R reads of special registers inside it, the thread index's apart (a thread
index read in a loop is ptxas recomputing per-thread values instead of holding them:
docs/ARCHITECTURE.md, trap 62; nested loops are listed each, the outer including the inner).

Counting is static (each instruction once, branches not weighted): compare a loop before and
after a change, then measure on a card (docs/PERFORMANCE.md, session 40: the prefill GEMM's
loop 466 → 320 instructions was a 5–12 % faster launch).

cuobjdump is not in this machine's CUDA toolkit: `pip install nvidia-cuda-cuobjdump` into any
venv (PyPI's CUDA binaries) and pass its path with --cuobjdump, or put it on PATH.

  tools/sass_loops.py src/cuda/cuda_gemm_wg.cu [--kernel gemm_wg] [--min-loop 50] [--ops 12]
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

INS = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRA = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")
WATCH = ("HGMMA", "HMMA", "BAR", "LDGSTS", "LDS", "HFMA2", "LDL", "STL", "S2R")


def opcode(text):
    """The instruction's opcode without its predicate and modifiers (`@!P0 LDS.128` → LDS)."""
    words = re.sub(r"^@!?U?P\w+\s+", "", text).split()
    return words[0].split(".")[0] if words else ""


def functions(sass):
    """{mangled name: [(address, text)]} of a cuobjdump -sass listing."""
    out = {}
    for part in sass.split("Function : ")[1:]:
        name = part.split()[0]
        out[name] = [(int(m.group(1), 16), m.group(2)) for m in map(INS.match, part.splitlines()) if m]
    return out


def loops(ins):
    """(start, end, body) of every backward branch's range."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    found = []
    for i, (a, text) in enumerate(ins):
        m = BRA.search(text)
        target = int(m.group(1), 16) if m else None
        if m and target <= a and target in at:
            found.append((target, a, [t for _, t in ins[at[target]:i + 1]]))
    return found


def ptxas_usage(log):
    """{mangled name: 'N registers, S bytes spill stores, L bytes spill loads'} from -Xptxas -v."""
    usage, name = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            usage.setdefault(name, {})["spill"] = "spill %s/%s B" % (m.group(1), m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            usage.setdefault(name, {})["regs"] = "%s registers" % m.group(1)
    return usage


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cu", help="a CUDA source of src/cuda")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--min-loop", type=int, default=30, help="loops shorter than this are not listed")
    ap.add_argument("--ops", type=int, default=0, help="also the N most frequent opcodes of each listed loop")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "")
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args()
    if not args.cuobjdump or not os.path.exists(args.cuobjdump):
        sys.exit("sass_loops: no cuobjdump (pip install nvidia-cuda-cuobjdump, then --cuobjdump PATH)")
    if not os.path.exists(args.cu):
        sys.exit("sass_loops: no such file: %s" % args.cu)
    compute = args.arch.replace("sm_", "compute_")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        cc = subprocess.run([args.nvcc, "-O3", "-std=c++17", "-Isrc", "-DORCHID_CUDA=1", "-gencode",
                             "arch=%s,code=%s" % (compute, args.arch), "-Xptxas", "-v", "-cubin", "-o", cubin, args.cu],
                            capture_output=True, text=True)
        if cc.returncode != 0:
            sys.exit("sass_loops: nvcc failed:\n" + cc.stderr[-3000:])
        dump = subprocess.run([args.cuobjdump, "-sass", cubin], capture_output=True, text=True)
        if dump.returncode != 0:
            sys.exit("sass_loops: cuobjdump failed:\n" + dump.stderr[-2000:])
    usage = ptxas_usage(cc.stderr)
    for name, ins in sorted(functions(dump.stdout).items()):
        if args.kernel not in name:
            continue
        u = usage.get(name, {})
        print("%s: %d instructions, %s, %s" % (name, len(ins), u.get("regs", "? registers"), u.get("spill", "spill ?")))
        for start, end, body in loops(ins):
            if len(body) < args.min_loop:
                continue
            c = collections.Counter(opcode(t) for t in body)
            tid = sum(1 for t in body if opcode(t) == "S2R" and "SR_TID" in t)
            print("  loop %#06x..%#06x: %4d instructions; %s%s" % (start, end, len(body),
                  " ".join("%s %d" % (k, c[k]) for k in WATCH if c[k]), " (thread index %d)" % tid if tid else ""))
            if args.ops:
                print("    " + ", ".join("%s %d" % kv for kv in c.most_common(args.ops)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
