"""The ggml adapter: loading (and its errors), layouts, and agreement with our engine.

ggml aborts the process on a failed GGML_ASSERT, so no test triggers one in this process:
the abort test runs in a subprocess. Every case run here in-process is one on which ggml
0.20.2 neither aborts nor errs (docs/findings/ggml.md lists those that do).
Its 16-bit cases are test_ggml_16bit.
"""

from __future__ import annotations

import itertools
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from checkkit import ggml as ggml_lib
from checkkit.loading import AdapterError
from engine.registry import OPS, get_op
from engine.samples import InputSpec, Sample
from gradcheck.adapters.engine_adapter import EngineAdapter
from gradcheck.adapters.ggml import GgmlAdapter
from gradcheck.adapters.ggml.coverage import NO_BACKWARD
from gradcheck.adapters.ggml.graph import Context, ne_of, permute_axes
from gradcheck.adapters.ggml.ops import OPS as GGML_OPS
from gradcheck.check import check_sample, loss_weights
from gradcheck.cli import main
from gradcheck.numeric import compare
from gradcheck.runner import run_checks
from tests.gradcheck.ggml_agreement import NEEDS_LIBGGML, assert_agrees, sample

pytestmark = NEEDS_LIBGGML


@pytest.fixture(scope="module")
def adapter():
    return GgmlAdapter()


# --- loading ---------------------------------------------------------------------------------
def test_wheel_libraries_load_and_report_their_version(adapter):
    assert adapter.lib.version == "0.20.2"
    text = adapter.describe()
    assert text.startswith("ggml 0.20.2 (commit ") and adapter.lib.directory in text
    assert adapter.name == "ggml" and adapter.isolated is True


def test_missing_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(AdapterError, match="does not exist") as err:
        GgmlAdapter(str(missing))
    assert str(missing) in str(err.value)


def test_directory_without_the_libraries_names_them(tmp_path):
    (tmp_path / "libggml-base.so").write_bytes(b"")
    with pytest.raises(AdapterError, match="lacks libggml-cpu.so") as err:
        GgmlAdapter(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_a_file_that_is_not_a_library_is_named(tmp_path):
    for name in ("libggml-base.so", "libggml-cpu.so"):
        (tmp_path / name).write_text("not a shared object")
    with pytest.raises(AdapterError, match="cannot load") as err:
        GgmlAdapter(str(tmp_path))
    assert "libggml-base.so" in str(err.value)


def test_an_unrelated_library_lacks_ggml_version(tmp_path):
    import _ctypes
    for name in ("libggml-base.so", "libggml-cpu.so"):
        shutil.copy(_ctypes.__file__, tmp_path / name)
    with pytest.raises(AdapterError, match="lacks the symbol ggml_version") as err:
        GgmlAdapter(str(tmp_path))
    assert str(tmp_path / "libggml-base.so") in str(err.value)


def test_a_missing_symbol_is_named(monkeypatch):
    monkeypatch.setattr(ggml_lib, "_LOADED", {})
    table = {lib: dict(fns) for lib, fns in ggml_lib.SIGNATURES.items()}
    table[ggml_lib.BASE]["ggml_no_such_function"] = (None, [])
    monkeypatch.setattr(ggml_lib, "SIGNATURES", table)
    with pytest.raises(AdapterError, match="lacks the symbol ggml_no_such_function") as err:
        ggml_lib.load()
    assert "libggml-base.so" in str(err.value)


def test_a_wrong_version_is_refused(monkeypatch):
    monkeypatch.setattr(ggml_lib, "_LOADED", {})
    monkeypatch.setattr(ggml_lib, "SUPPORTED", ((0, 19),))
    with pytest.raises(AdapterError, match=r"are ggml 0\.20\.2; .* ggml 0\.19\.x"):
        ggml_lib.load()


@pytest.mark.parametrize("version", ["0.21.0", "1.20.0", "unknown"])
def test_check_version_refuses_other_releases(version):
    with pytest.raises(AdapterError, match="ggml"):
        ggml_lib.check_version(version, "/some/dir")
    ggml_lib.check_version("0.20.7", "/some/dir")


def test_cli_exits_2_on_a_missing_library_directory(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gradcheck.cli", "--engine", "ggml",
                           "--ggml-lib", str(tmp_path / "nowhere"), "--op", "relu",
                           "--no-torch", "--no-progress"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "does not exist" in proc.stderr


def test_adapter_pickles_by_its_library_directory(adapter):
    again = pickle.loads(pickle.dumps(adapter))
    assert again.describe() == adapter.describe() and again.n_threads == adapter.n_threads


# --- layouts ---------------------------------------------------------------------------------
def test_ne_is_the_reversed_numpy_shape():
    assert ne_of(()) == (1, 1, 1, 1)
    assert ne_of((2, 3)) == (3, 2, 1, 1)
    assert ne_of((2, 3, 4, 5)) == (5, 4, 3, 2)


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (2, 3, 4, 5)])
def test_ggml_permute_matches_numpy_transpose(adapter, shape):
    """Every permutation, read back both through its strides and after ggml_cont."""
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    with Context(adapter.lib, 1 << 22) as g:
        leaf = g.from_numpy(x)
        views = {p: g.permuted(leaf, p) for p in itertools.permutations(range(len(shape)))}
        copies = {p: g.cont(v) for p, v in views.items()}
        graph = adapter.lib.ggml_new_graph_custom(g.ctx, 2048, False)
        for t in copies.values():
            adapter.lib.ggml_build_forward_expand(graph, t)
        assert adapter.lib.ggml_graph_compute_with_ctx(g.ctx, graph, 1) == 0
        for p in views:
            want = x.transpose(p)
            np.testing.assert_array_equal(g.to_numpy(views[p], want.shape), want)
            np.testing.assert_array_equal(g.to_numpy(copies[p], want.shape), want)


