"""Our own engine as an adapter: one case's forward and vector-Jacobian product on a backend.

The case is built on param-flagged leaves, its output weighted and summed into a scalar loss
(loss = sum(output * weights)), and backprop gives the gradient of that loss with respect
to each checked leaf, i.e. the vector-Jacobian product J^T weights. The same weighted graph,
with every float promoted to float64 and inputs instead of params, is gradcheck's float64
reference for a registry case: the loss whose numerical gradients backprop is judged
against (see gradcheck.reference).

The engine under test runs on poisoned memory (engine.backends.cpu.paths.poisoned and
poison_outputs): its arenas and output buffers start as NaN, so that a kernel that skips
part of its output shows it.

Known bugs injected with `--inject` patch our registry's backward rules and kernels, so they
belong to this adapter: `EngineAdapter(backend, inject="scale:1.01")`.

Second order and forward mode (gradcheck.derivatives) come from differentiating the
backward graph again, which the engine does as it does the forward one (`second_gradients`):
the Hessian-vector product is the gradient of <grad loss, v> with respect to the inputs
(reverse over reverse), and the Jacobian-vector product J t the gradient of <grad loss, t>
with respect to the loss weights w (J^T w is linear in w: its gradient along w is J t, the
transpose of the backward). The engine has no forward mode of its own; the JVP so made
checks each op's backward rule a second way, through the backward rules of the ops its
backward is built of. An op whose backward is a dedicated backward op without a backward
rule of its own (softmax_back, norm_back, the activations' `<name>_back`, ...) has neither:
`Unsupported`, naming the op.
"""

from __future__ import annotations

import contextlib

import numpy as np

import engine
from engine import ops
from engine.backends.cpu import jit, paths, threads
from engine.errors import EngineError
from engine.registry import OPS
from engine.tensor import Flag, as_dtype, constant, is_float
from gradcheck.adapters import AdapterSpec
from gradcheck.adapters.base import JVP, VJP, Unsupported, cotangent_axes, sliced_weights
from gradcheck.backprop import same_bits
from gradcheck.injection import injected, injected_factor, parse
from gradcheck.mutants import CONTROL, MUTANTS

# The scale tier's thread settings of our CPU backend (gradcheck.scale): a plan's kernels
# split into 1, 2, 3 and 7 chunks on the engine's threads, then NUMBA_PARALLEL: numba's
# parallel compilations of the prange kernels (GRADVERIFY_PARALLEL=1's code, off by
# default) on all of numba's threads, at one chunk.
NUMBA_PARALLEL = "numba-parallel"
ENGINE_THREADS = (1, 2, 3, 7, NUMBA_PARALLEL)
PARALLEL_RUNS = 3


def same_answer(a: VJP, b: VJP) -> bool:
    """Whether two VJPs hold the same bits, output and gradients, by the rule the scale
    tier's thread check judges them with (gradcheck.backprop.same_bits)."""
    pairs = [(a.output, b.output)] + list(zip(a.grads, b.grads, strict=True))
    return all(same_bits(x, y) for x, y in pairs)


@contextlib.contextmanager
def engine_thread_count(n: int):
    """Our CPU backend's kernels bound in the block split into `n` chunks (restored
    after)."""
    before = threads.get_num_threads()
    threads.set_num_threads(n)
    try:
        yield
    finally:
        threads.set_num_threads(before)


def thread_setting(setting):
    """The context of one of ENGINE_THREADS: `n` chunks, or numba's parallel compilations
    at one chunk."""
    if setting == NUMBA_PARALLEL:
        stack = contextlib.ExitStack()
        stack.enter_context(engine_thread_count(1))
        stack.enter_context(jit.parallel_compilations())
        return stack
    return engine_thread_count(setting)


