#!/usr/bin/env bash
# One-shot GPU check on a lent device machine (H100/H200 image: Python 3.12, torch 2.11+cu130,
# transformers 5.17; no network). Run from the repository root, with .whl carried:
#
#   bash scripts/device_check.sh
#
# Installs the wheels in .whl/ (transformer-lens, sae-lens and the packages they import that the
# image lacks) into /tmp/site, then runs, each step whatever the previous gave:
#   (a) import tl_reward, transformer_lens, sae_lens
#   (b) benchmarks/cuda_parity.py --device cuda           -> $OUT/cuda_parity.txt
#   (c) benchmarks/bridge.py on an 8B-shaped seeded Llama RM in bf16  -> $OUT/bridge_8b.txt
#   (d) pytest of the readout, bridge and attachment tests (on the device's CPU)
# Everything goes to $OUT/log.txt; each step's exit status to $OUT/rc.txt. Exits non-zero when
# any step failed. Expected: about 4 minutes; the per-step timeouts and T_TOTAL (480 s) bound
# it to about 8 minutes at worst (run it with timeout_s=560).
set -u -o pipefail

OUT=${OUT:-/tmp/device_check_out}
mkdir -p "$OUT"
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
T_IMPORT=${T_IMPORT:-90}
T_PARITY=${T_PARITY:-120}
T_PYTEST=${T_PYTEST:-120}
T_BRIDGE=${T_BRIDGE:-200}
T_TOTAL=${T_TOTAL:-480}  # no step starts a timeout past this many seconds from the start

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1

: >"$OUT/rc.txt"

step() {  # step NAME TIMEOUT CMD...: run, log, record the exit status, never abort
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS left=$((T_TOTAL - SECONDS))
  [ "$left" -lt 15 ] && left=15
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== [$name] $* (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "=== [$name] rc=$rc ($((SECONDS - t0)) s)"
  echo "$name $rc $((SECONDS - t0))s" >>"$OUT/rc.txt"
  return $rc
}

main() {
  local fail=0 t_start=$SECONDS
  echo "=== host: $(hostname) $(date -u +%FT%TZ) in $PWD"
  nvidia-smi -L 2>&1 | head -4

  if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    local n; n=$(ls .whl/*.whl 2>/dev/null | wc -l)
    echo "=== [install] $n wheels from .whl into $SITE"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl; then
      echo "=== [install] FAILED: nothing else can run"
      echo "install 1" >>"$OUT/rc.txt"
      return 1
    fi
    echo "install 0" >>"$OUT/rc.txt"
  fi
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"

  "$PY" -c 'import torch;print(torch.__version__, torch.cuda.get_device_name())' \
    || echo "!!! torch or CUDA not usable"
  # versions of what the image provides that the carried packages lean on (diagnostics only)
  "$PY" - <<'EOF' || true
import importlib.metadata as md
names = ["transformers", "huggingface-hub", "tokenizers", "numpy", "pandas", "pyarrow", "fsspec",
         "typing-extensions", "protobuf", "click", "zipp", "jaxtyping", "accelerate", "pytest",
         "transformer-lens", "sae-lens", "datasets", "wandb", "pydantic"]
out = []
for n in names:
    try:
        out.append(f"{n}=={md.version(n)}")
    except md.PackageNotFoundError:
        out.append(f"{n}: MISSING")
print("versions:", ", ".join(out))
EOF

  step import "$T_IMPORT" "$PY" -c \
    'import tl_reward, transformer_lens, sae_lens; from tl_reward import HookedRewardModel; print("imports ok:", tl_reward.__file__, transformer_lens.__file__, sae_lens.__file__)' \
    || fail=1

  step cuda_parity "$T_PARITY" bash -o pipefail -c \
    "\"$PY\" benchmarks/cuda_parity.py --device cuda 2>&1 | tee \"$OUT/cuda_parity.txt\"" \
    || fail=1

  step bridge_8b "$T_BRIDGE" bash -o pipefail -c \
    "cd benchmarks && \"$PY\" bridge.py --shape llama-3.1-8b --dtype bfloat16 --device cuda --batch 8 --tokens 1024 2>&1 | tee \"$OUT/bridge_8b.txt\"" \
    || fail=1

  step pytest "$T_PYTEST" "$PY" -m pytest -q -rs -p no:cacheprovider -x \
    tests/model/test_one_readout.py tests/model/test_bridge.py tests/analysis/test_attachments.py \
    || fail=1

  echo "=== summary ($((SECONDS - t_start)) s in all):"
  cat "$OUT/rc.txt"
  return $fail
}

main 2>&1 | tee "$OUT/log.txt"
