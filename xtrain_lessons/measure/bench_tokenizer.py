"""Benchmark of the course's BPE against `tokenizers` (Rust): training, encoding, streaming memory.

    results = bench_tokenizer("data/stories.txt", vocab_size=2048)
    print(format_results(results))

Measures, each the median of `rounds` runs on this machine:
- training to `vocab_size`: ours (pre-token counting + incremental merges) and `tokenizers`;
- the naive trainer (recount every pair after each merge) against the incremental one;
- encoding throughput in MB/s: ours (cold cache, then warm), `tokenizers` on the whole text and
  batched by document (as `data.prepare` calls it);
- the engine path of `xtrain train`: tokenizer training + `data.prepare`, course vs hf;
- peak resident memory of `encode_iterable` over the corpus and over a file `scale` times
  larger (in fresh processes): it stays flat, because nothing but one line and the tail of
  the text is ever held.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from xtrain_lessons.training import tokenizer as engine
from xtrain_lessons.training.tokenizer.bpe_hf import save_pretrained, to_hf_json, train_engine_tokenizer
from xtrain_lessons.training.tokenizer.bpe_pretokenize import count_file
from xtrain_lessons.training.tokenizer.bpe_tokenizer import Tokenizer
from xtrain_lessons.training.tokenizer.bpe_train import merge_incremental, merge_naive
from xtrain_lessons.training.data import prepare, read_documents

EOT = "<|endoftext|>"


def _median_time(fn, rounds: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _stream_peak_rss(path: Path, tok_json: Path) -> dict:
    """Peak resident memory (MiB, VmHWM: this process only, unlike ru_maxrss which a child
    inherits from its parent) of a fresh process streaming `path` through encode_iterable."""
    code = (
        "import re, time\n"
        "from xtrain_lessons.training.tokenizer.bpe_hf import load_hf\n"
        "hwm = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]) / 1024\n"
        f"tok = load_hf({str(tok_json)!r})\n"
        "base = hwm()\n"
        "t0 = time.perf_counter()\n"
        f"with open({str(path)!r}, encoding='utf-8') as f:\n"
        "    n = sum(1 for _ in tok.encode_iterable(f))\n"
        "print(n, base, hwm(), time.perf_counter() - t0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    n, base, peak, dt = res.stdout.split()
    return {"bytes": path.stat().st_size, "tokens": int(n), "rss_before_mib": float(base),
            "peak_rss_mib": float(peak), "seconds": float(dt)}


def bench_tokenizer(corpus="data/stories.txt", vocab_size: int = 2048, rounds: int = 3,
                    scale: int = 100, naive: bool = True, progress=print) -> dict:
    """Run every measurement; returns a dict of numbers (see the module docstring)."""


    corpus = Path(corpus)
    text = corpus.read_text(encoding="utf-8")
    mb = len(text.encode("utf-8")) / 1e6
    r: dict = {"corpus": str(corpus), "corpus_mb": round(mb, 3), "vocab_size": vocab_size, "rounds": rounds}

    progress("training ...")
    t_count, counts = _median_time(lambda: count_file(corpus, [EOT]), rounds)
    t_merge, (vocab, merges) = _median_time(lambda: merge_incremental(counts, vocab_size, [EOT]), rounds)
    t_hf, _ = _median_time(lambda: engine.train_tokenizer([corpus], vocab_size), rounds)
    r["train_s"] = {"ours_pretokenize": t_count, "ours_merges": t_merge, "ours_total": t_count + t_merge,
                    "tokenizers": t_hf, "distinct_pretokens": len(counts)}
    if naive:
        progress("naive trainer ...")
        t_naive, naive_out = _median_time(lambda: merge_naive(counts, vocab_size, [EOT]), 1)
        r["naive_vs_incremental"] = {"naive_merges_s": t_naive, "incremental_merges_s": t_merge,
                                     "speedup": t_naive / t_merge, "same_merges": naive_out == (vocab, merges)}

    progress("encoding ...")
    ours = Tokenizer(vocab, merges, [EOT])
    hf = HFTokenizer.from_str(to_hf_json(ours))
    docs, _ = read_documents(corpus)
    t_cold, _ = _median_time(lambda: Tokenizer(vocab, merges, [EOT]).encode(text), rounds)
    t_warm, ids = _median_time(lambda: ours.encode(text), rounds)
    t_hf_one, hf_ids = _median_time(lambda: hf.encode(text, add_special_tokens=False).ids, rounds)
    t_hf_batch, _ = _median_time(lambda: hf.encode_batch(docs, add_special_tokens=False), rounds)
    r["encode_mb_per_s"] = {"ours_cold_cache": mb / t_cold, "ours_warm_cache": mb / t_warm,
                            "tokenizers_one_string": mb / t_hf_one, "tokenizers_batch_by_document": mb / t_hf_batch,
                            "same_ids": ids == hf_ids, "bytes_per_token": len(text.encode("utf-8")) / len(ids)}

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        progress("engine path (train tokenizer + prepare) ...")

        def engine_path(impl):
            tok = (train_engine_tokenizer([corpus], vocab_size) if impl == "course"
                   else engine.train_tokenizer([corpus], vocab_size))
            prepare(corpus, d / f"data_{impl}", tok)

        r["engine_path_s"] = {impl: _median_time(lambda: engine_path(impl), rounds)[0] for impl in ("course", "hf")}

        progress(f"streaming memory on a {scale}x file ...")
        save_pretrained(ours, d / "tok")
        big = d / "big.txt"
        with open(big, "w", encoding="utf-8") as f:
            for _ in range(scale):
                f.write(text)
        r["stream"] = {"1x": _stream_peak_rss(corpus, d / "tok"), f"{scale}x": _stream_peak_rss(big, d / "tok")}
    return r


def format_results(r: dict) -> str:
    t, e = r["train_s"], r["encode_mb_per_s"]
    lines = [f"corpus {r['corpus']} ({r['corpus_mb']:.2f} MB, {t['distinct_pretokens']:,} distinct pre-tokens), "
             f"vocab {r['vocab_size']}, median of {r['rounds']}",
             f"train     ours {t['ours_total']:.2f} s (pre-tokenize {t['ours_pretokenize']:.2f} + merges "
             f"{t['ours_merges']:.2f})   tokenizers {t['tokenizers']:.2f} s"]
    if "naive_vs_incremental" in r:
        n = r["naive_vs_incremental"]
        lines.append(f"merges    naive {n['naive_merges_s']:.2f} s   incremental {n['incremental_merges_s']:.3f} s   "
                     f"speed-up {n['speedup']:.0f}x   same merges: {n['same_merges']}")
    lines.append(f"encode    ours {e['ours_cold_cache']:.1f} MB/s cold, {e['ours_warm_cache']:.1f} MB/s warm   "
                 f"tokenizers {e['tokenizers_one_string']:.1f} MB/s one string, "
                 f"{e['tokenizers_batch_by_document']:.1f} MB/s batched   same ids: {e['same_ids']}   "
                 f"{e['bytes_per_token']:.2f} bytes/token")
    p = r["engine_path_s"]
    lines.append(f"xtrain train's tokenizer + prepare:  course {p['course']:.2f} s   hf {p['hf']:.2f} s")
    for name, s in r["stream"].items():
        lines.append(f"stream {name:>4}  {s['bytes'] / 1e6:7.1f} MB  {s['tokens']:>10,} tokens  "
                     f"{s['seconds']:6.1f} s  peak RSS {s['peak_rss_mib']:.0f} MiB (at start {s['rss_before_mib']:.0f})")
    return "\n".join(lines)

