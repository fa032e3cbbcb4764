#!/usr/bin/env python3
"""tools/trace_report.py — reads a timeline written by bench_batch_decode --trace (one
forward of a -DORCHID_TRACE build: every block's start, pdl_wait entry and release, tail
start and end on the GPU clock; cuda_internal.h) and prints one line per launch in start
order, times in µs from the first launch after the spin:

  start   first block resident          wait0/wait1  first / last block's wait release
  tail    the last block's tail start   end          last block end
  body    wait1 → end                   step         wait1 → next launch's wait1 (this
  lead    how long before the previous launch ended its first block was resident
  marks   the first and last block past the kernel's own marks 4..7 (cuda_moe_fused.cu)
                                                       launch's share of the critical path)

then the means per op name (names from the forward's "# op" lines; an op of several
launches, such as attention with its split combine, names each of them) sorted by their
total step, with e2e: the previous launch's end → this one's end, the share of the
forward's span a launch adds (the e2e sums add up to the span).

then, with --blocks OP (repeatable), the blocks of every launch named OP: how many, their
lifetimes (start → end; p10 / p50 / p90 / max, and of the blocks that lived over 1 µs, the
rest being early exits) and the mean blocks resident per SM over the launch's span.

and, with --phases OP (repeatable), where a block of OP spends its life: over the blocks
that set marks, the p50 / p90 / mean µs of the previous launch's end → its wait release,
then start → wait → each mark most of them set, in time order → end (what each mark means
is written beside its trace_mark call).

  tools/trace_report.py trace_T1.csv [--summary] [--blocks OP ...] [--phases OP ...]
"""
import sys
from collections import defaultdict


def load(path):
    names, blocks = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("# op "):
                f_ = line.split()
                # "# op i name [kernels]": an op that made n launches names n of them
                names += [f_[3]] * (int(f_[4]) if len(f_) > 4 else 1)
            elif line[0].isdigit():
                v = [int(x) for x in line.strip().split(",")]
                blocks.append(v)  # grid, block, sm, start, prewait, waited, tail, mark4..7, end
    return names, blocks


def quantile(xs, p):
    return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def block_stats(op, groups):
    """groups: the block lists of the launches named op"""
    life, real, resid = [], [], []
    for bs in groups:
        span = max(b[11] for b in bs) - min(b[3] for b in bs)
        sms = len({b[2] for b in bs})
        d = [(b[11] - b[3]) / 1e3 for b in bs]
        life += d
        real += [x for x in d if x > 1.0]
        if span > 0 and sms:
            resid.append(sum(d) * 1e3 / (span * sms))
    print(f"\nblocks of {op}: {len(groups)} launches, {len(life) / max(1, len(groups)):.0f} blocks a launch "
          f"({len(real) / max(1, len(groups)):.0f} living over 1 µs)")
    for nm, xs in (("all", life), ("> 1 µs", real)):
        print(f"  {nm:7} lifetime µs p10 {quantile(xs, .1):6.2f} p50 {quantile(xs, .5):6.2f} p90 {quantile(xs, .9):6.2f}"
              f" max {max(xs) if xs else 0:6.2f}"
              f" mean {sum(xs) / max(1, len(xs)):6.2f}")
    print(f"  resident blocks per SM over the launch (mean of launches): {sum(resid) / max(1, len(resid)):.2f}")


def phase_stats(op, groups, prev_ends):
    """groups: the block lists of the launches named op, prev_ends: the end of the launch
    before each. Phases between the block's start, its wait release (where it waits), every
    mark 4..7 that most of its marked blocks set — in the order of their median times, which
    need not be the marks' numbers (a helper's mark may come before the kernel's own) — and
    its end; and the boundary: the launch before's end → this block's wait release."""
    allb = [b for g in groups for b in g]
    marked = [b for b in allb if any(b[k] for k in range(7, 11))]
    # the marks most marked blocks set (some blocks take other paths: the shared expert's
    # gate/up skips the top-k, the first layer's in-projection the norm), and those blocks
    ks = [k for k in range(7, 11) if 2 * sum(1 for b in marked if b[k]) > len(marked)]
    bs = [b for b in marked if all(b[k] for k in ks)] if ks else allb
    print(f"\nphases of {op}: {len(bs)} blocks" + (f" with marks {', '.join(str(k - 3) for k in ks)}" if ks else "")
          + f" (of {len(allb)})")
    if not bs:
        return
    ks.sort(key=lambda k: quantile([b[k] - b[3] for b in bs], .5))
    # record columns: 3 start, 5 wait release, 7.. marks 4.., 11 end
    cuts = [3] + ([5] if all(b[5] for b in bs) else []) + ks + [11]
    name = {3: "start", 5: "wait", 11: "end"}
    rows = [(f"{name.get(a, f'm{a - 3}')}>{name.get(z, f'm{z - 3}')}", [(b[z] - b[a]) / 1e3 for b in bs])
            for a, z in zip(cuts, cuts[1:])]
    if 5 in cuts:
        kept = {id(b) for b in bs}
        rows.insert(0, ("prev>wait", [(b[5] - pe) / 1e3 for g, pe in zip(groups, prev_ends) for b in g if id(b) in kept]))
    for lab, d in rows:
        print(f"  {lab:10} p50 {quantile(d, .5):6.2f}  p90 {quantile(d, .9):6.2f}  mean {sum(d) / len(d):6.2f} µs")


