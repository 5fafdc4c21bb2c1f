#!/usr/bin/env bash
# On a GPU machine with no network: install Porter beside the machine's own
# PyTorch and JAX (CUDA) from the wheels benchmarks/gpu/prepare.sh downloaded,
# then time one Wan 1.3B transformer step, ported vs PyTorch eager.
#
#   bash benchmarks/gpu/run.sh [KEY=VALUE ...]     # overrides go to porter bench
#
# Environment (all optional):
#   RECIPE       recipe to bench (default recipes/bench/wan-1.3b-gpu.yaml)
#   STEPS        timed steps per side (default 3)
#   WHEELS       the carried wheels (default benchmarks/gpu/wheels)
#   BASE_PYTHON  the machine's Python with torch and jax (default python3)
#   VENV         where to make the virtual environment (default /tmp/porter-gpu-venv)
#   INSTALL      venv (default; falls back to target on failure) or target
#   OUT          where results go (the device tool sets it; default outputs/gpu-bench)
#   XLA_PYTHON_CLIENT_PREALLOCATE  default false: JAX takes GPU memory as it needs
#                it, leaving room for the PyTorch reference in the same process
#   ALLOW_CPU    1: skip the checks that JAX and the PyTorch reference run on the GPU
#   PARITY       the recipe of the whole-run parity check (default recipes/wan-tiny.yaml;
#                empty: skip it)
#   ATTENTION    1: also time attention alone at Wan's shapes, each backend against
#                float32 (benchmarks/gpu/attention.py; ATTENTION_ARGS go to it)
#   VIDEO        1: the whole video instead of the step (benchmarks/gpu/whole_video.py,
#                VIDEO_ARGS go to it; carry benchmarks/gpu/peers for FastVideo and sglang)
#   ALSO         more benches of the same recipe after the first, one per ';'-separated
#                set of arguments, e.g. 'quantize.format=fp8;quantize.format=int8
#                --torch-compile' (each one's result is a line of variants.jsonl)
# Results: $OUT/bench.json (porter bench --json), bench.log (its stderr),
# summary.txt (readable, with MFU), env.txt (versions, devices), nvidia-smi.txt,
# parity.json and parity.log (benchmarks/gpu/parity.py), attention.json (ATTENTION=1),
# variants.jsonl (ALSO; their logs are appended to bench.log, their summaries to
# summary.txt).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
recipe="${RECIPE:-recipes/bench/wan-1.3b-gpu.yaml}"
steps="${STEPS:-3}"
wheels="${WHEELS:-$here/wheels}"
base_python="${BASE_PYTHON:-python3}"
venv="${VENV:-/tmp/porter-gpu-venv}"
out="${OUT:-$repo/outputs/gpu-bench}"

say() { echo "run.sh: $*" >&2; }
fail() { echo "run.sh: error: $*" >&2; exit 1; }

cd "$repo"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
[[ -f "$recipe" ]] || fail "no recipe $recipe (run from a copy of the Porter repository)"

# Offline and isolated from any pip configuration of the machine: only the
# carried wheels and what is already installed count.
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
       PIP_NO_CACHE_DIR=1 PIP_NO_INPUT=1
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_REQUIRE_VIRTUALENV PYTHONPATH \
      || true
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"

# ------------------------------------------------------------------ the machine
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm)"
  echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
  # the device copy has no .git: a fingerprint of the code that ran instead
  echo "sha256 of porter/ plugins/ recipes/ pyproject.toml: $(find porter plugins recipes \
       pyproject.toml -type f \( -name '*.py' -o -name '*.yaml' -o -name '*.toml' \) \
       -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16)"
} | tee "$out/env.txt" >&2
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit \
             --format=csv 2>&1 | tee -a "$out/env.txt" >&2 || true
else
  say "nvidia-smi not found: no NVIDIA GPU here (the bench still runs, on what JAX finds)"
  echo "nvidia-smi: not found" > "$out/nvidia-smi.txt"
fi

