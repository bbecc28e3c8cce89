"""win_part and win_unpart: SAM's windowed attention layout (ggml's WIN_PART, WIN_UNPART).

win_part cuts an image x of shape (H, W, C) into square windows of side w, zero padded at
the right and bottom: with npx = ceil(W / w) windows across, npy = ceil(H / w) down and
window index p = py * npx + px,

    win_part(x, w)[p, i, j, c] = x[py*w + i, px*w + j, c]   if py*w + i < H and px*w + j < W
                               = 0                           otherwise (the padding)

of shape (npy * npx, w, w, C). win_unpart puts such windows back into an image of shape
(height, width, C), dropping the padding:

    win_unpart(y, height, width, w)[h, v, c] = y[(h // w) * npx + v // w, h % w, v % w, c]

with npx = ceil(width / w); y must have shape (npy * npx, w, w, C), npy = ceil(height / w).
Both are linear and each is the other's transpose: every element of x lands in exactly one
window element, and win_unpart reads exactly those back. So

    d win_part / dx    = win_unpart(g, H, W, w)        (the padding's gradient is dropped)
    d win_unpart / dy  = win_part(g, w)                (zeros for y's padding elements)

ggml's ops take a 3-D image (its ne3 = 1) and store the windows along ne3. torch: F.pad,
then reshape (npy, w, npx, w, C) and permute the two window axes together (and back).
"""

from __future__ import annotations

import functools

from engine.backends.cpu.win_part import cpu_win_part, cpu_win_unpart
from engine.errors import DTypeError, ShapeError
from engine.params import Params, integer, size_param
from engine.registry import OpDef, make_node, register
from engine.samples import InputSpec, Sample, both_dtypes
from engine.scale_cases import bench_case, scale_case
from engine.strategies import draw_input, sample_strategy
from engine.tensor import is_float

positive = functools.partial(integer, low=1)


