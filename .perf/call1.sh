set -x
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
git log --oneline -1 > $OUT/head.txt 2>&1
export PYTHONPATH=
timeout 200 python3 -m pytest -q tests/test_device_meta_trace_cuda.py > $OUT/tests.txt 2>&1
tail -5 $OUT/tests.txt
timeout 340 python3 bench/profile_diff.py t5-small --mode train-amp --torch-backend torch_compile --out $OUT/prof-t5 > $OUT/prof.log 2>&1
tail -40 $OUT/prof.log
