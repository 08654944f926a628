"""Convolution as a GEMM (netcl.ops.gemm) over im2col columns (kernels/im2col.cl): the forward pass, the
backward-input pass (GEMM then col2im) and the weight gradient (batched over images on GPUs, one long-K
GEMM on CPUs), with their launch plans built once per geometry and chunk of images."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from netcl import kernels
from netcl.core import capture, launch_labels
from netcl.core.tensor import Tensor
from netcl.ops import gemm as mm
from netcl.ops.conv.geometry import ConvParams, _params
from netcl.ops.elementwise import add
from netcl.ops.reduce import sum as sum_


def _im2col_chunk(device: Any, p: ConvParams, itemsize: int) -> int:
    budget = min(device.capabilities.max_alloc // 2, 1 << 30)
    per_image = p.C * (p.KH * p.KW + 1) * p.OH * p.OW * itemsize
    return max(1, min(p.N, budget // max(per_image, 1)))


def _row_kernels(device: Any) -> bool:
    """CPUs get the im2col/col2im kernels where one work-item copies whole rows (PoCL pays per
    work-item and vectorises unit-stride loops); GPUs one work-item per element (coalesced)."""
    return device.capabilities.kind == "cpu"


def _im2col(x: Tensor, p: ConvParams, n0: int, nb: int, ones_row: bool = False,
            batch_inner: bool = False) -> Tensor:
    """cols of images n0..n0+nb-1, R = Cg*KH*KW [+1 row of ones] rows of P = OH*OW positions each:
    (nb, G, R, P) per image, or with batch_inner (G, R, nb*P) (every image's positions in one row).
    The launch (kernel, sizes, scalar arguments) is built once per (device, dtype, geometry, chunk)."""
    device = x.queue.device
    key = ("im2col", id(device), x.dtype, p, n0, nb, ones_row, batch_inner, _row_kernels(device))
    plan = capture.plans.get(key)
    if plan is None or plan[0] is not device:
        plan = capture.plans.put(key, _im2col_plan(x, p, n0, nb, ones_row, batch_inner))
    _, shape, launch = plan
    cols = Tensor.empty(x.queue, shape, x.dtype)
    if launch is not None:
        if capture.declaring():  # for the profiler: nb images read, the columns written
            launch_labels.work(0.0, float(nb * p.C * p.H * p.W * x.itemsize + cols.nbytes))
        launch(x.queue, x.buffer, x.offset, cols.buffer)
    return cols


def _im2col_plan(x: Tensor, p: ConvParams, n0: int, nb: int, ones_row: bool, batch_inner: bool) -> tuple:
    rows = p.Cg * p.KH * p.KW + int(ones_row)
    P = p.OH * p.OW
    if batch_inner:
        shape = (p.G, rows, nb * P)
        sb, sg, sr = P, rows * nb * P, nb * P
    else:
        shape = (nb, p.G, rows, P)
        sb, sg, sr = p.G * rows * P, rows * P, P
    if math.prod(shape) == 0:
        return (x.device, shape, None)
    prg = kernels.program(x.device, "im2col.cl", dtype=x.dtype)
    g = p.geometry()
    tail = (np.int64(sb), np.int64(sg), np.int64(sr),
            np.int32(n0), np.int32(nb), np.int32(ones_row), g[1], g[2], g[3], *g[5:])
    # a Plan (netcl.core.backend): the geometry arguments set once; x, its offset and cols per call
    args = (None, np.int64(0), None, *tail)  # x's offset (a long) and the buffers per call
    if _row_kernels(x.device):
        return (x.device, shape, prg.im2col_rows.plan((rows, nb * p.G), None, args, (0, 1, 2)))
    return (x.device, shape, prg.im2col.plan((P, p.Cg + int(ones_row), nb * p.G), None, args, (0, 1, 2)))


def _conv_im2col(x: Tensor, w: Tensor, bias: Tensor | None, p: ConvParams, activation: str | None) -> Tensor:
    """y[n, g] (Kg x OH*OW) = w[g] (Kg x R) @ cols[n, g] (R x OH*OW): the GEMM writes NCHW directly.

    The bias runs along the GEMM's rows: with one group the GEMM adds it per row in its epilogue
    (bias_rows); with several, w gets a bias column and cols a row of ones (R+1), since the bias then
    differs between the batched GEMMs. The epilogue applies the activation: one GEMM launch.
    """

    r = p.Cg * p.KH * p.KW
    wg = w.reshape(p.G, p.Kg, r)
    ones_row = bias is not None and p.G > 1
    row_bias = bias if bias is not None and not ones_row else None
    if ones_row:  # w and bias are contiguous here (conv2d made them so)
        wb = Tensor.empty(w.queue, (p.G, p.Kg, r + 1), w.dtype)
        prg = kernels.program(w.device, "im2col.cl", dtype=w.dtype)
        prg.weight_bias(w.queue, (r + 1, p.K), None, w.buffer, np.int64(w.offset), bias.buffer,
                        np.int64(bias.offset), wb.buffer, np.int32(p.K), np.int32(r))
        wg = wb
    if row_bias is not None:
        wg = wg.reshape(p.Kg, r)  # one group: a plain (K, R) matrix, shared by every image
    chunk = _im2col_chunk(x.device, p, x.itemsize)
    if chunk >= p.N:
        cols = _im2col(x, p, 0, p.N, ones_row=ones_row)
        if row_bias is not None:
            cols = cols.reshape(p.N, r, p.OH * p.OW)
        return mm.gemm(wg, cols, row_bias, activation, bias_rows=row_bias is not None).reshape(p.output_shape)
    out = Tensor.empty(x.queue, p.output_shape, x.dtype)
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = _im2col(x, p, n0, nb, ones_row=ones_row)
        if row_bias is not None:
            cols = cols.reshape(nb, r, p.OH * p.OW)
        res = mm.gemm(wg, cols, row_bias, activation, bias_rows=row_bias is not None)
        out[n0:n0 + nb].copy_(res.reshape(nb, p.K, p.OH, p.OW))
    return out


def _backward_input_gemm(gy: Tensor, w: Tensor, gx: Tensor, p: ConvParams) -> None:
    """cols[n, g] (R x P) = w[g]^T (R x Kg) @ gy[n, g] (Kg x P) (the weight's transpose read in
    place, batch-broadcast over n), then col2im gathers cols back into gx; chunked over images."""

    r, P = p.Cg * p.KH * p.KW, p.OH * p.OW
    wt = w.reshape(p.G, p.Kg, r).transpose(1, 2)                              # (G, R, Kg)
    chunk = _im2col_chunk(gy.device, p, gy.itemsize)
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        chunk_gy = gy if nb == p.N else gy[n0:n0 + nb]                       # (a whole batch: no slicing)
        cols = mm.matmul(wt, chunk_gy.reshape(nb, p.G, p.Kg, P))              # (nb, G, R, P)
        if cols.offset or not cols.is_contiguous():
            cols = cols.clone()  # the kernels index a contiguous cols from element 0
        _col2im_plan(gy, p, n0, nb)(gy.queue, cols.buffer, gx.buffer, gx.offset)


def _col2im_plan(gy: Tensor, p: ConvParams, n0: int, nb: int) -> Any:
    """The Plan (netcl.core.backend) of one col2im chunk, built once: cols, gx and gx's offset per call."""
    device = gy.queue.device
    rows = _row_kernels(device)
    key = ("col2im", id(device), gy.dtype, p, n0, nb, rows)
    plan = capture.plans.get(key)
    if plan is None or plan[0] is not device:
        g = p.geometry()
        tail = (np.int32(n0), np.int32(nb), g[1], g[2], g[3], *g[5:])
        if rows:
            prg = kernels.program(gy.device, "im2col.cl", dtype=gy.dtype)
            plan = (gy.device, prg.col2im_plane.plan((nb * p.C,), None, (None, None, np.int64(0), *tail),
                                                     (0, 1, 2)))
        else:  # the taps compiled in: no runtime division per tap (kernels/im2col.cl)
            prg = kernels.program(
                gy.device,
                "im2col.cl",
                dtype=gy.dtype,
                TAP_KH=p.KH,
                TAP_KW=p.KW,
                TAP_SH=p.SH,
                TAP_SW=p.SW,
                TAP_PH=p.PH,
                TAP_PW=p.PW,
                TAP_DH=p.DH,
                TAP_DW=p.DW,
            )
            plan = (gy.device, prg.col2im.plan((p.W, p.H, nb * p.C), None, (None, None, np.int64(0), *tail),
                                               (0, 1, 2)))
        capture.plans.put(key, plan)
    return plan[1]


def _backward_weight_gemm(x: Tensor, gy: Tensor, p: ConvParams) -> Tensor:
    """GPUs with at least as many positions per image as rows of cols (P >= R: early layers): one GEMM
    batched over images and a sum (_backward_weight_batched); else (late layers, where the per-image
    products would be thin and their (N, K, R) workspace large) and on CPUs: one long-K GEMM over
    batch-inner columns (_backward_weight_rows; split K where M x N is small)."""
    if x.device.capabilities.kind != "cpu" and p.OH * p.OW >= p.Cg * p.KH * p.KW:
        return _backward_weight_batched(x, gy, p)
    return _backward_weight_rows(x, gy, p)


def _backward_weight_batched(x: Tensor, gy: Tensor, p: ConvParams) -> Tensor:
    """GPUs: gw[g] (Kg x R) = sum over images n of gy[n, g] (Kg x P) @ cols[n, g]^T (P x R): one batched
    GEMM over the images (gy read in place, cols in the forward's per-image layout, tile-divisible
    shapes take the edge-free kernel) into a (nb, G, Kg, R) workspace, then one sum over the images.
    On the H200 this replaced the 1x1 im2col that transposed gy into the single long-K GEMM's layout
    (one pass over gy and one launch less; bench/NOTES.md)."""
    r = p.Cg * p.KH * p.KW
    per_image = max(p.K * r, p.G * r * p.OH * p.OW) * x.itemsize
    budget = min(x.device.capabilities.max_alloc // 4, 1 << 28)
    chunk = max(1, min(p.N, _im2col_chunk(x.device, p, x.itemsize), budget // max(per_image, 1)))
    gw = None
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = _im2col(x, p, n0, nb)                                              # (nb, G, R, P)
        g = (gy if nb == p.N else gy[n0:n0 + nb]).reshape(nb, p.G, p.Kg, p.OH * p.OW)  # a view
        part = sum_(mm.matmul(g, cols.transpose(2, 3)), axis=0)                  # (G, Kg, R)
        gw = part if gw is None else add(gw, part)
    return gw.reshape(p.K, p.Cg, p.KH, p.KW)


def _backward_weight_rows(x: Tensor, gy: Tensor, p: ConvParams) -> Tensor:
    """CPUs: gw[g] (Kg x R) = sum over image chunks of gy[chunk, g] (Kg x nb*P) @ cols[g]^T (nb*P x R).

    cols is written batch-inner, (G, R, nb*P), so its transpose is read in place with unit stride
    along the GEMM's K; gy is copied once to (G, Kg, nb*P). Later chunks accumulate through the
    GEMM's residual epilogue (no separate reduction launch)."""
    chunk = _im2col_chunk(x.device, p, x.itemsize)
    # gy (N, K, OH, OW) -> (G, Kg, N*P) is the im2col of a 1x1 convolution over gy: the same row-copy
    # kernel (a generic strided copy measured 2x slower than the GEMM it feeds on PoCL)
    gp = _params(gy.shape, (p.K, p.Kg, 1, 1), 1, 0, 1, p.G, op="conv2d_backward_weight")
    gw = None
    for n0 in range(0, p.N, chunk):
        nb = min(chunk, p.N - n0)
        cols = _im2col(x, p, n0, nb, batch_inner=True)                        # (G, R, nb*P)
        g = _im2col(gy, gp, n0, nb, batch_inner=True)                        # (G, Kg, nb*P)
        gw = mm.matmul_epilogue(g, cols.transpose(1, 2), residual=gw)        # (G, Kg, R)
    return gw.reshape(p.K, p.Cg, p.KH, p.KW)
