"""Decoding a 1B Llama at the memory-bandwidth limit: netcl's generate (prefill, then a recorded decode step
per token over the KV cache) beside PyTorch eager and PyTorch with its decode step captured in a CUDA graph,
at batch 1, 8 and 32, plus a long prompt's prefill, on the same Hugging Face directory in one run.

    python bench/decode.py --gpu                       # TinyLlama-1.1B's shape, random bfloat16 weights
    python bench/decode.py --gpu --model /data/TinyLlama-1.1B --dtype float16
    python bench/decode.py --shape tiny --batches 1,2 --gen-tokens 8 --prefill-tokens 32   # CPU smoke test

Without --model the weights are random (bench/random_llama.py writes them once to --cache-dir). A decode
step reads every weight but the embedding table (the lm_head, or the tied table as the lm_head): weight
GB/s = those bytes x steps/s, against the device's copy bandwidth measured in the same run (2 x bytes / time,
read + write, as bench/elementwise.py). Tokens/s counts every row of the batch, after the first token.
Memory: the BufferPool's peak while netcl generates at batch 1, beside the weights and the KV cache.
PyTorch peer: the same computation written out (static KV cache, positions in a device tensor, so one decode
step is one CUDA graph), weights loaded from the same safetensors; greedy tokens of both are compared.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from random_llama import SHAPES, write_random_llama  # noqa: E402

from netcl import profiling  # noqa: E402
from netcl.core.backend import enqueue_copy  # noqa: E402
from netcl.core.device import manager  # noqa: E402
from netcl.core.tensor import Tensor  # noqa: E402
from netcl.errors import NetclError  # noqa: E402
from netcl.io import huggingface as hf_io  # noqa: E402
from netcl.models import GPT  # noqa: E402
from netcl.ops.rope import rope_inv_freq  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the netcl rows alone
    torch = None


# ------------------------------------------------------------------------------------------ the PyTorch peer
class TorchLlama:
    """LlamaForCausalLM's decoding with a static KV cache: `step(ids, pos)` appends ids (B, S) at position
    pos (a device tensor (1,)) and returns the last position's logits (B, vocab); no host value changes
    between steps, so one decode step is capturable as a CUDA graph."""

    def __init__(
        self, directory: Path, cfg: dict[str, Any], dtype: str, device: str, batch: int, capacity: int
    ):
        from safetensors.torch import load_file

        self.cfg, self.device = cfg, device
        self.dt = getattr(torch, dtype)
        files = sorted(directory.glob("*.safetensors"))
        w: dict[str, torch.Tensor] = {}
        for f in files:
            w.update({k: v.to(device=device, dtype=self.dt) for k, v in load_file(str(f)).items()})
        self.w = w
        self.tied = "lm_head.weight" not in w
        c = cfg
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or c["hidden_size"] // self.heads
        inv = rope_inv_freq(self.head_dim, c.get("rope_theta", 10000.0), c.get("rope_scaling"))
        angles = np.outer(np.arange(capacity, dtype=np.float32), inv)
        angles = np.concatenate([angles, angles], axis=-1)
        self.cos = torch.tensor(np.cos(angles), device=device, dtype=self.dt)
        self.sin = torch.tensor(np.sin(angles), device=device, dtype=self.dt)
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        self.caches = [
            (
                torch.zeros(shape, device=device, dtype=self.dt),
                torch.zeros(shape, device=device, dtype=self.dt),
            )
            for _ in range(c["num_hidden_layers"])
        ]
        self.keys = torch.arange(capacity, device=device)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg["rms_norm_eps"])
        return weight * xf.to(self.dt)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-b, a), dim=-1) * sin

    @torch.no_grad()
    def step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        w, hd = self.w, self.head_dim
        positions = pos + torch.arange(s, device=self.device)
        cos, sin = self.cos[positions], self.sin[positions]
        mask = self.keys[None, :] <= positions[:, None]  # (S, capacity): causal over the cache
        x = F.embedding(ids, w["model.embed_tokens.weight"])
        for i, (ck, cv) in enumerate(self.caches):
            p = f"model.layers.{i}."
            h = self._norm(x, w[p + "input_layernorm.weight"])
            q = F.linear(h, w[p + "self_attn.q_proj.weight"]).view(b, s, self.heads, hd).transpose(1, 2)
            k = F.linear(h, w[p + "self_attn.k_proj.weight"]).view(b, s, self.kv_heads, hd).transpose(1, 2)
            v = F.linear(h, w[p + "self_attn.v_proj.weight"]).view(b, s, self.kv_heads, hd).transpose(1, 2)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            ck.index_copy_(2, positions, k)
            cv.index_copy_(2, positions, v)
            o = F.scaled_dot_product_attention(q, ck, cv, attn_mask=mask, enable_gqa=True)
            x = x + F.linear(o.transpose(1, 2).reshape(b, s, -1), w[p + "self_attn.o_proj.weight"])
            h = self._norm(x, w[p + "post_attention_layernorm.weight"])
            gate = F.silu(F.linear(h, w[p + "mlp.gate_proj.weight"])) * F.linear(
                h, w[p + "mlp.up_proj.weight"]
            )
            x = x + F.linear(gate, w[p + "mlp.down_proj.weight"])
        x = self._norm(x[:, -1], w["model.norm.weight"])
        return F.linear(x, w["model.embed_tokens.weight" if self.tied else "lm_head.weight"])


def torch_generate(
    model: TorchLlama, prompt: np.ndarray, new_tokens: int, graph: bool, sync: Any
) -> tuple[float, float, np.ndarray]:
    """(seconds to the first token, seconds for the rest, tokens (B, new_tokens)): greedy, each step's
    tokens read to the host as a streaming generator must; `graph`: the decode step replayed from a CUDA
    graph (captured here, outside the timing, on the first call's state)."""
    dev = model.device
    ids = torch.tensor(prompt, device=dev)
    pos = torch.zeros(1, dtype=torch.long, device=dev)
    token = torch.zeros((prompt.shape[0], 1), dtype=torch.long, device=dev)

    def decode() -> None:
        token.copy_(model.step(token, pos).argmax(-1, keepdim=True))
        pos.add_(1)

    cuda_graph = None
    if graph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up on a side stream, as torch.cuda.graphs asks
                decode()
        torch.cuda.current_stream().wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            decode()
    pos.zero_()
    sync()
    t0 = time.perf_counter()
    token.copy_(model.step(ids, pos).argmax(-1, keepdim=True))
    pos.add_(prompt.shape[1])
    out = [token.cpu().numpy().copy()]  # (on the CPU .cpu() is the tensor itself)
    t1 = time.perf_counter()
    for _ in range(new_tokens - 1):
        if cuda_graph is not None:
            cuda_graph.replay()
        else:
            decode()
        out.append(token.cpu().numpy().copy())
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, np.concatenate(out, axis=1)


# ------------------------------------------------------------------------------------------ netcl
def netcl_generate(model: GPT, prompt: np.ndarray, new_tokens: int) -> tuple[float, float, np.ndarray]:
    t0 = time.perf_counter()
    out, t1 = [], 0.0
    for step in model.generate(prompt, new_tokens, temperature=0.0):
        if not out:
            t1 = time.perf_counter()
        out.append(np.asarray(step).reshape(-1, 1))
    return t1 - t0, time.perf_counter() - t1, np.concatenate(out, axis=1)


def trace_phases(model: GPT, rng: Any, batch: int, prompt_tokens: int, step_bytes: int,
                 copy_bw: float) -> dict[str, Any] | None:
    """One decode step's whole-layer launch traced (ops.gemm.chain.TRACE; the step run eagerly, not
    replayed): per phase of a layer, the medians over the layers of its tiles, its time (from the last tile
    of the phase before ending to its own last ending), the lag before its first release, a tile's work
    (release to end) and wait (start to release). Printed; returned for the JSON (None where no such launch
    ran: another decode path)."""
    from netcl.ops.gemm import chain

    prompt = rng.integers(0, model.config.vocab_size, (batch, prompt_tokens)).astype(np.int64)
    chain.TRACE, chain._last_trace = True, {}
    try:
        for _ in model.generate(prompt, 3, temperature=0.0, use_graph=False):
            pass
        tr = chain.read_trace()
    finally:
        chain.TRACE = False
    if tr is None:
        print("\ntrace: no whole-layer decode launch ran (--no-layer-chain, or the model does not fit it)")
        return None
    unit = 1e-3 if tr["ns"] else 1.0   # us, or the counter's ticks
    what = "us" if tr["ns"] else "ticks (an order, not a time: no device timer here)"
    names = ("q/k/v", "attention", "o", "gate/up", "down")
    phases = int(tr["phase"].max()) + 1
    last_end = [float(tr["end"][tr["phase"] == g].max()) for g in range(phases)]
    rows = []
    for p in range(5):
        per = {"time": [], "lag": [], "work": [], "wait": []}
        for g in range(p, phases, 5):
            mine = tr["phase"] == g
            before = last_end[g - 1] if g else float(tr["start"].min())
            per["time"].append(last_end[g] - before)
            per["lag"].append(float(tr["release"][mine].min()) - before)
            per["work"].append(float(np.median(tr["end"][mine] - tr["release"][mine])))
            per["wait"].append(float(np.median(tr["release"][mine] - tr["start"][mine])))
        rows.append({"phase": names[p], "tiles": tr["phase_tiles"][p],
                     **{k: float(np.median(v)) * unit for k, v in per.items()},
                     "sum": float(np.sum(per["time"])) * unit})
    span = (float(tr["arrived"].max()) - float(tr["start"].min())) * unit
    print(f"\ntrace of one decode step's whole-layer launch ({tr['layers']} layers, {len(tr['start']):,} "
          f"tiles, {span:,.1f} {what.split()[0]}): per phase, medians over the layers, in {what}")
    head = ("phase", "tiles", "time", "all layers", "lag", "tile work", "wait")
    print("  {:<10} {:>6} {:>8} {:>11} {:>6} {:>10} {:>8}".format(*head))
    for r in rows:
        print(f"  {r['phase']:<10} {r['tiles']:>6} {r['time']:>8.2f} {r['sum']:>11.1f} {r['lag']:>6.2f} "
              f"{r['work']:>10.2f} {r['wait']:>8.2f}")
    nsplit = tr["attention_grid"][0]
    attn = tr["phase"] % 5 == 1
    split = tr["tile"][attn] % nsplit
    work = (tr["end"] - tr["release"])[attn]
    by_split = [float(np.median(work[split == s])) * unit for s in range(nsplit)]
    print("  attention tiles' work by split of the keys (the last to finish merges the splits): "
          + ", ".join(f"{w:.2f}" for w in by_split))
    if tr["ns"]:
        print(f"  (time: from the last tile of the phase before ending to its own last ending; lag: to its "
              f"first release; at the copy bandwidth the step's {step_bytes / 1e6:,.0f} MB take "
              f"{step_bytes / copy_bw * 1e6:,.0f} us)")
    return {"span": span, "unit": what.split()[0], "phases": rows, "attention_work_by_split": by_split}


def copy_bandwidth(q: Any, nbytes: int, repeats: int = 10) -> float:
    """The device's buffer-to-buffer copy rate, 2 x bytes / time (median of `repeats` after a warm-up)."""
    src = Tensor.empty(q, (nbytes // 4,), np.float32)
    dst = Tensor.empty(q, (nbytes // 4,), np.float32)
    times = []
    for i in range(repeats + 2):
        q.finish()
        t0 = time.perf_counter()
        enqueue_copy(q, dst.buffer, src.buffer, byte_count=nbytes)
        q.finish()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(times)


def median_run(fn: Any, repeats: int) -> tuple[float, float, np.ndarray]:
    fn()  # warm-up: programs built, netcl's decode step recorded
    runs = [fn() for _ in range(repeats)]
    return (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs), runs[0][2])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="netcl on the OpenCL GPU, PyTorch on CUDA")
    ap.add_argument("--device", default=None, help="netcl device spec (default: gpu with --gpu, else auto)")
    ap.add_argument("--model", default=None, help="a Hugging Face Llama directory (default: random weights)")
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="tinyllama-1.1b",
        help="the random model's shape without --model (default tinyllama-1.1b)",
    )
    ap.add_argument(
        "--cache-dir",
        default="/tmp/netcl-random-llama",
        help="where the random model is written once (default /tmp/netcl-random-llama)",
    )
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--batches", default="1,8,32", help="decode batch sizes (default 1,8,32)")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length of the decode runs")
    ap.add_argument("--gen-tokens", type=int, default=128, help="tokens generated per run (default 128)")
    ap.add_argument(
        "--prefill-tokens", type=int, default=1024, help="the long prompt's length (default 1024)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per row (median; default 3)")
    ap.add_argument("--no-torch", action="store_true", help="the netcl rows only")
    ap.add_argument("--int8", action="store_true",
                    help="also netcl's rows with weight-only int8 linear layers (GPT.quantize_int8)")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP",
                    help="also profile 32 decode steps at the first batch: device time a step beside "
                         "its wall time, and the TOP kernels")
    ap.add_argument("--no-chain", action="store_true",
                    help="a layer's MLP half as three launches, not one (nn.transformer.DECODE_CHAIN)")
    ap.add_argument("--no-attention-chain", action="store_true",
                    help="a layer's attention its own launch, not the first tiles of the layer's chain "
                         "(nn.transformer.DECODE_ATTENTION_CHAIN)")
    ap.add_argument("--no-layer-chain", action="store_true",
                    help="a launch a layer, not all layers in one launch (nn.transformer.DECODE_LAYER_CHAIN)")
    ap.add_argument("--attention-keys", type=int, default=None, metavar="DK",
                    help="the decode attention's keys a tile, fixed (ops.attention.DECODE_TILE_KEYS; "
                         "default: by the cache's length)")
    ap.add_argument("--attention-groups", type=int, default=None, metavar="G",
                    help="the decode attention's wanted work-groups a compute unit "
                         "(ops.attention.DECODE_GROUPS_PER_CU; 0: one split)")
    ap.add_argument("--attention-preload", type=int, default=None, metavar="KEYS",
                    help="the most keys a split of the decode attention holds in local memory "
                         "(ops.attention.DECODE_PRELOAD_KEYS; 0: none, the splits by --attention-groups)")
    ap.add_argument("--attention-head-split", type=int, default=None, metavar="Q",
                    help="a kv head's q heads over Q work-groups of the decode attention (with its preload; "
                         "ops.attention.DECODE_HEAD_SPLIT, default 1)")
    ap.add_argument("--nv-verbose", action="store_true",
                    help="NVIDIA: build the GEMV programs (the whole-layer launch's among them) with "
                         "-cl-nv-verbose and print each one's registers and spills (with "
                         "CUDA_CACHE_DISABLE=1: the driver's own cache skips ptxas)")
    ap.add_argument("--no-register-cap", action="store_true",
                    help="NVIDIA: the whole-layer launch as ptxas assembles it unasked, not within three "
                         "work-groups' registers where it holds the attention's preload "
                         "(ops.gemm.chain.CAP_REGISTERS)")
    ap.add_argument("--spin-ns", type=int, default=None, metavar="NS",
                    help="a chain tile polling its phase's count sleeps NS ns between reads "
                         "(ops.gemm.chain.SPIN_NS; NVIDIA only; default: no sleep)")
    ap.add_argument("--trace", action="store_true",
                    help="also trace the whole-layer decode launch of one step at the first batch: each "
                         "tile's start, release, end and arrival (ops.gemm.chain.TRACE), summed by phase")
    ap.add_argument("--ahead", default=None, metavar="LINES,PHASES[,FAR]",
                    help="the whole-layer launch's read-ahead (ops.gemm.chain.AHEAD): a tile of a phase in "
                         "the mask PHASES (bit p: 0 q/k/v, 2 o, 3 gate/up, 4 down) asks L2 for LINES "
                         "128-byte lines of each weight row once the phase before its own (those in the "
                         "mask FAR: the one before that) is released; default 64,4 (the o-projection's), "
                         "0 for none")
    ap.add_argument("--gemv", default=None, metavar="KNOB=V,...",
                    help="the decode GEMVs' knobs (GEMV_WG, GEMV_ROWS, GEMV_UNROLL) set in "
                         "ops.gemm.variants.DEFAULTS['gemv']['any'], e.g. GEMV_UNROLL=8")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/decode[_gpu].json)")
    args = ap.parse_args()
    if args.gemv is not None:
        from netcl.ops.gemm import variants

        knobs = {}
        for item in args.gemv.split(","):
            name, _, value = item.partition("=")
            if name not in ("GEMV_WG", "GEMV_ROWS", "GEMV_UNROLL") or not value.isdigit() or int(value) < 1:
                ap.error(f"--gemv takes GEMV_WG, GEMV_ROWS or GEMV_UNROLL = a positive integer, got {item!r}")
            knobs[name] = int(value)
        variants.DEFAULTS["gemv"]["any"].update(knobs)
    if args.nv_verbose:
        from netcl.ops.gemm import variants

        variants.NV_VERBOSE = True
    if args.no_register_cap:
        from netcl.ops.gemm import chain

        chain.CAP_REGISTERS = False
    if args.spin_ns is not None:
        from netcl.ops.gemm import chain

        if not 0 <= args.spin_ns <= 1_000_000:
            ap.error(f"--spin-ns must be 0 to 1000000, got {args.spin_ns}")
        chain.SPIN_NS = args.spin_ns
    if args.ahead is not None:
        from netcl.ops.gemm import chain

        try:
            chain.AHEAD = None if args.ahead.strip() == "0" else tuple(int(v) for v in args.ahead.split(","))
            chain._ahead_defines()
        except ValueError as e:
            ap.error(f"--ahead {args.ahead!r}: {e}")
    if args.no_chain or args.no_attention_chain or args.no_layer_chain:
        from netcl.nn import transformer

        transformer.DECODE_CHAIN = not args.no_chain
        transformer.DECODE_ATTENTION_CHAIN = not args.no_attention_chain
        transformer.DECODE_LAYER_CHAIN = not args.no_layer_chain
    if (args.attention_keys is not None and args.attention_keys < 1) \
            or (args.attention_groups is not None and args.attention_groups < 0) \
            or (args.attention_preload is not None and args.attention_preload < 0) \
            or (args.attention_head_split is not None and args.attention_head_split < 1):
        ap.error("--attention-keys >= 1, --attention-groups >= 0, --attention-preload >= 0, "
                 "--attention-head-split >= 1")
    if args.attention_keys is not None or args.attention_groups is not None \
            or args.attention_preload is not None or args.attention_head_split is not None:
        from netcl.ops import attention

        if args.attention_keys is not None:
            attention.DECODE_TILE_KEYS = (args.attention_keys,)
        if args.attention_groups is not None:
            attention.DECODE_GROUPS_PER_CU = args.attention_groups
        if args.attention_preload is not None:
            attention.DECODE_PRELOAD_KEYS = args.attention_preload
        if args.attention_head_split is not None:
            attention.DECODE_HEAD_SPLIT = args.attention_head_split
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches must be comma-separated integers, got {args.batches!r}")
    if min(batches) < 1 or args.gen_tokens < 2 or args.prompt_tokens < 1 or args.repeats < 1 \
            or args.prefill_tokens < 1:
        ap.error("--batches >= 1, --gen-tokens >= 2, --prompt-tokens >= 1, --repeats >= 1, "
                 "--prefill-tokens >= 1")
    out_path = (
        Path(args.out)
        if args.out
        else Path(__file__).parent / "results" / (f"decode{'_gpu' if args.gpu else ''}.json")
    )
    if args.model:
        directory = Path(args.model)
    else:
        directory = Path(args.cache_dir) / f"{args.shape}-{args.dtype}"
        if not (directory / "config.json").is_file():
            print(f"writing a random {args.shape} to {directory} ...", flush=True)
            write_random_llama(directory, args.shape, args.dtype)
    try:
        dev = manager.default(args.device or ("gpu" if args.gpu else "auto"))
    except NetclError as exc:
        ap.error(f"--device: {exc}")
    q = dev.queue
    use_torch = torch is not None and not args.no_torch
    tdev = "cuda" if args.gpu else "cpu"
    if use_torch and tdev == "cuda" and not torch.cuda.is_available():
        ap.error("--gpu: PyTorch has no CUDA device here (--no-torch for the netcl rows alone)")
    sync = torch.cuda.synchronize if use_torch and tdev == "cuda" else (lambda: None)

    pool = dev.pool
    base = pool.stats()["in_use"]
    t0 = time.perf_counter()
    model = GPT.from_pretrained(directory, q, dtype=args.dtype)
    q.finish()
    load_s = time.perf_counter() - t0
    c = model.config
    weight_bytes = sum(p.value.nbytes for p in model.parameters())
    step_bytes = weight_bytes - (0 if c.tie_embeddings else model.tok_embeddings.weight.value.nbytes)
    loaded = pool.stats()["in_use"] - base
    copy_bw = copy_bandwidth(q, min(1 << 30, max(1 << 24, weight_bytes // 2)))
    hf_cfg = hf_io.read_config(directory)
    print(f"netcl on {dev.device_name}; PyTorch {torch.__version__ if use_torch else '-'} on {tdev}")
    print(
        f"model {directory}: {c.num_parameters() / 1e6:,.1f} M parameters, {c.n_layers} layers, dim {c.dim}, "
        f"{c.n_heads}/{c.n_kv_heads} heads, {args.dtype}: {weight_bytes / 1e6:,.1f} MB of weights "
        f"(loaded in {load_s:.1f} s; device memory after loading {loaded / 1e6:,.1f} MB); "
        f"a decode step reads {step_bytes / 1e6:,.1f} MB; copy bandwidth {copy_bw / 1e9:,.0f} GB/s"
    )

    rng = np.random.default_rng(0)
    rows, result_rows = [], []

    def add(name: str, batch: int, first: float, rest: float, new: int, peer: float | None,
            read: int = step_bytes) -> float:
        rate = batch * (new - 1) / rest
        gbps = (new - 1) / rest * read / 1e9
        rows.append(
            (
                name,
                batch,
                f"{first * 1e3:9.1f}",
                f"{rest / (new - 1) * 1e3:8.3f}",
                f"{rate:10,.0f}",
                f"{gbps:8,.1f}",
                f"{100 * gbps * 1e9 / copy_bw:5.0f}%",
                "" if peer is None else f"{rate / peer:6.2f}x",
            )
        )
        result_rows.append(
            {
                "name": name,
                "batch": batch,
                "first_token_s": first,
                "step_ms": rest / (new - 1) * 1e3,
                "tokens_per_s": rate,
                "weight_gb_per_s": gbps,
                "of_copy": gbps * 1e9 / copy_bw,
            }
        )
        return rate

    agreement: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    for batch in batches:
        prompt = rng.integers(0, c.vocab_size, (batch, args.prompt_tokens)).astype(np.int64)
        new = args.gen_tokens
        if batch == batches[0]:
            pool.reset_peak()
        nf, nr, ntok = median_run(lambda: netcl_generate(model, prompt, new), args.repeats)
        if batch == batches[0]:
            state = model._decoder
            cache = sum(kv.k.nbytes + kv.v.nbytes for kv in state.caches)
            memory = {
                "batch": batch,
                "weights": weight_bytes,
                "kv_cache": cache,
                "pool_peak": pool.stats()["peak"] - base,
            }
        torch_rates: dict[str, float] = {}
        if use_torch:
            peer = TorchLlama(directory, hf_cfg, args.dtype, tdev, batch, args.prompt_tokens + new)
            tf, tr, ttok = median_run(lambda: torch_generate(peer, prompt, new, False, sync), args.repeats)
            torch_rates["eager"] = batch * (new - 1) / tr
            agree = (ntok == ttok).all(axis=0)
            agreement[str(batch)] = int(np.argmin(agree)) if not agree.all() else new
            if tdev == "cuda":
                gf, gr, _ = median_run(lambda: torch_generate(peer, prompt, new, True, sync), args.repeats)
                torch_rates["graph"] = batch * (new - 1) / gr
            peer_best = max(torch_rates.values())
        else:
            peer_best = None
        add("netcl generate (recorded decode step)", batch, nf, nr, new, peer_best)
        if use_torch:
            add("PyTorch eager, static KV cache", batch, tf, tr, new, None)
            if "graph" in torch_rates:
                add("PyTorch, decode step as a CUDA graph", batch, gf, gr, new, None)
            del peer
            if tdev == "cuda":
                torch.cuda.empty_cache()

    # prefill of one long prompt (flash attention): time to the first token
    long_len = min(args.prefill_tokens, c.max_seq_len - 2)
    prompt = rng.integers(0, c.vocab_size, (1, long_len)).astype(np.int64)
    prefill = {"tokens": long_len}
    nf, _, _ = median_run(lambda: netcl_generate(model, prompt, 2), args.repeats)
    prefill["netcl_s"] = nf
    if use_torch:
        peer = TorchLlama(directory, hf_cfg, args.dtype, tdev, 1, long_len + 2)
        tf, _, _ = median_run(lambda: torch_generate(peer, prompt, 2, False, sync), args.repeats)
        prefill["torch_eager_s"] = tf
        del peer

    if args.profile:   # where a decode step's time goes: the device's work, or the launches around it
        prompt = rng.integers(0, c.vocab_size, (batches[0], args.prompt_tokens)).astype(np.int64)
        netcl_generate(model, prompt, 2)
        spans = []
        for new in (1, 33):
            with profiling.profile() as prof:
                t0 = time.perf_counter()
                netcl_generate(model, prompt, new)
                q.finish()
                wall = time.perf_counter() - t0
            spans.append((prof.device_seconds, wall, prof))
        step_dev = (spans[1][0] - spans[0][0]) / 32
        step_wall = (spans[1][1] - spans[0][1]) / 32
        print(f"\nprofile of 32 decode steps at batch {batches[0]}: device time {step_dev * 1e3:.3f} ms a "
              f"step ({step_bytes / step_dev / 1e9:,.0f} GB/s of the weights it reads), wall "
              f"{step_wall * 1e3:.3f} ms a step (profiled: event timing on)")
        spans[1][2].report(by="kernel", top=args.profile)
        # the device's idle time between commands of the 32 decode steps (the commands of the one-token run,
        # its prefill and first step, left out): the driver's, or the host's late enqueues
        first = len(spans[0][2].device_spans())
        gap_totals, gap_rows = spans[1][2].gaps(top=args.profile, skip=first)
        idle, late = gap_totals["idle"], gap_totals["host_late"]
        span = gap_totals["span"]
        print(f"idle device time between the 32 decode steps' commands: {idle * 1e3:.3f} ms of a "
              f"{span * 1e3:.3f} ms timeline ({idle / 32 * 1e6:.1f} us a step), of which the next command "
              f"not yet enqueued {late * 1e3:.3f} ms ({late / 32 * 1e6:.1f} us a step)")
        for r in gap_rows:
            print(f"  {r['before'][:28]:<28} -> {r['after'][:28]:<28} {r['calls']:>5}  "
                  f"{r['idle'] * 1e3:8.3f} ms  ({r['host_late'] * 1e3:.3f} ms host late)")
        results_profile = {"batch": batches[0], "device_step_s": step_dev, "wall_step_s": step_wall,
                           "kernels": [r._asdict() for r in spans[1][2].rows("kernel")[: args.profile]],
                           "idle": gap_totals, "idle_pairs": gap_rows}
    else:
        results_profile = None
    results_trace = trace_phases(model, rng, batches[0], args.prompt_tokens, step_bytes, copy_bw) \
        if args.trace else None
    int8_bytes = None
    if args.int8:  # the same model, its linear layers quantized in place
        model.quantize_int8()
        int8_bytes = sum(p.value.nbytes for p in model.parameters()) + sum(
            m.weight_scale.nbytes for m in model.modules() if getattr(m, "weight_scale", None) is not None
        )
        int8_bytes -= 0 if c.tie_embeddings else model.tok_embeddings.weight.value.nbytes
        for batch in batches:
            prompt = rng.integers(0, c.vocab_size, (batch, args.prompt_tokens)).astype(np.int64)
            nf, nr, _ = median_run(lambda: netcl_generate(model, prompt, args.gen_tokens), args.repeats)
            add("netcl generate, int8 weights", batch, nf, nr, args.gen_tokens, None, int8_bytes)

    print(
        f"\n{'':40} {'batch':>5} {'first ms':>9} {'step ms':>8} {'tokens/s':>10} {'GB/s':>8} {'copy':>6} "
        f"{'vs best PyTorch':>15}"
    )
    for r in rows:
        print(f"{r[0]:40} {r[1]:>5} {r[2]:>9} {r[3]:>8} {r[4]:>10} {r[5]:>8} {r[6]:>6} {r[7]:>15}")
    print(
        f"(prompt {args.prompt_tokens} tokens, {args.gen_tokens} generated, median of {args.repeats}; GB/s = "
        f"weight bytes a step reads x steps/s; copy = that over the copy bandwidth; ratio = netcl's tokens/s "
        f"over the faster PyTorch row)"
    )
    line = (
        f"prefill of {long_len} tokens at batch 1: netcl {prefill['netcl_s'] * 1e3:.1f} ms "
        f"({long_len / prefill['netcl_s']:,.0f} tokens/s)"
    )
    if "torch_eager_s" in prefill:
        line += (
            f", PyTorch eager {prefill['torch_eager_s'] * 1e3:.1f} ms "
            f"({long_len / prefill['torch_eager_s']:,.0f} tokens/s)"
        )
    print(line)
    if memory:
        print(
            f"memory at batch {memory['batch']}: BufferPool peak {memory['pool_peak'] / 1e6:,.1f} MB = "
            f"weights {memory['weights'] / 1e6:,.1f} MB + KV cache {memory['kv_cache'] / 1e6:,.1f} MB + "
            f"{(memory['pool_peak'] - memory['weights'] - memory['kv_cache']) / 1e6:,.1f} MB else"
        )
    if agreement:
        print(
            "greedy tokens equal to PyTorch's (every row) for the first: "
            + ", ".join(f"{v} of {args.gen_tokens} at batch {k}" for k, v in agreement.items())
        )
    result = {
        "device": dev.device_name,
        "torch_device": tdev if use_torch else None,
        "torch": torch.__version__ if use_torch else None,
        "model": str(directory),
        "dtype": args.dtype,
        "config": c.to_dict(),
        "weight_bytes": weight_bytes,
        "step_bytes": step_bytes,
        "load_seconds": load_s,
        "copy_bandwidth": copy_bw,
        "rows": result_rows,
        "prefill": prefill,
        "memory": memory,
        "greedy_agreement": agreement,
        "int8_step_bytes": int8_bytes,
        "profile": results_profile,
        "trace": results_trace,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
