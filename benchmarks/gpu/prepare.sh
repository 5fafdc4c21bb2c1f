#!/usr/bin/env bash
# Download, here (with access to PyPI), the wheels that benchmarks/gpu/run.sh
# installs on a GPU machine that has no network.
#
# The GPU machine already has Python 3.12 with PyTorch, JAX (CUDA), transformers,
# huggingface-hub, accelerate, safetensors, pluggy, PyYAML, tqdm, numpy, pip and
# setuptools (see benchmarks/README.md, "GPU"). What Porter needs beyond that:
# torchax, diffusers, pydantic (its compiled core is the only platform wheel) and
# their small pure-Python dependencies, plus ftfy (diffusers' Wan pipeline).
# PyAV is not carried: `porter bench` never writes a video.
#
#   bash benchmarks/gpu/prepare.sh                  # wheels for CPython 3.12, x86-64
#   PYTHON_VERSION=3.11 WHEELS=/tmp/w bash benchmarks/gpu/prepare.sh
#
# The folder (benchmarks/gpu/wheels by default) is git-ignored; name it in the
# device tool's `carry`. Everything carried must stay under 64 MiB together
# with the working tree: this script checks that.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
wheels="${WHEELS:-$here/wheels}"
python_version="${PYTHON_VERSION:-3.12}"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
limit_mib="${CARRY_LIMIT_MIB:-64}"

# The versions the project is developed and tested with here (pyproject.toml
# gives the lower bounds). One version of each.
pins=(
  torchax==0.0.13
  diffusers==0.42.1
  pydantic==2.14.3
  pydantic-core==2.50.4          # compiled: the only platform-specific wheel
  annotated-types==0.8.0
  typing-inspection==0.4.5
  typing-extensions==4.16.0      # pydantic needs >= 4.16; the machine's may be older
  importlib-metadata==10.2.0     # diffusers; not on the machine
  lazy-importer==0.1.0           # importlib-metadata 10
  zipp==4.1.2
  ftfy==6.3.1
  wcwidth==0.9.4
  flatbuffers==25.12.19          # jax.export serialization (Porter's trace cache)
)

platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)
platform_args=()
for p in "${platforms[@]}"; do platform_args+=(--platform "$p"); done

echo "prepare: wheels for CPython $python_version (x86-64) into $wheels"
rm -rf "$wheels"
mkdir -p "$wheels"
if ! "$python" -m pip download --quiet --no-deps --only-binary=:all: \
      --python-version "$python_version" --implementation cp "${platform_args[@]}" \
      -d "$wheels" "${pins[@]}"; then
  echo "prepare: pip download failed (network to PyPI? a pin that does not exist?)" >&2
  exit 1
fi

# One wheel per pin, nothing else.
count=$(find "$wheels" -maxdepth 1 -name '*.whl' | wc -l)
if [[ "$count" -ne "${#pins[@]}" ]]; then
  echo "prepare: expected ${#pins[@]} wheels, found $count in $wheels" >&2
  exit 1
fi

echo "prepare: wheels:"
(cd "$wheels" && ls -l --block-size=K -- *.whl | awk '{printf "  %8s  %s\n", $5, $9}')

# The specialised GPU systems whole_video.py sets beside Porter: their own wheels only
# (each pins its own PyTorch and dozens of packages; whole_video.py records what the GPU
# machine lacks of them), into benchmarks/gpu/peers (git-ignored; carry it with VIDEO=1).
peers="${PEERS_DIR:-$here/peers}"
rm -rf "$peers"
mkdir -p "$peers"
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp "${platform_args[@]}" -d "$peers" fastvideo==0.2.1 sglang==0.5.10.post1 \
  || echo "prepare: warning: the peers' wheels did not download; whole_video.py records them as not carried" >&2

# Size check: the wheels and the rest of the working tree travel together.
wheel_bytes=$(du -cb "$wheels"/*.whl "$peers"/*.whl 2>/dev/null | tail -1 | cut -f1)
tree_bytes=0
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  tree_bytes=$( (cd "$repo" && git ls-files -z --cached --others --exclude-standard \
                 | xargs -0 -r du -cb 2>/dev/null | awk '/\ttotal$/ {s += $1} END {print s + 0}') )
fi
total=$((wheel_bytes + tree_bytes))
limit=$((limit_mib * 1024 * 1024))
printf 'prepare: wheels %.1f MiB + working tree %.1f MiB = %.1f MiB (limit %d MiB)\n' \
  "$(echo "$wheel_bytes / 1048576" | bc -l)" "$(echo "$tree_bytes / 1048576" | bc -l)" \
  "$(echo "$total / 1048576" | bc -l)" "$limit_mib"
if (( total > limit )); then
  echo "prepare: over the carry limit; carry less" >&2
  exit 1
fi

if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 \
    && ! git -C "$repo" check-ignore -q "$wheels/${pins[0]%%==*}.whl" 2>/dev/null \
    && [[ "$wheels" == "$repo"/* ]]; then
  echo "prepare: warning: $wheels is not git-ignored; the device tool carries only ignored" \
       "paths named in carry (and would send it anyway as an untracked file)" >&2
fi
echo "prepare: done. On the GPU machine: bash benchmarks/gpu/run.sh" \
     "(carry: ${wheels#"$repo"/})"
