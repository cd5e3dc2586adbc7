#!/bin/bash
# The prepared device check for a lent GPU (issue 57: packed trials stacked on a GPU), as one call
# of the device tool that ends within about 9 minutes, so that a 15-minute lease has room to run
# it again. What it runs, each part under its own time limit (the limits add up to 520 s; installing
# takes about 20 s), output in $OUT:
#   1. tests/test_cuda.py's packing tests: members taking turns and members stacked (fp32, bf16),
#      auto's measured pack size, and train.compile's CUDA graphs (a trial alone and two stacked
#      members against the eager trials: each compiles, so allow a minute or two) — 170 s;
#   2. benchmarks/stacked.py: the probe's and the product's stacked step for 1, 8 and 32 SASRec
#      seeds against a trial alone, bf16, one repetition, and one validation of 1, 8, 32 members
#      alone and shared — 120 s;
#   3. benchmarks/gpu.py --packed: SASRec seeds per GPU-hour, k processes against one pack — 120 s;
#   4. benchmarks/gpu.py --packed-only with train.compile=reduce-overhead ("packed + graphs"): a
#      trial alone and a pack of 8, each compiled and replayed as CUDA graphs, plain batches; 60
#      warm-up steps (an epoch is 48: every batch shape recorded before the timed steps) — 110 s.
# Figures are printed, not written to RESULTS.md (--no-write): copy them there with the device's
# name from the output files.
#
# Before the call, here (where pip reaches the package registries), in the repository's root:
#   echo /.whl/ >> .git/info/exclude; echo /.data/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     typing-extensions==4.16.0
#   mkdir -p .data/seqrec/ml-1m_sasrec_reconstructed
#   cp ../shared/data/seqrec/ml-1m_sasrec_reconstructed/ml-1m.sasrec_minus978.txt \
#     .data/seqrec/ml-1m_sasrec_reconstructed/
# (the image holds torch, numpy, pandas, pyyaml and pytest; importing what these parts import
# needs pydantic too, not MLflow or Optuna; train.compile needs triton, which torch's CUDA wheels
# bring, and a C compiler for its launchers: without them parts 1 and 4 fail, the rest runs). Then the call:
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl", ".data"], timeout_s=600)
# Without CUDA it says so and exits with status 2.
set -o pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)"; then
    echo "gpu_check: no CUDA device here; nothing run" >&2
    exit 2
fi
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
# The plugins are found through the package's entry points: the package installed, its code here.
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > "$OUT/install.log" 2>&1 || {
    tail -5 "$OUT/install.log"
    exit 1
}
export ABLATE_DATA_MIRROR=$PWD/.data PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/device.txt"
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_cuda.py \
    -k "packed or stacked or auto or compiled" 2>&1 | tee "$OUT/test_cuda.log" | tail -15
timeout 120 python3 benchmarks/stacked.py --device cuda --precision bf16 --k 1 8 32 --steps 20 --reps 1 \
    --exact 0 --no-write 2>&1 | tee "$OUT/stacked.log" | tail -15
timeout 120 python3 benchmarks/gpu.py --configs sasrec --k 1 8 32 --packed --steps 50 --warmup 5 --no-write 2>&1 |
    tee "$OUT/gpu.log" | tail -15
timeout 110 python3 benchmarks/gpu.py --configs sasrec --k 1 8 --packed-only --steps 50 --warmup 60 \
    --override train.compile=reduce-overhead --override train.micro_batches=1 --no-write 2>&1 |
    tee "$OUT/gpu_compiled.log" | tail -15
