#!/usr/bin/env bash
# GPU call 1 (session 20): the whole GPU corpus at HEAD (kept copy buffers + lane digest never ran on a GPU), then
# the digest's cost.
set -o pipefail
export PYTHONUNBUFFERED=1
H=$PWD/.device/head
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" >> $OUT/gpu.txt 2>&1
cd $H && export PYTHONPATH=$H
timeout 470 python3 scripts/gpu_corpus.py --limit-s 440 --out $OUT/corpus.jsonl 2>&1 | tee $OUT/corpus.log
echo "corpus rc=$?" >> $OUT/gpu.txt
timeout 45 python3 bench/bench_digest.py --repeats 5 > $OUT/digest.txt 2>&1
echo "digest rc=$?" >> $OUT/gpu.txt
nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv >> $OUT/gpu.txt 2>&1