def test_permute_axes_of_a_transpose():
    assert permute_axes((1, 0)) == (1, 0, 2, 3)
    assert permute_axes((0, 2, 1)) == (1, 0, 2, 3)
    assert permute_axes((2, 0, 1)) == (2, 0, 1, 3)


# --- the op table ----------------------------------------------------------------------------
def test_table_names_registry_ops():
    assert set(GGML_OPS) <= set(OPS) and set(NO_BACKWARD) <= set(OPS)
    assert not set(GGML_OPS) & set(NO_BACKWARD)


@pytest.mark.parametrize("case, reason", [
    (Sample.make("relu", [InputSpec("x", (3, 4))], "f64"), "f32"),
    (Sample.make("tanh", [InputSpec("x", (3, 4))]), "no backward for ggml_tanh"),
    (Sample.make("mse_loss", [InputSpec("a", (3,)), InputSpec("b", (3,))]), "no op"),
    (Sample.make("sub", [InputSpec("a", (1,)), InputSpec("b", (2, 3))]),
     "broadcasts only its second operand"),
    (Sample.make("sum", [InputSpec("x", (3, 4))], axis=0, keepdims=False), "axes [0]"),
    (Sample.make("matmul", [InputSpec("a", (2, 1, 3, 4)), InputSpec("b", (5, 4, 2))]),
     "batch of its first operand"),
    (Sample.make("exp", [InputSpec("x", (3, 4), expand=(1,))]), "no stride-0 views"),
    (Sample.make("exp", [InputSpec("x", (4, 4), slice=((1, 5, 1), (0, 8, 2)))]),
     "unit element stride"),
])
def test_cases_ggml_cannot_express_say_why(adapter, case, reason):
    assert reason in adapter.unsupported(case)