def case_leaves(case, arrays, as_params: bool) -> list:
    """The leaf tensors of `case` holding `arrays` (the values the op sees), in the case's
    dtypes: params where checked (as_params), inputs otherwise."""
    leaves = []
    for spec, a in zip(case.inputs, case.leaf_arrays(arrays), strict=True):
        if is_float(a.dtype):
            a = a.astype(as_dtype(spec.dtype or case.dtype))
        checked = spec.grad and is_float(a.dtype)
        t = (engine.param if as_params and checked else engine.input_tensor)(
            a.shape, a.dtype, name=spec.name)
        t.set(a)
        leaves.append(t)
    return leaves


def weighted_graph(case, arrays, as_params: bool, cotangent: str = "contiguous"):
    """(leaves, output, weights tensor, loss) of `case` built on `arrays` (the values the op
    sees): leaves are params where checked (as_params) and inputs otherwise; loss =
    sum(output * weights), with the weights tensor still to be set (`set_weights`). Loss and
    weights are None when the output is not a float.

    cotangent (engine.samples): "permuted" reads the output through cont(permute(out,
    reversed axes)) with the weights in that order, so backprop hands the op a permuted
    view of the gradient; "expanded" sums the output over its last axis first, with weights
    of shape (..., 1), so the op gets a stride-0 broadcast of them ("expanded_first": over
    the first axis, weights of shape (1, ...)); "sliced" adds the output
    into the middle of a zero buffer one larger on each side (acc), weighted by
    sliced_weights, so the op gets an offset view of the larger gradient."""
    leaves = case_leaves(case, arrays, as_params)
    out = case.build(*leaves)
    if not is_float(out.dtype):
        return leaves, out, None, None
    out.set_output()
    read = out
    if cotangent == "permuted" and len(out.shape) >= 2:
        read = ops.cont(ops.permute(out, cotangent_axes(len(out.shape))))
    elif cotangent == "expanded" and len(out.shape) >= 1:
        read = ops.sum(out, axis=-1, keepdims=True)
    elif cotangent == "expanded_first" and len(out.shape) >= 1:
        read = ops.sum(out, axis=0, keepdims=True)
    elif cotangent == "sliced" and len(out.shape) >= 1:
        big = tuple(d + 2 for d in out.shape)
        zeros = constant(np.zeros(big, out.dtype), out.dtype, name="sliced.zeros")
        read = ops.acc(zeros, out, offset=(1,) * len(out.shape))
    w = engine.input_tensor(read.shape, out.dtype, name="loss_weights")
    loss = ops.sum(ops.mul(read, w)).set_loss()
    return leaves, out, w, loss


def poison_outputs(graph) -> None:
    """Fill the persistent buffers that the graph's kernels write (its float outputs and
    gradients) with NaN before it runs, as paths.poisoned() fills its arenas: an output
    element a kernel leaves unwritten stays NaN instead of a lucky zero."""
    for t in graph.nodes:
        if (not t.is_leaf and t.persistent and t.shares is None and t.view_of is None
                and is_float(t.dtype) and OPS[t.op].kind not in ("view", "update")):
            t.buffer().fill(np.nan)


def set_weights(w, weights, cotangent: str = "contiguous") -> None:
    """Set the weights tensor of weighted_graph from the output-shaped `weights`."""
    weights = np.asarray(weights)
    if cotangent == "permuted" and weights.ndim >= 2:
        weights = weights.transpose(cotangent_axes(weights.ndim))
    elif cotangent == "expanded" and weights.ndim >= 1:
        weights = weights[..., :1]
    elif cotangent == "expanded_first" and weights.ndim >= 1:
        weights = weights[:1]
    elif cotangent == "sliced" and weights.ndim >= 1:
        weights = sliced_weights(weights)
    w.set(np.array(weights, dtype=w.dtype))


