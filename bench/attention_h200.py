"""Build, check and benchmark the KV4 attention kernels in one GPU call; JSON (+ PNG) to --out.

  PYTHONPATH=. python bench/attention_h200.py --out $OUT

1. correctness on fresh random data (RoPE+KV4 write codes, decode attention vs the references; the fp16
   paged decode kernel vs its reference);
2. decode attention over KV4 pages vs F.scaled_dot_product_attention over FP16 KV, B x L grid, for
   Llama-2-7B (32 heads, D 128) and Llama-3-8B (32/8 GQA), with achieved TB/s (KV4 bytes incl.
   scales/zeros) against a measured device-to-device copy; beside them the engine's FP16 baseline,
   decode_attention_fp16 over fp16 pages ("fp16_paged" keys: its TB/s and fraction of the copy, each ring
   depth timed, and the KV4 kernel's speedup over it);
3. KV4 write throughput and prefill attention at 64 x 1024 tokens next to SDPA.
Timing (docs/design.md §6, CUDA events, median of REPS): decode as CUDA-graph replays over rotating input sets
(> 3x L2, so every call reads HBM; no host overhead), once per ring-stage option, launched plainly
(the rows and summary keys) and as programmatic dependents (decode_attention's enable_pdl: "_pdl" keys;
the kernel ahead of each call is then the previous call); "decode_step" rows time a decode step's two
kernels, rope_kv4_write then the attention, plainly and with the attention a dependent of the write;
write and prefill with L2 flushed before each run. `--resummarize JSON` re-derives the planned rows and the summary from the
timed options after a change to attention.plan_stages / split_plan.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import n_sets, time_graph  # noqa: E402
from qoq.runtime_cuda import attention  # noqa: E402
from qoq.runtime_cuda import attention_reference as ref  # noqa: E402

MODELS = {"llama2-7b": (32, 32, 128), "llama3-8b": (32, 8, 128)}  # (Hq, Hkv, D)
BATCHES, LENGTHS, REPS = (1, 16, 64, 256), (512, 1536, 4096), 40
MAX_SETS = 256  # decode sets are small at B=1: up to 256 of them to exceed L2
_flush = None


def timed_ms(fn, reps=REPS) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        _flush.zero_()  # evict L2 (60 MB) so every run reads from HBM
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def same_values(a, b) -> bool:
    """Exactly equal, NaN garbage (unwritten slots) included; -0 == +0 (a flat head's zero)."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def rope_tables(max_pos, dim):
    inv_freq = 1.0 / 500000 ** (torch.arange(0, dim, 2, device="cuda").float() / dim)
    angles = torch.arange(max_pos, device="cuda").float()[:, None] * inv_freq
    return angles.cos(), angles.sin()


def check_correctness(gen) -> list[dict]:
    """Prompts of random length 1..4096 go through RoPE + KV4 write (kernel and reference, compared
    code for code), then decode attention reads them back (kernel vs reference on the same pages)."""
    rows = []
    for dim in (64, 128):
        for group in (1, 3, 4, 8):
            hkv, hq, batch = 2, 2 * group, 8
            lens = [1, 4096] + torch.randint(1, 4097, (batch - 2,), generator=gen, device="cuda").tolist()
            pages = [math.ceil(n / 64) for n in lens]
            total = sum(pages) + 2
            perm = torch.randperm(total, device="cuda", generator=gen)
            table = torch.zeros(batch, max(pages), dtype=torch.int32, device="cuda")
            slots, positions, start = [], [], 0
            for i, (n, p) in enumerate(zip(lens, pages)):
                table[i, :p] = perm[start : start + p].int()
                slots.append((perm[start : start + p, None] * 64 + torch.arange(64, device="cuda")).flatten()[:n])
                positions.append(torch.arange(n, device="cuda"))
                start += p
            slots, positions = torch.cat(slots), torch.cat(positions)
            qkv = torch.randn(len(slots), (hq + 2 * hkv) * dim, device="cuda", generator=gen).half()
            heads = qkv.view(len(slots), -1, dim)
            flat = torch.randint(0, len(slots), (64,), device="cuda", generator=gen)
            heads[flat, hq] = 0.0  # K: zero stays zero after RoPE -> max == min
            heads[flat, hq + hkv] = 0.625  # V: constant head
            cos, sin = rope_tables(4096, dim)
            pb = ref.page_bytes(hkv, dim)
            pools = [torch.randint(0, 256, (total, pb), dtype=torch.uint8, device="cuda", generator=gen) for _ in range(2)]
            ref_pools = [p.clone() for p in pools]
            q_k, k_k = attention.rope_kv4_write(qkv, positions, slots, cos, sin, *pools, hq, hkv)
            q_r, k_r = ref.rope_kv4_write(qkv, positions, slots, cos, sin, *ref_pools, hq, hkv)
            code_diff, scales_equal = [], True
            for pool, rpool in zip(pools, ref_pools):
                c, s, z = ref.page_views(pool, hkv, dim)
                cr, sr, zr = ref.page_views(rpool, hkv, dim)
                code_diff.append((ref.unpack_nibbles(c).int() - ref.unpack_nibbles(cr).int()).abs())
                scales_equal &= same_values(s, sr) and same_values(z, zr)
            q = torch.randn(batch, hq, dim, device="cuda", generator=gen).half()
            seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
            expected = ref.decode_attention(q, *pools, table, seq_lens)
            launches = [(s, None) for s in (None, 1, 5, 64)] + [(s, 2 if dim == 128 else None) for s in (None, 5)]
            if dim == 128:
                launches += [(None, 3), (5, 3)]
            errs = {
                f"splits={s},stages={st}": rel_err(attention.decode_attention(q, *pools, table, seq_lens, max(lens),
                                                                             num_splits=s, num_stages=st), expected)
                for s, st in launches
            }
            rows.append({
                "head_dim": dim, "group": group, "lens": lens,
                "q_k_rope_exact": torch.equal(q_k, q_r) and torch.equal(k_k, k_r),
                "scale_zero_exact": scales_equal,
                "code_max_diff": max(int(d.max()) for d in code_diff),
                "code_diff_fraction": max(d.ne(0).float().mean().item() for d in code_diff),
                "decode_rel_err_by_splits": errs,
            })
            ok = rows[-1]["q_k_rope_exact"] and scales_equal and rows[-1]["code_max_diff"] <= 1 and max(errs.values()) < 1e-3
            rows[-1]["ok"] = ok
            print(f"check D={dim} G={group}: ok={ok} codes<= {rows[-1]['code_max_diff']} "
                  f"frac={rows[-1]['code_diff_fraction']:.2e} rel={max(errs.values()):.2e}", flush=True)
    return rows


def check_fp16(gen) -> list[dict]:
    """decode_attention_fp16 against its reference on ragged batches (random normal K/V at shuffled pages,
    the rest of the pools random bits, NaN included), default and pinned launches."""
    rows = []
    for dim in (64, 128):
        for group in (1, 3, 4, 7, 8):
            hkv, batch = 2, 16
            lens = [1, 4096] + torch.randint(1, 4097, (batch - 2,), generator=gen, device="cuda").tolist()
            pages = [math.ceil(n / 64) for n in lens]
            total = sum(pages) + 1
            pools = [torch.randint(-(1 << 15), 1 << 15, (total, 64, hkv, dim), dtype=torch.int32, device="cuda",
                                   generator=gen).to(torch.int16).view(torch.float16) for _ in range(2)]
            perm = torch.randperm(total, device="cuda", generator=gen)
            table = torch.full((batch, max(pages)), int(perm[-1]), dtype=torch.int32, device="cuda")
            start = 0
            for i, (n, p) in enumerate(zip(lens, pages)):
                ids = perm[start : start + p]
                start += p
                table[i, :p] = ids.int()
                slots = (ids[:, None] * 64 + torch.arange(64, device="cuda")).flatten()[:n]
                for pool in pools:
                    pool.view(-1, hkv, dim)[slots] = torch.randn(n, hkv, dim, device="cuda", generator=gen).half()
            q = torch.randn(batch, hkv * group, dim, device="cuda", generator=gen).half()
            seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
            expected = ref.decode_attention_fp16(q, *pools, table, seq_lens)
            errs = {}
            for splits, stages in [(None, None), (1, 2), (1, 3), (5, 2), (64, 3)]:
                out = attention.decode_attention_fp16(q, *pools, table, seq_lens, max(lens), num_splits=splits,
                                                      num_stages=stages)
                errs[f"splits={splits},stages={stages}"] = rel_err(out, expected) if out.isfinite().all() else math.inf
            ok = max(errs.values()) < 1e-3
            rows.append({"kernel": "fp16_paged", "head_dim": dim, "group": group, "lens": lens,
                         "decode_rel_err_by_splits": errs, "ok": ok})
            print(f"check fp16 paged D={dim} G={group}: ok={ok} rel={max(errs.values()):.2e}", flush=True)
    return rows


def random_pool(num_pages, hkv, dim):
    """Random codes with sane fp16 scales/zeros (timing never runs on zeros)."""
    pool = torch.randint(0, 256, (num_pages, ref.page_bytes(hkv, dim)), dtype=torch.uint8, device="cuda")
    _, scale, zero = ref.page_views(pool, hkv, dim)
    scale.copy_(torch.rand_like(scale, dtype=torch.float32).mul(0.2).add(0.01).half())
    zero.copy_(torch.rand_like(zero, dtype=torch.float32).mul(15).half())
    return pool


def graph_ms(calls: list) -> float:
    """Median ms per call of graph-captured calls, one per input set (bench/timing.py)."""
    return time_graph(calls, REPS) / 1000


def decode_sets(hq, hkv, dim, batch, length):
    """Input sets (q, k_pool, v_pool, page_table) for KV4 decode, enough of them to exceed 3x L2."""
    pages = math.ceil(length / 64)
    sets = []
    for _ in range(n_sets(2 * batch * pages * ref.page_bytes(hkv, dim), MAX_SETS)):
        table = torch.randperm(batch * pages, device="cuda").int().view(batch, pages)
        q = torch.randn(batch, hq, dim, device="cuda").half()
        sets.append((q, random_pool(batch * pages, hkv, dim), random_pool(batch * pages, hkv, dim), table))
    return sets


def fp16_paged_sets(hq, hkv, dim, batch, length):
    """Input sets (q, k_pool, v_pool, page_table) for decode_attention_fp16, enough of them to exceed 3x L2."""
    pages = math.ceil(length / 64)
    pool_bytes = batch * pages * 64 * hkv * dim * 2
    sets = []
    for _ in range(n_sets(2 * pool_bytes, MAX_SETS)):
        table = torch.randperm(batch * pages, device="cuda").int().view(batch, pages)
        q = torch.randn(batch, hq, dim, device="cuda").half()
        k, v = (torch.randn(batch * pages, 64, hkv, dim, device="cuda", dtype=torch.float16) for _ in range(2))
        sets.append((q, k, v, table))
    return sets


def bench_decode(model, batch, length) -> dict:
    hq, hkv, dim = MODELS[model]
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    row = {"model": model, "batch": batch, "length": length}
    sets = decode_sets(hq, hkv, dim, batch, length)
    row["kv4_sets"] = len(sets)
    for key, pdl in (("kv4_ms_by_stages", False), ("kv4_pdl_ms_by_stages", True)):
        row[key] = {  # str keys, as they come back from the JSON
            str(st): graph_ms([lambda s=s: attention.decode_attention(s[0], s[1], s[2], s[3], seq_lens, length,
                                                                      num_stages=st, enable_pdl=pdl) for s in sets])
            for st in attention.supported_stages(dim)
        }
    del sets
    sets = fp16_paged_sets(hq, hkv, dim, batch, length)
    row["fp16_paged_sets"] = len(sets)
    row["fp16_paged_ms_by_stages"] = {
        str(st): graph_ms([lambda s=s, st=st: attention.decode_attention_fp16(*s, seq_lens, length, num_stages=st)
                           for s in sets])
        for st in (2, 3)
    }
    del sets
    fp16_bytes = 2 * batch * hkv * length * dim * 2
    sets = [(torch.randn(batch, hq, 1, dim, device="cuda").half(),
             torch.randn(batch, hkv, length, dim, device="cuda").half(),
             torch.randn(batch, hkv, length, dim, device="cuda").half()) for _ in range(n_sets(fp16_bytes, MAX_SETS))]
    row["sdpa_sets"] = len(sets)
    row["sdpa_ms"] = graph_ms([lambda s=s: F.scaled_dot_product_attention(*s, enable_gqa=hq != hkv) for s in sets])
    if hq != hkv:  # the baseline is the faster of enable_gqa and K/V expanded to every query head
        expanded = [(q, k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)) for q, k, v in sets[:2]]
        del sets
        row["sdpa_expanded_ms"] = graph_ms([lambda s=s: F.scaled_dot_product_attention(*s) for s in expanded])
        row["sdpa_ms"] = min(row["sdpa_ms"], row["sdpa_expanded_ms"])
        del expanded
    row["sdpa_tbps"] = fp16_bytes / row["sdpa_ms"] / 1e9  # FP16 K+V bytes of the model
    return row