# --- agreement with our engine ---------------------------------------------------------------
AGREEING = [
    ("relu", "relu(type=f32,x=[3,4,5]perm[2,0,1])"),            # cont before ggml_relu
    ("sgn", "sgn(type=f32,x=[3,4])"),                            # no gradient: zeros
    ("silu", "silu(type=f32,x=[2,3,4,5])"),
    ("scale", "scale(type=f32,x=[3,4,5]perm[2,0,1],scale=-1.5)"),
    ("add", "add(type=f32,a=[2,3,4],b=[4])"),                    # b broadcast
    ("mul", "mul(type=f32,a=[1],b=[2,4])"),                      # a broadcast: swapped
    ("div", "div(type=f32,a=[3,4],b=[3,4])"),
    ("sum", "sum(type=f32,x=[2,3,4,5]perm[0,2,1,3],axis=-1,keepdims=False)"),
    ("mean", "mean(type=f32,x=[3,4,5]perm[1,2,0],axis=None,keepdims=False)"),
    ("sum_rows", "sum_rows(type=f32,x=[2,3,4,10]perm[1,2,0,3])"),
    ("repeat", "repeat(type=f32,x=[1,2,3,4],shape=[2,4,6,8])"),
    ("get_rows", "get_rows(type=f32,table=[5,4],idx=[2,3])"),
    ("matmul", "matmul(type=f32,a=[2,3,4],b=[2,4,5]perm[0,2,1])"),  # permuted input
    ("matmul", "matmul(type=f32,a=[3,4],b=[2,4,5])"),            # a's batch broadcasts
    ("softmax", "softmax(type=f32,x=[3,4,5]perm[2,0,1],scale=1)"),
    ("softmax", "softmax(type=f32,x=[4,6],scale=-0.5)"),
    ("cross_entropy_loss", "cross_entropy_loss(type=f32,logits=[2,3,4],labels=[2,3,4])"),
    ("rms_norm", "rms_norm(type=f32,x=[3,4,5]perm[2,0,1],eps=1e-06)"),
    ("im2col", "im2col(type=f32,x=[2,2,7,6],dilation=2,dtype=None,kh=3,kw=3,"
               "padding=[1,2],stride=[1,2])"),
    ("conv_2d", "conv_2d(type=f32,x=[1,1,5,5],w=[1,1,3,3],dilation=1,padding=0,stride=1)"),
    ("pool_2d", "pool_2d(type=f32,x=[2,3,8,8],kernel=3,mode=max,padding=1,stride=2)"),
    ("pool_2d", "pool_2d(type=f32,x=[3,2,5,5],kernel=[2,3],mode=avg,padding=[1,0],"
                "stride=[1,2])"),
    ("permute", "permute(type=f32,x=[2,3,4,5],axes=[3,2,1,0])"),   # a strided output
    ("acc", "acc(type=f32,a=[4,5,3]perm[2,0,1],b=[2,3,2],offset=[1,2,0])"),
    ("block", "block(type=f32,x=[2,3,4,5],offset=[1,0,1,2],shape=[1,3,2,3])"),
    # sliced inputs: ggml_view_4d views of larger leaves, at an offset, rows strided
    ("exp", "exp(type=f32,x=[3,4]slice[1:4,2:6])"),
    ("add", "add(type=f32,a=[2,3,4]slice[1:3,0:6:2,1:5],b=[3,4]slice[1:4,2:6])"),
    ("get_rows", "get_rows(type=f32,table=[5,6]slice[1:6,1:7],idx=[7])"),
    ("softmax", "softmax(type=f32,x=[2,3,5]slice[0:2,1:4,1:6],scale=1)"),
    ("sum", "sum(type=f32,x=[3,4,5]slice[1:4,0:8:2,1:6],axis=None,keepdims=False)"),
]


# generated-style cases the registry samples lack: negative axes, a non-default transpose
GENERATED = [
    Sample.make("permute", [InputSpec("x", (4, 3, 4, 2))], axes=(-1, 0, 1, 2)),
    Sample.make("transpose", [InputSpec("x", (2, 3, 4), permute=(2, 0, 1))], axis1=0,
                axis2=-1),
]


@pytest.mark.parametrize("op, text", AGREEING, ids=[t for _, t in AGREEING])
def test_ggml_agrees_with_our_engine(adapter, op, text):
    assert_agrees(adapter, sample(op, text))


@pytest.mark.parametrize("case", GENERATED, ids=str)
def test_ggml_agrees_on_generated_cases(adapter, case):
    assert_agrees(adapter, case)