class EngineAdapter:
    """Our engine on one backend; `inject` is an injection spec of gradcheck.injection (a
    known bug put into the backward rules of the ops the case is made of, or a named
    mutant)."""

    name = "engine"
    isolated = False
    leaf_gradients = True      # it builds the input views (gradcheck.adapters.base)

    def __init__(self, backend: str = "cpu", inject: str | None = None):
        if inject:
            parse(inject)           # a bad mutation raises ValueError now, not per case
        self.backend = backend
        self.inject = inject
        self._kept = None          # the last case's second-order graph (_second)
        self._variants = {}        # (backend, inject) -> adapter, in a worker (answered)

    @property
    def thread_counts(self) -> tuple:
        """The scale tier's thread settings: ENGINE_THREADS on the CPU, none elsewhere."""
        return ENGINE_THREADS if self.backend == "cpu" else ()

    def with_threads(self, setting) -> _AtSetting:
        """This engine computing at thread setting `setting` (one of thread_counts)."""
        return _AtSetting(self, setting)

    def vjp_at_threads(self, setting, case, arrays, weights) -> VJP:
        """vjp at thread setting `setting` (what an isolated worker runs for with_threads).
        NUMBA_PARALLEL runs PARALLEL_RUNS times, and answers the first run whose bits
        differ from the first's, if any: a race between prange iterations shows only when
        numba's threads happen to overlap (not while its pool starts, nor while another
        process holds a core)."""
        with thread_setting(setting):
            if setting != NUMBA_PARALLEL:
                return self.vjp(case, arrays, weights)
            first, *others = self.vjp_runs(case, arrays, weights, PARALLEL_RUNS)
        return next((v for v in others if not same_answer(v, first)), first)

    def answered(self, backend: str, inject: str | None, mutant: str | None, method: str,
                 args: tuple):
        """What a worker process of our engine runs for each call
        (gradcheck.engine_under_test.IsolatedEngine): (`method(*args)` of our engine on
        `backend` with the mutation `inject` and the self-test's mutant called `mutant`
        in place (gradcheck.mutants, the control included), the fast paths it took as
        {path: count}: engine.backends.cpu.paths.recording, for the caller to count as
        its own). One worker serves every backend, mutation and mutant: the variant's
        adapter is kept (forward mode runs several tangents on one kept graph)."""
        adapter = self._variants.get((backend, inject))
        if adapter is None:
            adapter = self._variants[backend, inject] = EngineAdapter(backend, inject)
        with mutant_in_place(mutant), paths.recording() as taken:
            answer = getattr(adapter, method)(*args)
        return answer, dict(taken)

    @property
    def spec(self):
        options = {"backend": self.backend} | ({"inject": self.inject} if self.inject else {})
        return AdapterSpec.of("engine", options)

    def describe(self) -> str:
        return engine.describe(self.backend)

    def unsupported(self, case) -> str | None:
        if not getattr(case, "builds_engine_graph", True):
            return "the case is not built from engine ops"
        return None

    def on_cpu(self) -> EngineAdapter:
        """The same engine (and injected bug) on the CPU backend: what the `vs_cpu` column compares
        this backend's output and gradients with."""
        return EngineAdapter("cpu", self.inject)

    def forward(self, case, arrays) -> np.ndarray:
        """The case's output alone, in its dtype on this backend, with no backward pass: how
        a dedicated backward op, which has no gradient of its own, is run
        (gradcheck.backward_ops). A kernel mutant of `inject` is in place; a factor
        mutation (`scale:F`) multiplies a backward op's output, a gradient, by F, as it
        multiplies the gradients of the backward rules (so that it reaches every row)."""
        _, out, _, _ = weighted_graph(case, arrays, as_params=False)
        graph = engine.Graph([out], name=str(case))
        with injected(self.inject, {t.op for t in graph.nodes if not t.is_leaf}):
            graph.compute(self.backend)
        result = out.numpy()
        factor = injected_factor(self.inject)
        if factor is not None and OPS[out.op].kind == "backward":
            result = np.asarray(np.asarray(result, np.float64) * factor, result.dtype)
        return result

    def vjp(self, case, arrays, weights) -> VJP:
        """Backprop of sum(output * weights) in the case's dtype, on this backend, the
        gradient reaching the op in the case's cotangent layout."""
        return self.vjp_runs(case, arrays, weights, 1)[0]

    def vjp_runs(self, case, arrays, weights, runs: int) -> list[VJP]:
        """`runs` VJPs of the case (see vjp) from one graph and plan, its buffers poisoned
        again before each run: gradcheck.backprop.engine_vjp's determinism check, without
        building and planning the case a second time."""
        cotangent = getattr(case, "cotangent", "contiguous")
        leaves, out, w, loss = weighted_graph(case, arrays, as_params=True,
                                              cotangent=cotangent)
        if loss is None:
            raise TypeError(f"{case}: the output is {out.dtype}, not a float: no gradient")
        set_weights(w, weights, cotangent)
        case_ops = {t.op for t in engine.Graph([out]).nodes if not t.is_leaf}
        graph = engine.Graph([loss], name=str(case))
        # a mutation may patch backward rules (used while building) or kernels (taken when
        # the plan is made): both happen inside the block
        answers = []
        with injected(self.inject, case_ops), paths.poisoned():
            grads = graph.build_backward(loss)
            for _ in range(runs):
                poison_outputs(graph)
                graph.compute(self.backend)
                leaf_grads = [np.array(grads[t].numpy()) if t in grads else
                              (np.zeros(t.shape, t.dtype) if t.is_param else None)
                              for t in leaves]
                views = [None if g is None else spec.from_leaf(g)
                         for spec, g in zip(case.inputs, leaf_grads, strict=True)]
                answers.append(VJP(np.array(out.numpy()), views))
        return answers

    hvp_methods = ("rev-rev",)

    def hvp(self, case, arrays, weights, direction, method: str = "rev-rev") -> VJP:
        """The output and the gradient of <grad loss, direction> with respect to each checked
        input (reverse over reverse), in the case's dtype on this backend."""
        if method != "rev-rev":
            raise ValueError(f"our engine's second order is rev-rev, not {method!r}")
        leaves, out, hv = self._second(case, arrays, weights, direction, weights_param=False)
        return VJP(out, [None if g is None else spec.from_leaf(g)
                         for spec, g in zip(case.inputs, (hv.get(t) for t in leaves),
                                            strict=True)])

    def jvp(self, case, arrays, tangents) -> JVP:
        """The output and J t, the gradient of <grad loss, t> with respect to the loss
        weights (the transpose of the backward; see the module doc), in the case's dtype."""
        # weights of one: any would do, J^T w being linear in w
        _, out, hv = self._second(case, arrays, None, tangents, weights_param=True)
        return JVP(out, hv["weights"])

    def _second(self, case, arrays, weights, direction, weights_param: bool):
        """(leaves, output, {leaf or "weights": gradient of <grad loss, direction>}) of
        `case`: its backward graph differentiated again (second_gradients). The graph of
        the last case is kept and run again for the same case with new values (forward
        mode asks for several tangents: building and planning is most of the cost)."""
        given = tuple(d is not None for d in direction)
        key = (repr(case), str(case), weights_param, given)
        kept = self._kept if self._kept is not None and self._kept[0] == key else None
        if kept is None:
            leaves, out, w, loss = weighted_graph(case, arrays, as_params=True)
            if loss is None:
                raise TypeError(f"{case}: the output is {out.dtype}, not a float: no "
                                "gradient")
            if weights_param:
                w.set_flag(Flag.PARAM)
            zeros = {t: np.zeros(t.shape, t.dtype)
                     for t, d in zip(leaves, direction, strict=True)
                     if d is not None and t.is_param}
            case_ops = {t.op for t in engine.Graph([out]).nodes if not t.is_leaf}
            with injected(self.inject, case_ops):
                graph, grads, dir_tensors = second_gradients(loss, zeros, str(case))
            kept = self._kept = (key, leaves, out, w, graph, grads, dir_tensors, case_ops)
        else:
            for t, a in zip(kept[1], case.leaf_arrays(arrays), strict=True):
                t.set(np.asarray(a, t.dtype))
        _, leaves, out, w, graph, grads, dir_tensors, case_ops = kept
        set_weights(w, np.ones(w.shape) if weights is None else weights)
        for spec, t, d in zip(case.inputs, leaves, direction, strict=True):
            if t in dir_tensors:
                dir_tensors[t].set(np.asarray(spec.to_leaf(np.asarray(d)), t.dtype))
        with injected(self.inject, case_ops), paths.poisoned():
            poison_outputs(graph)
            graph.compute(self.backend)
            found = {t: np.array(g.numpy()) for t, g in grads.items()}
        result = {t: found.get(t, np.zeros(t.shape, t.dtype)) for t in leaves if t.is_param}
        if weights_param:
            result["weights"] = found.get(w, np.zeros(w.shape, w.dtype))
        return leaves, np.array(out.numpy()), result