def with_plan(row, sms, copy_tbps):
    """The row's KV4 figures for the launch attention.py plans (splits, ring stages) out of the timed
    stage options."""
    _, hkv, dim = MODELS[row["model"]]
    batch, length = row["batch"], row["length"]
    splits = attention.split_plan(batch, hkv, length, sms)[0]
    row["splits"], row["stages"] = splits, attention.plan_stages(batch, hkv, splits, dim, sms)
    kv4_bytes = 2 * batch * hkv * length * (dim // 2 + 4)
    for suffix in ("", "_pdl"):
        if f"kv4{suffix}_ms_by_stages" not in row:  # runs before the enable_pdl option
            continue
        row[f"kv4{suffix}_ms"] = ms = row[f"kv4{suffix}_ms_by_stages"][str(row["stages"])]
        row[f"kv4{suffix}_tbps"] = tbps = kv4_bytes / ms / 1e9
        row[f"speedup_vs_sdpa{suffix}"] = row["sdpa_ms"] / ms
        row[f"bandwidth_fraction{suffix}"] = tbps / copy_tbps
    if "fp16_paged_ms_by_stages" in row:  # runs before the fp16 paged kernel lack it
        row["fp16_paged_stages"] = attention.plan_stages_fp16(batch, hkv, splits, sms)
        row["fp16_paged_ms"] = ms = row["fp16_paged_ms_by_stages"][str(row["fp16_paged_stages"])]
        row["fp16_paged_tbps"] = tbps = 2 * batch * hkv * length * dim * 2 / ms / 1e9
        row["fp16_paged_bandwidth_fraction"] = tbps / copy_tbps
        row["fp16_paged_speedup_vs_sdpa"] = row["sdpa_ms"] / ms
        row["kv4_speedup_vs_fp16_paged"] = ms / row["kv4_ms"]
    return row


def summarize(result) -> dict:
    decode = result["decode"]
    pick = lambda m, b, l: next(r for r in decode if (r["model"], r["batch"], r["length"]) == (m, b, l))  # noqa: E731
    summary = {"gpu": result["gpu"]}
    for suffix in ("", "_pdl"):
        if f"speedup_vs_sdpa{suffix}" not in decode[0]:
            continue
        summary.update({
            f"speedup_vs_sdpa_b64_l1536{suffix}": pick("llama2-7b", 64, 1536)[f"speedup_vs_sdpa{suffix}"],
            f"speedup_vs_sdpa_b64_l1536_gqa{suffix}": pick("llama3-8b", 64, 1536)[f"speedup_vs_sdpa{suffix}"],
            f"min_bandwidth_fraction_b_ge_64{suffix}": min(r[f"bandwidth_fraction{suffix}"] for r in decode
                                                          if r["batch"] >= 64),
            f"speedup_vs_sdpa_b1_min{suffix}": min(r[f"speedup_vs_sdpa{suffix}"] for r in decode if r["batch"] == 1),
        })
    if "fp16_paged_ms" in decode[0]:
        summary.update({
            "kv4_speedup_vs_fp16_paged_b64_l1536": pick("llama2-7b", 64, 1536)["kv4_speedup_vs_fp16_paged"],
            "kv4_speedup_vs_fp16_paged_b64_l1536_gqa": pick("llama3-8b", 64, 1536)["kv4_speedup_vs_fp16_paged"],
            "fp16_paged_min_bandwidth_fraction_b_ge_64": min(r["fp16_paged_bandwidth_fraction"] for r in decode
                                                             if r["batch"] >= 64),
        })
    return {**summary, "correctness_ok": all(r["ok"] for r in result["correctness"]),
            "copy_bandwidth_tbps": result["copy_bandwidth_tbps"]}


def save(result, out: Path):
    result = {"summary": summarize(result), **{k: v for k, v in result.items() if k != "summary"}}
    (out / "attention_h200.json").write_text(json.dumps(result, indent=1))
    plot(result["decode"], out / "attention_h200.png")
    print(json.dumps(result["summary"], indent=1))


SWEEP = [(1, 512), (1, 1536), (1, 4096), (16, 512), (16, 1536), (16, 4096)]  # (batch, length)


def split_sweep() -> list[dict]:
    """Decode time for every split count at the small batches where split_plan's choice matters."""
    rows = []
    for (model, (hq, hkv, dim)), (batch, length) in itertools.product(MODELS.items(), SWEEP):
        lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        sets = decode_sets(hq, hkv, dim, batch, length)
        for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64):
            ms = graph_ms([lambda s=s: attention.decode_attention(s[0], s[1], s[2], s[3], lens, length, num_splits=n)
                           for s in sets])
            rows.append({"model": model, "batch": batch, "length": length, "splits": n, "ms": ms})
    return rows