# --- declined gradients: soft_max's mask -----------------------------------------------------
def test_softmax_with_a_mask_declines_the_mask_only(adapter):
    case = sample("softmax", "softmax(type=f32,x=[2,3,4],mask=[3,4],scale=0.1)")
    assert adapter.unsupported(case) is None
    assert list(adapter.declined(case)) == ["mask"]
    assert "backward pass for softmax mask not implemented" in adapter.declined(case)["mask"]
    assert adapter.declined(sample("softmax", "softmax(type=f32,x=[5],scale=1)")) == {}
    arrays = case.generate_inputs()
    got = adapter.vjp(case, arrays, loss_weights((2, 3, 4), case.seed()))
    assert got.grads[1] is None and got.grads[0].shape == (2, 3, 4)


def test_softmax_with_a_mask_passes_on_x_and_names_the_declined_mask():
    adapter = GgmlAdapter()
    cases = [s for s in get_op("softmax").samples() if s.dtype == "f32" and len(s.inputs) == 2
             and adapter.unsupported(s) is None]      # not an x that ggml cannot view
    assert len(cases) >= 8          # masks broadcast, transposed, of large negatives
    results = run_checks(cases, engine=adapter)
    for r in results:
        assert r.status == "pass", (r.name, r.message)
        assert r.metrics["declined"].startswith("mask: ggml has no backward for soft_max's")
        assert r.message.startswith("declined (not checked): mask: ")


def test_a_case_checking_only_the_mask_is_unsupported():
    case = Sample.make("softmax", [InputSpec("x", (3, 5), grad=False),
                                   InputSpec("mask", (3, 5))], scale=1.0)
    r = check_sample(case, adapter=GgmlAdapter(), use_torch=False)
    assert r.status == "unsupported" and "every checked input: mask: " in r.message


# --- softmax's ALiBi and sinks ---------------------------------------------------------------
def _alibi_sink_cases():
    """The registry's f32 softmax cases with ALiBi or sinks (a mask of one zero: sinks
    alone, which ggml gets as a NULL mask)."""
    return [s for s in get_op("softmax").samples() if s.dtype == "f32"
            and (s.kwargs.get("max_bias") or len(s.inputs) == 3)]


@pytest.mark.parametrize("case", _alibi_sink_cases(), ids=str)
def test_softmax_forward_with_alibi_and_sinks_agrees_with_ggml(adapter, case):
    """ggml_soft_max_ext(.., max_bias) and ggml_soft_max_add_sinks run forward (the backward
    is what they lack): our slopes per head and sinks are ggml's."""
    arrays = case.generate_inputs()
    ours = EngineAdapter("cpu").forward(case, arrays)
    theirs = adapter.forward_only(case, arrays, ours.shape)
    assert compare(theirs, ours, "f32").ok


def test_softmax_with_alibi_is_unsupported_saying_why(adapter):
    case = sample("softmax", "softmax(type=f32,x=[3,2,5],mask=[2,5],max_bias=8,scale=1)")
    assert "GGML_ASSERT(max_bias == 0.0f)" in adapter.unsupported(case)


def test_softmax_with_frozen_sinks_agrees_on_x(adapter):
    """Sinks that are no param: ggml's gradient of x (soft_max_ext_back of the output, which
    holds with sinks too) is ours; the mask is declined as ever."""
    case = Sample.make("softmax", [InputSpec("x", (3, 2, 5), low=-3.0, high=3.0),
                                   InputSpec("mask", (2, 5), "uniform", -5.0, 0.0),
                                   InputSpec("sinks", (3,), "uniform", -2.0, 2.0, grad=False)],
                       scale=0.5)
    assert list(adapter.declined(case)) == ["mask"]
    arrays = case.generate_inputs()
    weights = loss_weights((3, 2, 5), case.seed())
    ours = EngineAdapter("cpu").vjp(case, arrays, weights)
    theirs = adapter.vjp(case, arrays, weights)
    assert compare(theirs.output, ours.output, "f32").ok
    assert compare(theirs.grads[0], ours.grads[0], "f32").ok
    assert theirs.grads[1:] == [None, None]