def mutant_in_place(name: str | None):
    """The context that puts the self-test's mutant called `name` in place (the control,
    gradcheck.mutants.CONTROL, or one of MUTANTS; None: nothing). ValueError for a name
    of neither: a mutant that is not registered cannot be found in a worker process."""
    if name is None:
        return contextlib.nullcontext()
    mutant = CONTROL if name == CONTROL.name else MUTANTS.get(name)
    if mutant is None:
        raise ValueError(f"no registered mutant is called {name!r}")
    return mutant.patch()


class _AtSetting:
    """Our engine at one thread setting: its vjp runs inside that setting's context."""

    def __init__(self, adapter: EngineAdapter, setting):
        self.adapter, self.setting = adapter, setting

    def vjp(self, case, arrays, weights) -> VJP:
        return self.adapter.vjp_at_threads(self.setting, case, arrays, weights)


def second_order_blocker(case) -> str | None:
    """Why our engine cannot differentiate the backward graph of `case` (the dedicated
    backward op without a backward rule on the way, as second_gradients says), or None
    when it can. Builds the graphs, computes nothing: `gradcheck --list`'s order 2
    column."""
    arrays = case.generate_inputs()
    leaves, _, w, loss = weighted_graph(case, arrays, as_params=True)
    if loss is None:
        return "the output is not a float"
    dirs = {t: np.zeros(t.shape, t.dtype) for t in leaves if t.is_param}
    try:
        second_gradients(loss, dirs, str(case))
    except Unsupported as exc:
        return str(exc)
    return None