def main():
    path = sys.argv[1]
    summary = "--summary" in sys.argv
    wants = [(sys.argv[i], sys.argv[i + 1]) for i in range(len(sys.argv) - 1) if sys.argv[i] in ("--blocks", "--phases")]
    names, blocks = load(path)
    by = defaultdict(list)
    for b in blocks:
        by[b[0]].append(b)
    launches = []
    for g, bs in by.items():
        bs.sort(key=lambda b: b[3])
        waited = [b[5] for b in bs if b[5]]
        tails = [b[6] for b in bs if b[6]]
        marks = [[b[k] for b in bs if b[k]] for k in range(7, 11)]
        launches.append({"blocks": len(bs), "sms": len({b[2] for b in bs}), "start": min(b[3] for b in bs),
                         "end": max(b[11] for b in bs), "w0": min(waited) if waited else None,
                         "w1": max(waited) if waited else None, "tail": max(tails) if tails else None,
                         "marks": [(min(m), max(m)) if m else None for m in marks], "bs": bs})
    launches.sort(key=lambda x: x["start"])
    if launches and launches[0]["blocks"] == 1 and launches[0]["end"] - launches[0]["start"] > 1e6:
        launches = launches[1:]  # the 30 ms spin
    if not launches:
        print("no launches")
        return
    for i, l in enumerate(launches):  # the launch before's end (the first: its own start)
        l["prev_end"] = launches[i - 1]["end"] if i else l["start"]
    t0 = launches[0]["start"]
    total = (max(l["end"] for l in launches) - t0) / 1e3
    # ops that are not one launch: "metadata" (a copy), attention (+ its split combine),
    # lm_head (the final norm, then the product)
    multi = {"metadata": (), "attention": ("attention", "attn_combine"), "lm_head": ("final_norm", "lm_head")}
    expanded = [n for nm in names for n in multi.get(nm, (nm,))]
    if len(names) != len(launches) and len(expanded) == len(launches):
        names = expanded
    named = len(names) == len(launches)
    print(f"{len(launches)} launches, {len(names)} ops{'' if named else ' (names not mapped: counts differ)'}, "
          f"first start to last end {total:.1f} us")
    rel = lambda v: (v - t0) / 1e3 if v else float("nan")
    if not summary:
        print(f"{'#':>4} {'op':24} {'blk':>5} {'sm':>4} {'start':>8} {'wait0':>8} {'wait1':>8} {'tail':>8} {'end':>8} "
              f"{'body':>6} {'step':>6} {'lead':>6}  marks 4-7 (first-last block)")
    agg = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    for i, l in enumerate(launches):
        w = l["w1"] or l["start"]
        nxt = launches[i + 1] if i + 1 < len(launches) else None
        nw = (nxt["w1"] or nxt["start"]) if nxt else l["end"]
        step, body = (nw - w) / 1e3, (l["end"] - w) / 1e3
        tail = (l["end"] - l["tail"]) / 1e3 if l["tail"] else 0.0
        lead = (l["prev_end"] - l["start"]) / 1e3
        nm = names[i] if named else "?"
        a = agg[nm]
        e2e = (l["end"] - l["prev_end"]) / 1e3
        a[0] += 1; a[1] += step; a[2] += body; a[3] += lead; a[4] += l["blocks"]; a[5] += tail; a[6] += e2e
        if not summary:
            print(f"{i:4d} {nm[:24]:24} {l['blocks']:5d} {l['sms']:4d} {rel(l['start']):8.1f} {rel(l['w0']):8.1f} "
                  f"{rel(l['w1']):8.1f} {rel(l['tail']):8.1f} {rel(l['end']):8.1f} {body:6.1f} {step:6.1f} {lead:6.1f}  "
                  + " ".join(f"{rel(m[0]):.1f}-{rel(m[1]):.1f}" for m in l["marks"] if m))
    print(f"\n{'op':26} {'n':>4} {'step':>7} {'body':>7} {'tail':>6} {'lead':>7} {'blocks':>7} {'step sum':>9} {'e2e':>7} "
          f"{'e2e sum':>8}  (µs, means)")
    for nm, a in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        n = a[0]
        print(f"{nm[:26]:26} {n:4d} {a[1]/n:7.2f} {a[2]/n:7.2f} {a[5]/n:6.2f} {a[3]/n:7.2f} {a[4]/n:7.0f} {a[1]:9.1f} "
              f"{a[6]/n:7.2f} {a[6]:8.1f}")
    for flag, op in wants:  # --blocks / --phases OP, in the order given
        mine = [l for i, l in enumerate(launches) if named and names[i] == op]
        groups = [l["bs"] for l in mine]
        if not groups:
            print(f"\n{flag[2:]} of {op}: no launch of that name")
        elif flag == "--blocks":
            block_stats(op, groups)
        else:
            phase_stats(op, groups, [l["prev_end"] for l in mine])


if __name__ == "__main__":
    main()
