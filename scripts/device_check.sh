#!/usr/bin/env bash
# The one prepared GPU run for issue 38 on a lent device machine (H100/H200 image: Python 3.12,
# torch 2.11+cu130, transformers 5.17; no network). Run from the repository root, with .whl
# carried:
#
#   bash scripts/device_check.sh          # run tool: timeout_s=580
#
# .whl holds transformer-lens, sae-lens and the packages they import that the image lacks
# (the "versions" line below names what the image has), e.g. filled once on a machine with
# PyPI by `python -m pip download -d .whl --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 transformer-lens sae-lens ...`. They are installed into
# /tmp/site, then each step runs whatever the previous gave (files named for the card that
# `nvidia-smi -L` reports: SFX=h200, h100 or gpu):
#   (0) import tl_reward, transformer_lens, sae_lens
#   (a) benchmarks/bridge.py, Llama-3.1-8B shape, bf16, batch 8 x 1024 tokens: hf, bridge,
#       hooked (fused attention) and hooked (materialised), each row alone in its own process,
#       peak above its own weights          -> $OUT/bridge_llama-3.1-8b_$SFX.{txt,json}
#   (b) benchmarks/vocab_sweep.py roofline at the 8B shape, the whole 128,256-token vocabulary,
#       batch 512, with a torch.profiler table of where a sweep batch's time goes
#       -> $OUT/vocab_sweep_llama8b_$SFX.json, $OUT/vocab_sweep_profile_llama8b_$SFX.txt
#   (c) benchmarks/circuits.py at the 8B shape, bf16, $PAIRS pairs, 2 replies per forward:
#       forward+backward (with and without weight gradients), EAP, EAP-IG and where EAP-IG's
#       time goes      -> $OUT/circuits_breakdown_llama-3.1-8b_$SFX.{txt,json}
#   (d) benchmarks/cuda_parity.py --device cuda (if time is left)  -> $OUT/cuda_parity_$SFX.txt
#   (e) pytest of the fused-attention, readout and bridge tests (if time is left)
# Everything goes to $OUT/log.txt, which ends with each step's exit status and seconds (a step
# with under MIN_LEFT seconds of T_TOTAL left is recorded as skipped). Exits non-zero when any
# step failed. Expected: (a) ~150 s, (b) ~90 s, (c) ~90 s, about 6 minutes with the install;
# the per-step timeouts and T_TOTAL (500 s) bound it to about 9 minutes at worst.
set -u -o pipefail
SFX=gpu PEAK=0  # set from nvidia-smi -L in main

OUT=${OUT:-/tmp/device_check_out}
mkdir -p "$OUT"
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
T_IMPORT=${T_IMPORT:-90}
T_BRIDGE=${T_BRIDGE:-220}
T_SWEEP=${T_SWEEP:-150}
T_CIRCUITS=${T_CIRCUITS:-180}
T_PARITY=${T_PARITY:-90}
T_PYTEST=${T_PYTEST:-90}
T_TOTAL=${T_TOTAL:-500}  # no step runs past this many seconds from the start
MIN_LEFT=${MIN_LEFT:-30}  # a step with less time than this left is skipped
PAIRS=${PAIRS:-16}       # (c): preference pairs

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
export HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1

RC=$(mktemp)  # the summary; $OUT returns at most 8 files, so no file of its own
: >"$RC"

step() {  # step NAME TIMEOUT CMD...: run, log, record the exit status, never abort
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS left=$((T_TOTAL - SECONDS))
  if [ "$left" -lt "$MIN_LEFT" ]; then
    echo "=== [$name] skipped: ${left}s of T_TOTAL left"
    echo "$name skipped 0s" >>"$RC"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== [$name] $* (timeout ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "=== [$name] rc=$rc ($((SECONDS - t0)) s)"
  echo "$name $rc $((SECONDS - t0))s" >>"$RC"
  return $rc
}

main() {
  local fail=0 t_start=$SECONDS
  echo "=== host: $(hostname) $(date -u +%FT%TZ) in $PWD"
  local cards; cards=$(nvidia-smi -L 2>&1 | head -4)
  echo "$cards"
  case "$cards" in  # result files are named for the card
    *H200*) SFX=h200; PEAK=989 ;;
    *H100*) SFX=h100; PEAK=989 ;;
    *) SFX=gpu; PEAK=0 ;;
  esac
  echo "=== result files: *_$SFX"

  if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    local n; n=$(find .whl -maxdepth 1 -name '*.whl' 2>/dev/null | wc -l)
    [ "$n" -eq 0 ] && echo "!!! no wheels in .whl: fill it (see the header) or SKIP_INSTALL=1"
    echo "=== [install] $n wheels from .whl into $SITE"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl; then
      echo "=== [install] FAILED: nothing else can run"
      echo "install 1" >>"$RC"
      return 1
    fi
    echo "install 0" >>"$RC"
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

  # (a) the hooked row shows fused attention against materialised; every row alone
  step bridge_8b "$T_BRIDGE" bash -o pipefail -c \
    "cd benchmarks && \"$PY\" bridge.py --shape llama-3.1-8b --dtype bfloat16 --device cuda --batch 8 --tokens 1024 --json \"$OUT/bridge_llama-3.1-8b_$SFX.json\" 2>&1 | tee \"$OUT/bridge_llama-3.1-8b_$SFX.txt\"" \
    || fail=1

  # (b) the sweep against its in-run roofline, and where its time goes
  step sweep_8b "$T_SWEEP" bash -o pipefail -c \
    "cd benchmarks && \"$PY\" vocab_sweep.py roofline --shape llama-3.1-8b --dtype bfloat16 --device cuda --n-tokens 128256 --batch-size 512 --peak-tflops $PEAK --json \"$OUT/vocab_sweep_llama8b_$SFX.json\" --profile \"$OUT/vocab_sweep_profile_llama8b_$SFX.txt\" 2>&1" \
    || fail=1

  # (c) EAP-IG against m forward+backward passes, and where its time goes
  step circuits_8b "$T_CIRCUITS" bash -o pipefail -c \
    "cd benchmarks && \"$PY\" circuits.py --shape llama-3.1-8b --device cuda --dtype bfloat16 --n-pairs $PAIRS --batch-size 2 --output \"$OUT/circuits_breakdown_llama-3.1-8b_$SFX.json\" 2>&1 | tee \"$OUT/circuits_breakdown_llama-3.1-8b_$SFX.txt\"" \
    || fail=1

  step cuda_parity "$T_PARITY" bash -o pipefail -c \
    "\"$PY\" benchmarks/cuda_parity.py --device cuda 2>&1 | tee \"$OUT/cuda_parity_$SFX.txt\"" \
    || fail=1

  local tests=() t
  for t in tests/model/test_fused_attention.py tests/model/test_one_readout.py \
      tests/model/test_bridge.py; do
    [ -f "$t" ] && tests+=("$t")
  done
  step pytest "$T_PYTEST" "$PY" -m pytest -q -rs -p no:cacheprovider -x "${tests[@]}" || fail=1

  echo "=== summary ($((SECONDS - t_start)) s in all):"
  cat "$RC"
  return $fail
}

main 2>&1 | tee "$OUT/log.txt"