SEGFAULTING = """
from engine.registry import get_op
from gradcheck.adapters.ggml import GgmlAdapter
import numpy as np
case = next(s for s in get_op("softmax").samples()
            if str(s) == "softmax(type=f32,x=[3,2,5],mask=[2,5],sinks=[3],scale=1)")
GgmlAdapter().vjp(case, case.generate_inputs(), np.ones((3, 2, 5)))
"""


def test_ggml_segfaults_on_trainable_sinks():
    """ggml 0.20.2's SOFT_MAX backward writes no gradient for src[2], the sinks, and its
    closing check `ggml_are_same_shape(src2, cgraph->grads[isrc2])` (ggml.c:7101) reads
    the missing gradient: a NULL dereference in ggml_build_backward_expand (docs/findings/ggml.md's
    finding; such cases are `crash` rows)."""
    proc = subprocess.run([sys.executable, "-c", SEGFAULTING], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -11, (proc.returncode, proc.stderr[-500:])


# --- generated cases and repro commands ------------------------------------------------------
# docs/findings/ggml.md's strided max-pool case: ggml's pool_2d reads and writes its input as if
# contiguous (a segfault, or wrong and non-deterministic values)
STRIDED_POOL = Sample.make("pool_2d", [InputSpec("x", (1, 2, 4, 4), "distinct",
                                                 permute=(0, 2, 1, 3))],
                           kernel=(3, 1), mode="max", padding=(1, 0), stride=(3, 1))


def test_engine_ggml_repro_of_a_case_outside_the_registry(capsys):
    assert main(["--engine", "ggml", "--repro", repr(STRIDED_POOL), "--no-torch",
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert str(STRIDED_POOL) in out and ("CRASH" in out or "FAIL" in out)
    assert "gradcheck --engine ggml --repro \"Sample(op='pool_2d'" in out


def test_generated_ggml_cases_are_shrunk_and_reproducible(tmp_path):
    """pool_2d's strategy draws permuted inputs, which ggml's pool_2d gets wrong or crashes
    on: the run survives, the f64 draws are assumed away, the shrunk case's repro names
    ggml."""
    assert main(["--engine", "ggml", "--op", "pool_2d", "--random", "15", "--seed", "0",
                 "-k", "no-registry-sample", "--no-torch", "--no-progress",
                 "--format", "json", "--output", str(tmp_path / "r.json")]) == 1
    from reports import load_json
    doc = load_json((tmp_path / "r.json").read_text())
    rows = doc["results"]
    (minimal,) = [r for r in rows if r.get("generated") == "minimal"]
    # ggml's pool_2d bugs: a permuted input (f32), or max pooling's backward in f16
    assert minimal["status"] in ("fail", "crash") and (
        "perm[" in minimal["case"] or "type=f16" in minimal["case"]), minimal["case"]
    assert minimal["repro"].startswith("gradcheck --engine ggml --repro \"Sample(")
    assert rows[-1]["status"] == "unsupported" and "ggml" in rows[-1]["message"]


# --- aborts ----------------------------------------------------------------------------------
ABORTING = """
from engine.samples import InputSpec, Sample
from gradcheck.adapters.ggml import GgmlAdapter
import numpy as np
case = Sample.make("sub", [InputSpec("a", (2, 3, 4)), InputSpec("b", (4,))])
GgmlAdapter().vjp(case, case.generate_inputs(), np.ones((2, 3, 4)))
"""


def test_a_ggml_abort_ends_its_process_at_once():
    """sub with a broadcast b: ggml's backward gives b a gradient of a's shape, and
    ggml_build_backward_expand aborts. Without gdb's backtrace (GGML_NO_BACKTRACE, set by
    the adapter) the process ends quickly."""
    env = {k: v for k, v in os.environ.items() if k != "GGML_NO_BACKTRACE"}
    proc = subprocess.run([sys.executable, "-c", ABORTING], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode != 0
    assert "GGML_ASSERT" in proc.stderr and "ggml_are_same_shape(src1" in proc.stderr
