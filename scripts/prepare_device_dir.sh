#!/usr/bin/env bash
# Prepare `.device/` (git-ignored; carried to the GPU machine with `carry: [".device"]`) for the acceptance runs:
#   .device/kb/src/      KernelBench v0.1's eval.py and __init__.py from a LOCAL KernelBench git dir, plus a
#                        stand-in utils.py (read_file and the rand_mix registration, copied verbatim)
#   .device/corpus/      the CUDA-L1 corpus, its anchor subset and KernelBench's baseline JSON
#   .device/kernelbench/ KernelBench HEAD's level1-3 task files (for the audit)
#   .device/whl/         pydantic wheels for the GPU image's Python 3.12 (KernelBench's eval imports pydantic)
# Nothing here is committed. Usage: scripts/prepare_device_dir.sh KERNELBENCH_GIT_DIR CORPORA_DIR
set -euo pipefail
kb_git=$1
corpora=$2
cd "$(dirname "$0")/.."
grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
mkdir -p .device/kb/src .device/corpus .device/whl .device/kernelbench
git --git-dir="$kb_git" show v0.1:src/eval.py > .device/kb/src/eval.py
git --git-dir="$kb_git" show v0.1:src/__init__.py > .device/kb/src/__init__.py
{
  echo '"""Stand-in for KernelBench v0.1 src/utils.py (its LLM-client imports are absent on the GPU machine):'
  echo 'read_file and the rand_mix registration are copied verbatim; eval_kernel_against_ref uses nothing else."""'
  echo 'import os'
  echo 'import torch'
  git --git-dir="$kb_git" show v0.1:src/utils.py | sed -n '/^def read_file/,/^def print_messages/p' | sed '$d'
  git --git-dir="$kb_git" show v0.1:src/utils.py | sed -n '/^def rand_mix(/,$p'
} > .device/kb/src/utils.py
python3 -c "import ast; ast.parse(open('.device/kb/src/utils.py').read())"
git --git-dir="$kb_git" archive HEAD KernelBench/level1 KernelBench/level2 KernelBench/level3 | tar -x -C .device/kernelbench
cp "$corpora"/cuda-l1-h100.jsonl "$corpora"/anchor-subset.json "$corpora"/kernelbench-H100_Modal-baseline_time_torch.json .device/corpus/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .device/whl \
  pydantic==2.11.7 pydantic-core==2.33.2 annotated-types==0.7.0 typing-inspection==0.4.1
du -sh .device
