#!/usr/bin/env bash
# GPU call 2 (session 20): the rest of the GPU corpus (exploits after call 1's cut, the GPU tasks' own models, the
# hang), the folded digest's cost, and issue 36's blocking tests.
set -o pipefail
export PYTHONUNBUFFERED=1
H=$PWD/.device/head
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
cd $H && export PYTHONPATH=$H
timeout 260 python3 scripts/gpu_corpus.py --limit-s 230 --out $OUT/corpus2.jsonl \
  --only exploits/matmul_side_stream,exploits/relu_superbatch,exploits/softplus,exploits/sum_smem,task/,faults/ 2>&1 | tee $OUT/corpus2.log
echo "corpus rc=$?" >> $OUT/gpu.txt
timeout 30 python3 bench/bench_digest.py --repeats 5 > $OUT/digest.txt 2>&1
echo "digest rc=$?" >> $OUT/gpu.txt
KBVERIFY_GPU_RESULTS=$OUT/gpu_tests.jsonl timeout 230 python3 -m pytest -q -x tests/test_gpu.py -m gpu -k "blocking" -p no:cacheprovider 2>&1 | tail -30 > $OUT/gpu_tests.txt
echo "tests rc=$?" >> $OUT/gpu.txt
nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv >> $OUT/gpu.txt 2>&1