def windows(height: int, width: int, window: int) -> tuple[int, int]:
    """(npy, npx): the windows down and across an image of height x width."""
    return -(-height // window), -(-width // window)


def _check_float(op, t):
    if not is_float(t.dtype):
        raise DTypeError(f"{op}: needs a float input, got {t.dtype} of shape {list(t.shape)}")


def _win_part_infer(x, window):
    _check_float("win_part", x)
    if x.ndim != 3:
        raise ShapeError(f"win_part: x must be an image (H, W, C), got shape {list(x.shape)}")
    npy, npx = windows(x.shape[0], x.shape[1], window)
    return (npy * npx, window, window, x.shape[2]), x.dtype


def win_part(x, window):
    """x (H, W, C) cut into (npy * npx, window, window, C) windows, zero padded at the
    right and bottom; window p = py * npx + px."""
    return make_node("win_part", (x,), window=positive("win_part", "window", window))


def _win_unpart_infer(y, height, width, window):
    _check_float("win_unpart", y)
    npy, npx = windows(height, width, window)
    want = (npy * npx, window, window)
    if y.ndim != 4 or tuple(y.shape[:3]) != want:
        raise ShapeError(f"win_unpart: y must have shape (npy * npx, window, window, C) = "
                         f"{list(want) + ['C']} for height {height}, width {width}, window "
                         f"{window} (npy = {npy}, npx = {npx}), got {list(y.shape)}")
    return (height, width, y.shape[3]), y.dtype


def win_unpart(y, height, width, window):
    """Windows y (npy * npx, window, window, C) put back into a (height, width, C) image,
    their padding dropped: the inverse of win_part on its image."""
    return make_node("win_unpart", (y,), height=positive("win_unpart", "height", height),
                     width=positive("win_unpart", "width", width),
                     window=positive("win_unpart", "window", window))


def _torch_win_part(x, window):
    import torch.nn.functional as F
    h, w, c = x.shape
    npy, npx = windows(h, w, window)
    padded = F.pad(x, (0, 0, 0, npx * window - w, 0, npy * window - h))
    tiles = padded.reshape(npy, window, npx, window, c).permute(0, 2, 1, 3, 4)
    return tiles.reshape(npy * npx, window, window, c)


def _torch_win_unpart(y, height, width, window):
    npy, npx = windows(height, width, window)
    c = y.shape[3]
    image = y.reshape(npy, npx, window, window, c).permute(0, 2, 1, 3, 4)
    return image.reshape(npy * window, npx * window, c)[:height, :width]


# --- samples and registration ---------------------------------------------------------------
# (H, W, C, window): ragged both ways, exact tiling, a window larger than the image (one
# window, mostly padding), window 1 (a reshape), a single row, ragged one way only, and
# SAM's window 14 on a small image
CASES = [(5, 7, 3, 3), (6, 6, 2, 3), (4, 5, 2, 2), (3, 2, 4, 4), (3, 4, 2, 1), (1, 8, 2, 3),
         (7, 4, 1, 2), (15, 16, 1, 14)]


def _windows_shape(h, w, c, window):
    npy, npx = windows(h, w, window)
    return (npy * npx, window, window, c)


@both_dtypes
def _win_part_samples(dtype):
    out = [Sample.make("win_part", [InputSpec("x", (h, w, c))], dtype, window=k)
           for h, w, c, k in CASES]
    # views: channels-first storage seen as (H, W, C), sliced, expanded along W and C
    out += [Sample.make("win_part", [InputSpec("x", (5, 4, 3), permute=(1, 2, 0))], dtype,
                        window=3),
            Sample.make("win_part", [InputSpec("x", (5, 4, 2),
                                               slice=((1, 6, 1), (0, 8, 2), (1, 3, 1)))],
                        dtype, window=2),
            Sample.make("win_part", [InputSpec("x", (4, 5, 3), expand=(1, 2))], dtype,
                        window=3)]
    return out


@both_dtypes
def _win_unpart_samples(dtype):
    out = [Sample.make("win_unpart", [InputSpec("y", _windows_shape(h, w, c, k))], dtype,
                       height=h, width=w, window=k) for h, w, c, k in CASES]
    out += [Sample.make("win_unpart", [InputSpec("y", (4, 3, 3, 2), permute=(0, 2, 1, 3))],
                        dtype, height=5, width=4, window=3),
            Sample.make("win_unpart", [InputSpec("y", (6, 2, 2, 2),
                                                 slice=((0, 12, 2), (0, 2, 1), (1, 3, 1),
                                                        (0, 2, 1)))],
                        dtype, height=3, width=5, window=2),
            Sample.make("win_unpart", [InputSpec("y", (4, 3, 3, 3), expand=(0, 3))], dtype,
                        height=4, width=5, window=3)]
    return out


def _draw_geometry(draw):
    """(H, W, C, window): H, W in 1..8, C in 1..3, window in 1..5, so the windows hold at
    most 4 * 5 * 5 * 3 = 300 elements (strategies.MAX_ELEMENTS)."""
    from hypothesis import strategies as st
    return (draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 3)),
            draw(st.integers(1, 5)))


@sample_strategy
def _win_part_strategy(draw, dtype):
    h, w, c, k = _draw_geometry(draw)
    return Sample.make("win_part", [draw_input(draw, "x", (h, w, c))], dtype, window=k)


@sample_strategy
def _win_unpart_strategy(draw, dtype):
    h, w, c, k = _draw_geometry(draw)
    return Sample.make("win_unpart", [draw_input(draw, "y", _windows_shape(h, w, c, k))],
                       dtype, height=h, width=w, window=k)


# SAM's window 14 on a 151 x 149 image of 48 channels (11 x 11 windows, both ragged):
# 1,082,352 input and 1,219,680 window elements, above a threaded split (threads.MIN_ELEMENTS)
SCALE_IMAGE = (151, 149, 48)
SCALE_WINDOW = 14


def _win_part_scale():
    """Scale cases: the image above contiguous and channels-first (a strided view), split
    on the engine's threads along rows of windows."""
    return [scale_case("win_part", [InputSpec("x", SCALE_IMAGE, permute=p)],
                       window=SCALE_WINDOW) for p in (None, (1, 2, 0))]