def second_gradients(loss, directions: dict, name: str):
    """(graph, gradients, direction tensors) of s = sum over params p of <d loss / d p,
    directions[p]>: the backward graph of `loss` built, s made of it (each direction an
    input tensor, set to directions[p] and kept by param, to be set again), and s's own
    backward built on top (gradients keyed by param, as Graph.build_backward's; none where
    s depends on no param, e.g. a linear op's Hessian). The graph computes the loss too.
    Unsupported where an op on the way has no backward of its own (a dedicated backward
    op's)."""
    first = engine.Graph([loss], name=f"{name}.first")
    grads = first.build_backward(loss)        # seeds the loss gradient with 1
    terms, tensors = [], {}
    for p, d in directions.items():
        if p in grads:
            v = tensors[p] = engine.input_tensor(p.shape, p.dtype, name=f"{p.name}.direction")
            v.set(d)
            term = ops.sum(ops.mul(grads[p], v))
            # inputs of several dtypes (a float16 operand of a float32 matmul): the terms
            # add up in the loss's
            terms.append(term if term.dtype == loss.dtype else ops.cast(term, loss.dtype))
    if not terms:
        raise Unsupported("the loss does not depend on the inputs given a direction")
    s = terms[0]
    for t in terms[1:]:
        s = ops.add(s, t)
    graph = engine.Graph([s, loss], name=f"{name}.second")     # loss: the output too
    if not graph.params():      # the gradient does not depend on any param: s is constant
        return graph, {}, tensors
    try:
        second = graph.build_backward(s)
    except EngineError as exc:
        raise Unsupported(f"our engine cannot differentiate this backward: {exc}") from None
    return graph, second, tensors