STEP_SHAPES = [("llama3-8b", 64, 512), ("llama3-8b", 64, 1536), ("llama2-7b", 64, 1536), ("llama3-8b", 256, 512),
               ("llama2-7b", 1, 4096), ("llama3-8b", 16, 1536)]  # (model, batch, length)


def bench_decode_step(model, batch, length) -> dict:
    """A decode step's two kernels per input set: rope_kv4_write of each sequence's new token (position
    length - 1), then decode attention over all of them, the attention launched plainly or as a
    programmatic dependent of the write; and the write alone."""
    hq, hkv, dim = MODELS[model]
    cos, sin = rope_tables(length, dim)
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    pos = torch.full((batch,), length - 1, dtype=torch.int64, device="cuda")
    steps = [(torch.randn(batch, (hq + 2 * hkv) * dim, device="cuda").half(),
              table[:, (length - 1) // 64].long() * 64 + (length - 1) % 64, kp, vp, table)
             for _, kp, vp, table in decode_sets(hq, hkv, dim, batch, length)]

    def calls(attend: bool, pdl: bool = False) -> list:
        def step(qkv, slots, kp, vp, table):
            q, _ = attention.rope_kv4_write(qkv, pos, slots, cos, sin, kp, vp, hq, hkv)
            if attend:
                attention.decode_attention(q, kp, vp, table, lens, length, enable_pdl=pdl)
        return [lambda s=s: step(*s) for s in steps]

    return {"model": model, "batch": batch, "length": length, "write_ms": graph_ms(calls(False)),
            "step_ms": graph_ms(calls(True)), "step_pdl_ms": graph_ms(calls(True, pdl=True))}


def bench_prefill(model, batch=64, length=1024) -> dict:
    hq, hkv, dim = MODELS[model]
    t = batch * length
    qkv = torch.randn(t, (hq + 2 * hkv) * dim, device="cuda").half()
    positions = torch.arange(length, device="cuda").repeat(batch)
    slots = torch.randperm(t, device="cuda")  # whole pages, shuffled token slots
    cos, sin = rope_tables(length, dim)
    pools = [torch.empty(t // 64, ref.page_bytes(hkv, dim), dtype=torch.uint8, device="cuda") for _ in range(2)]
    write = lambda: attention.rope_kv4_write(qkv, positions, slots, cos, sin, *pools, hq, hkv)  # noqa: E731
    write_ms = timed_ms(write, reps=30)
    moved = t * (hq + 2 * hkv) * dim * 2 + t * (hq + hkv) * dim * 2 + 2 * t * hkv * (dim // 2 + 4)
    dec_qkv, dec_pos, dec_slots = qkv[:batch], positions[:batch], slots[:batch]
    dec_ms = timed_ms(lambda: attention.rope_kv4_write(dec_qkv, dec_pos, dec_slots, cos, sin, *pools, hq, hkv))
    q, k = write()
    v = qkv.view(t, -1, dim)[:, hq + hkv :].contiguous()
    lens = [length] * batch
    ours_ms = timed_ms(lambda: attention.prefill_attention(q, k, v, lens), reps=30)
    ragged = [length - 1] * (batch // 2) + [length + 1] * (batch // 2)  # same tokens, varlen path
    ragged_ms = timed_ms(lambda: attention.prefill_attention(q, k, v, ragged), reps=30)
    qb, kb, vb = (x.view(batch, length, -1, dim).transpose(1, 2) for x in (q, k, v))
    sdpa = lambda: F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, enable_gqa=hq != hkv)  # noqa: E731
    sdpa_ms = timed_ms(sdpa, reps=30)
    expected = sdpa().transpose(1, 2).reshape(t, hq, dim)
    err = rel_err(attention.prefill_attention(q, k, v, lens), expected)
    cu = torch.tensor([0, *itertools.accumulate(ragged)], device="cuda")
    probe = slice(0, int(cu[2]))  # reference on the first two sequences only (fp32 attention is slow)
    ragged_err = rel_err(attention.prefill_attention(q, k, v, ragged)[probe],
                         ref.prefill_attention(q[probe], k[probe], v[probe], cu[:3]))
    return {
        "model": model, "batch": batch, "length": length,
        "rope_kv4_write_prefill_ms": write_ms, "rope_kv4_write_prefill_gbps": moved / write_ms / 1e6,
        "rope_kv4_write_decode_b64_us": dec_ms * 1e3,
        "prefill_attention_ms": ours_ms, "prefill_attention_ragged_varlen_ms": ragged_ms,
        "sdpa_padded_causal_ms": sdpa_ms, "prefill_rel_err_vs_sdpa": err, "ragged_rel_err_vs_reference": ragged_err,
    }


def copy_bandwidth_tbps() -> float:
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    src.random_()
    dst = torch.empty_like(src)
    ms = timed_ms(lambda: dst.copy_(src), reps=10)
    return 2 * src.numel() / ms / 1e9


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, model in zip(axes, MODELS):
        sel = [r for r in rows if r["model"] == model]
        labels = [f"B{r['batch']}\nL{r['length']}" for r in sel]
        x = range(len(sel))
        ax.bar([i - 0.2 for i in x], [r["speedup_vs_sdpa"] for r in sel], 0.4, label="speedup vs SDPA FP16")
        ax.bar([i + 0.2 for i in x], [r["bandwidth_fraction"] * 5 for r in sel], 0.4, label="fraction of copy BW (x5)")
        ax.axhline(3.0, color="k", lw=0.6, ls="--")
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_title(f"{model}: KV4 decode attention (H200)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    global _flush
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--command", default="PYTHONPATH=. python bench/attention_h200.py --out $OUT")
    ap.add_argument("--resummarize", type=Path,
                    help="recompute the planned rows and the summary of a results JSON (after a plan change)")
    args = ap.parse_args()
    if args.resummarize:
        result = json.loads(args.resummarize.read_text())
        for row in result["decode"]:
            with_plan(row, result["multiprocessors"], result["copy_bandwidth_tbps"])
        save(result, args.resummarize.parent)
        return
    if args.out is None:
        ap.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    _flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    t0 = time.time()
    attention.extension()
    print(f"build: {time.time() - t0:.0f} s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(int(time.time()))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    result = {"command": args.command, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "multiprocessors": sms}
    result["copy_bandwidth_tbps"] = bw = copy_bandwidth_tbps()
    result["correctness"] = check_correctness(gen) + check_fp16(gen)
    decode = []
    for model in MODELS:
        for batch in BATCHES:
            for length in LENGTHS:
                row = bench_decode(model, batch, length)
                with_plan(row, sms, bw)
                decode.append(row)
                by_stages = " ".join(f"s{k}={v * 1e3:.1f}" for k, v in row["kv4_ms_by_stages"].items())
                print(f"{model} B={batch:3d} L={length:4d} kv4 {row['kv4_ms']*1e3:8.1f} us "
                      f"(pdl {row['kv4_pdl_ms']*1e3:.1f}) "
                      f"({row['kv4_tbps']:.2f} TB/s; {by_stages}) "
                      f"sdpa {row['sdpa_ms']*1e3:8.1f} us ({row['sdpa_tbps']:.2f} TB/s) "
                      f"x{row['speedup_vs_sdpa']:.2f} splits={row['splits']} | fp16 paged "
                      f"{row['fp16_paged_ms']*1e3:.1f} us ({row['fp16_paged_tbps']:.2f} TB/s) "
                      f"kv4 x{row['kv4_speedup_vs_fp16_paged']:.2f}", flush=True)
    result["decode"] = decode
    result["decode_step"] = [bench_decode_step(*shape) for shape in STEP_SHAPES]
    for r in result["decode_step"]:
        print(r, flush=True)
    result["split_sweep"] = split_sweep()
    result["prefill"] = [bench_prefill(m) for m in MODELS]
    for r in result["prefill"]:
        print(r, flush=True)
    save(result, args.out)


if __name__ == "__main__":
    main()