def _win_unpart_scale():
    """Scale case: the image's windows put back, split along rows of windows."""
    h, w, _ = SCALE_IMAGE
    return [scale_case("win_unpart", [InputSpec("y", _windows_shape(*SCALE_IMAGE,
                                                                    SCALE_WINDOW))],
                       height=h, width=w, window=SCALE_WINDOW)]


BENCH_IMAGE = (64, 64, 768)       # SAM's ViT-B image embedding: 64 x 64 patches of 768
BENCH_WINDOW = 14


def _win_part_bench():
    """Bench case: SAM's image embedding cut into 14 x 14 windows."""
    return [bench_case("win_part", [InputSpec("x", BENCH_IMAGE)], window=BENCH_WINDOW)]


def _win_unpart_bench():
    """Bench case: SAM's windows put back into its image embedding."""
    h, w, _ = BENCH_IMAGE
    return [bench_case("win_unpart", [InputSpec("y", _windows_shape(*BENCH_IMAGE,
                                                                    BENCH_WINDOW))],
                       height=h, width=w, window=BENCH_WINDOW)]


register(OpDef("win_part", params=Params(dict(window=size_param())), infer=_win_part_infer,
               backward=lambda g, out, x, window: (win_unpart(g, x.shape[0], x.shape[1],
                                                              window),),
               kernels={"cpu": cpu_win_part,
                        "cuda": "engine.backends.cuda.win_part:cuda_win_part"},
               build=win_part, torch=_torch_win_part, samples=_win_part_samples,
               scale=_win_part_scale, bench=_win_part_bench, strategy=_win_part_strategy,
               doc="an (H, W, C) image cut into zero-padded (window, window, C) windows "
                   "(SAM, ggml WIN_PART); gradient: win_unpart"))
register(OpDef("win_unpart", params=Params(dict(height=size_param(), width=size_param(),
                                                window=size_param())),
               infer=_win_unpart_infer,
               backward=lambda g, out, y, height, width, window: (win_part(g, window),),
               kernels={"cpu": cpu_win_unpart,
                        "cuda": "engine.backends.cuda.win_part:cuda_win_unpart"},
               build=win_unpart, torch=_torch_win_unpart, samples=_win_unpart_samples,
               scale=_win_unpart_scale, bench=_win_unpart_bench,
               strategy=_win_unpart_strategy,
               doc="windows (npy * npx, window, window, C) put back into a (height, width, "
                   "C) image, padding dropped (ggml WIN_UNPART); gradient: win_part"))


# --- mutants: known bugs of these ops, for gradcheck's self-test (engine.mutation) ------------
from engine import mutation  # noqa: E402  (imported here, with the declarations that use them)
from engine.mutation import Mutant  # noqa: E402
from engine.mutation.patches import backward_replaced  # noqa: E402
from engine.registry import registered  # noqa: E402


def _window_counts(case) -> tuple[int, int]:
    h, w = case.inputs[0].shape[:2]
    window = case.kwargs["window"]
    return -(-h // window), -(-w // window)


def _window_grid(case) -> bool:
    npy, npx = _window_counts(case)
    return npy == npx > 1


def _win_part_column_major(real):
    def backward(g, out, x, window):
        npy, npx = -(-x.shape[0] // window), -(-x.shape[1] // window)
        rest = g.shape[1:]
        swapped = registered.reshape(registered.cont(registered.transpose(
            registered.reshape(g, (npx, npy, *rest)), 0, 1)), g.shape)
        return real(swapped, out, x, window=window)
    return backward


mutation.register(
    Mutant("win_part_grad_windows_column_major", ("win_part",),
           "win_part's backward reads the windows of g in column-major order (px * npy + "
           "py) instead of ggml's row-major py * npx + px: invisible on a single row or "
           "column of windows, wrong on a grid",
           lambda: backward_replaced("win_part", _win_part_column_major),
           where=_window_grid, kind="transposed gradient"),
)
mutation.exempt("win_unpart", "no mutant yet: its gradient is win_part of g (the mutant above "
                              "breaks win_part's backward, not this); covered only by "
                              "--inject scale")