command -v "$base_python" >/dev/null 2>&1 || fail "no $base_python (set BASE_PYTHON)"
"$base_python" - <<'EOF' || fail "$base_python cannot import torch and jax: this script \
reuses the machine's PyTorch and JAX (set BASE_PYTHON to the Python that has them)"
import sys
import jax, torch
print(f"base python: {sys.executable} {sys.version.split()[0]}; torch {torch.__version__}, "
      f"jax {jax.__version__}", file=sys.stderr)
EOF

# ------------------------------------------------------------------ the wheels
shopt -s nullglob
carried=("$wheels"/*.whl)
shopt -u nullglob
(( ${#carried[@]} )) || fail "no wheels in $wheels: run 'bash benchmarks/gpu/prepare.sh' \
where PyPI is reachable, and carry benchmarks/gpu/wheels"
py_tag=$("$base_python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
for whl in "${carried[@]}"; do
  name=$(basename "$whl")
  if [[ "$name" == *-cp3* && "$name" != *"-$py_tag-"* && "$name" != *-abi3-* ]]; then
    fail "$name is not for $py_tag: run prepare.sh with PYTHON_VERSION=${py_tag:2:1}.${py_tag:3}"
  fi
done

# ------------------------------------------------------------------ install
# First choice: a virtual environment that reuses the machine's packages, and
# pip's resolver against them: a carried wheel is used only where the machine
# lacks a package or has too old a version (bounds from pyproject.toml).
# --system-site-packages gives the *base* interpreter's packages; the machine's
# python3 may itself be a virtual environment (there: /opt/torch/.venv), which a
# new venv would not see, so a .pth file adds that interpreter's own site
# directories after the venv's: torch, jax, pip and setuptools come from there.
# PyAV is left out on purpose (bench writes no video): Porter itself goes in
# with --no-deps, built with the machine's setuptools (--no-build-isolation).
# Fallback (or INSTALL=target): every carried wheel, unresolved (--no-deps),
# into a folder put first on PYTHONPATH.
requirements=("torchax>=0.0.11" "diffusers>=0.35" "pydantic>=2.6" "ftfy>=6" "pluggy>=1.5"
              "pyyaml>=6" "transformers>=4.51" "safetensors>=0.4" "accelerate>=0.30"
              "tqdm>=4.60" "numpy>=1.26")

check_setuptools() {
  "$1" - <<'EOF'
import setuptools, sys
if int(setuptools.__version__.split(".")[0]) < 68:
    sys.exit(f"run.sh: setuptools {setuptools.__version__} < 68 cannot build Porter offline "
             "(--no-build-isolation); carry a setuptools wheel")
print(f"setuptools {setuptools.__version__}", file=sys.stderr)
EOF
}

install_venv() {
  say "virtual environment at $venv (reusing $base_python's packages)"
  rm -rf "$venv"
  "$base_python" -m venv --without-pip --system-site-packages "$venv" || return 1
  local site_dir
  site_dir=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
    || return 1
  "$base_python" - > "$site_dir/_porter_base_python.pth" <<'EOF' || return 1
import site, sys
dirs = site.getsitepackages() + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
print("\n".join(dict.fromkeys(dirs)))
EOF
  "$venv/bin/python" - <<'EOF' || { say "the venv does not see torch, jax and pip"; return 1; }
import sys
import jax, pip, torch
assert sys.prefix != sys.base_prefix
print(f"venv python: {sys.executable}: torch {torch.__version__}, jax {jax.__version__}, "
      f"pip {pip.__version__}", file=sys.stderr)
EOF
  check_setuptools "$venv/bin/python" || return 1
  say "installing from $wheels (offline, resolved against the machine's packages)"
  "$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels" \
      "${requirements[@]}" \
    || { say "pip could not install from the carried wheels (above: what is missing; add it \
to prepare.sh's pins)"; return 1; }
  say "installing Porter from $repo (--no-deps --no-build-isolation)"
  "$venv/bin/python" -m pip install --quiet --no-index --no-deps --no-build-isolation "$repo" \
    || { say "pip could not build and install Porter"; return 1; }
  py="$venv/bin/python"
}

install_target() {
  local target="$venv-target"
  say "installing every carried wheel into $target (--no-deps), first on PYTHONPATH"
  rm -rf "$target"
  check_setuptools "$base_python" || return 1
  "$base_python" -m pip install --quiet --no-index --no-deps --no-compile --target "$target" \
      "${carried[@]}" || return 1
  "$base_python" -m pip install --quiet --no-index --no-deps --no-build-isolation --upgrade \
      --target "$target" "$repo" || return 1
  export PYTHONPATH="$target"
  py="$base_python"
}

py=""
case "${INSTALL:-venv}" in
  venv) install_venv || { say "warning: venv install failed; falling back to INSTALL=target"
                          install_target || fail "could not install Porter"; } ;;
  target) install_target || fail "could not install Porter" ;;
  *) fail "INSTALL must be venv or target, not ${INSTALL}" ;;
esac

# From / so that the installed Porter is what gets imported, not the source tree.
(cd / && "$py" - <<'EOF') 2>&1 | tee -a "$out/env.txt" >&2 || fail "Porter does not import"
import importlib.metadata as md
import sys
names = ["porter", "torch", "jax", "jaxlib", "torchax", "diffusers", "transformers",
         "huggingface-hub", "pydantic", "numpy"]
for name in names:
    try:
        dist = md.distribution(name)
        print(f"{name} {dist.version}  ({dist.locate_file('')})")
    except md.PackageNotFoundError:
        print(f"{name} missing")
print(f"python {sys.version.split()[0]}")
import jax, torch
print(f"jax devices: {jax.devices()}")
print(f"torch cuda: {torch.cuda.is_available()}"
      + (f" ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else ""))
import porter.cli
from porter import registry
print(f"porter families: {sorted(registry.loaded().families)}")
EOF

# On a GPU machine, refuse to time something other than GPU against GPU: JAX
# must run on the GPU, and porter/commands/bench.py must put the PyTorch reference on
# CUDA (at this shape a CPU reference step takes far longer than a device
# call may run). ALLOW_CPU=1 skips both checks.
if command -v nvidia-smi >/dev/null 2>&1 && [[ "${ALLOW_CPU:-0}" != 1 ]]; then
  (cd / && "$py" - <<'EOF') || fail "see above (ALLOW_CPU=1 runs anyway)"
import inspect, sys
import jax, torch
import porter.commands.bench
problems = []
if jax.default_backend() != "gpu":
    problems.append(f"JAX runs on {jax.default_backend()!r}, not the GPU (is the machine's "
                    "jax-cuda plugin visible in the venv?)")
if not torch.cuda.is_available():
    problems.append("PyTorch sees no CUDA device")
if "cuda" not in inspect.getsource(porter.commands.bench):
    problems.append("porter/commands/bench.py runs the PyTorch reference on the host CPU; it must run "
                    "on CUDA for a GPU comparison (see benchmarks/README.md, GPU)")
for problem in problems:
    print(f"run.sh: error: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
fi

# ------------------------------------------------------------------ whole video
# VIDEO=1: the whole video of recipes/wan1.3b-causvid.yaml beside diffusers (and the
# specialised systems' wheels in benchmarks/gpu/peers, where carried) instead of the step
if [[ "${VIDEO:-0}" == 1 ]]; then
  say "whole video: benchmarks/gpu/whole_video.py ${VIDEO_ARGS:-}"
  # shellcheck disable=SC2086  # VIDEO_ARGS is a list of arguments
  "$py" -P "$here/whole_video.py" --out "$out" --peers "$here/peers" ${VIDEO_ARGS:-} \
    || fail "the whole-video benchmark failed (results so far: $out/whole-video.json)"
  cat "$out/whole-video.json"
  exit 0
fi

# ------------------------------------------------------------------ bench
say "porter bench $recipe --steps $steps --json $*"
start=$(date +%s)
set +e
"$py" -P -m porter.cli bench "$recipe" --steps "$steps" --json "$@" \
    > "$out/bench.json" 2> >(tee "$out/bench.log" >&2)
status=$?
set -e
wait  # for tee
say "bench exited $status after $(( $(date +%s) - start )) s"
if (( status != 0 )); then
  tail -n 30 "$out/bench.log" >&2 || true
  fail "porter bench failed (log: $out/bench.log)"
fi
cat "$out/bench.json"
(cd / && "$py" - "$out/bench.json" <<'EOF') 2>&1 | tee "$out/summary.txt" >&2
import json, sys
from porter.commands.bench import render
result = json.load(open(sys.argv[1]))
print(render(result))
# Model FLOPs utilisation against the datasheet's dense bfloat16 peak, where known
# (H100 SXM and H200: 989.4 TFLOP/s; H100 PCIe: 756 TFLOP/s), for both sides.
specs = {"H100 PCIe": 756e12, "H100": 989.4e12, "H200": 989.4e12}
peak = next((v for k, v in specs.items() if k in str(result.get("device"))), None)
flops, step = result.get("flops_per_step"), result["step_s"]
if peak and flops:
    print(f"  MFU vs {peak / 1e12:.0f} TFLOP/s (dense bf16 datasheet): porter "
          f"{flops / step['porter'] / peak:.1%}, PyTorch eager "
          f"{flops / step['pytorch_eager'] / peak:.1%}")
EOF
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv >&2 || true
fi

# ------------------------------------------------------------------ attention alone
if [[ "${ATTENTION:-0}" == 1 ]]; then
  say "attention alone: benchmarks/gpu/attention.py ${ATTENTION_ARGS:-}"
  # shellcheck disable=SC2086  # ATTENTION_ARGS is a list of arguments
  (cd "$repo" && "$py" -P benchmarks/gpu/attention.py --json "$out/attention.json" \
       ${ATTENTION_ARGS:-} > /dev/null) || say "warning: the attention benchmark failed (above)"
fi

# ------------------------------------------------------------------ variants
# Each set of arguments in ALSO, benched after the first with the same command-line
# arguments; a failing one is recorded and the rest (and parity) go on.
if [[ -n "${ALSO:-}" ]]; then
  # each variant's own output waits outside $out: a run cut off mid-variant leaves
  # only the results (what comes back from a lent machine is a few files)
  scratch="$(mktemp -d)"
  IFS=';' read -r -a variants <<< "$ALSO"
  for variant in "${variants[@]}"; do
    read -r -a arguments <<< "$variant"
    say "variant: porter bench $recipe --steps $steps --json $* ${arguments[*]}"
    start=$(date +%s)
    set +e
    "$py" -P -m porter.cli bench "$recipe" --steps "$steps" --json "$@" "${arguments[@]}" \
        > "$scratch/variant.json" 2> >(tee "$scratch/variant.log" >> "$out/bench.log")
    status=$?
    wait  # for tee
    (cd / && "$py" - "$variant" "$status" "$scratch/variant.json" "$scratch/variant.log" <<'EOF') \
        >> "$out/variants.jsonl" 2> >(tee -a "$out/summary.txt" >&2)
import json, sys
variant, status, result_file, log_file = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
try:
    from porter.commands.bench import render
    result = json.load(open(result_file))
    print(f"\nvariant: {variant}\n{render(result)}", file=sys.stderr)
    print(json.dumps({"arguments": variant, "result": result}))
except Exception as error:  # a failed bench (or output that is not its JSON): recorded
    tail = open(log_file, errors="replace").read()[-2000:]
    print(f"\nvariant: {variant}: failed (exit {status}): {error}", file=sys.stderr)
    print(json.dumps({"arguments": variant, "exit": status, "error": str(error),
                      "log_tail": tail}))
EOF
    set -e
    rm -f "$scratch/variant.json" "$scratch/variant.log"
    say "variant took $(( $(date +%s) - start )) s (exit $status)"
  done
  rm -rf "$scratch"
fi

# ------------------------------------------------------------------ parity
# A whole run (text encoder, transformer, VAE) on the GPU and on the CPU backend, each
# in a fresh process: frames compared (PARITY= skips it)
parity="${PARITY-recipes/wan-tiny.yaml}"
if [[ -n "$parity" ]]; then
  say "parity: $parity on the GPU and on the CPU backend"
  platform=gpu; [[ "${ALLOW_CPU:-0}" == 1 ]] && platform=auto
  (cd "$repo" && "$py" benchmarks/gpu/parity.py "$parity" --platform "$platform" \
       --json "$out/parity.json") \
      > "$out/parity.log" 2>&1 || { tail -n 30 "$out/parity.log" >&2; fail "parity failed"; }
  tail -n 25 "$out/parity.log" >&2
fi
say "results in $out"
