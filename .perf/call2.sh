set -x
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
export PYTHONPATH=
timeout 150 python3 -m pytest -q tests/test_index_put_cuda.py > $OUT/tests.txt 2>&1
tail -15 $OUT/tests.txt
timeout 200 python3 bench/profile_diff.py t5-small --mode train-amp --torch-backend torch_compile --out $OUT/prof-t5 > $OUT/prof.log 2>&1
sed -n 1,45p $OUT/prof-t5/profile_diff.md
timeout 220 python3 bench/run.py --suite gpu-broad --mode train-amp --models t5-small --backends torch_compile,ember --out $OUT/race --deadline 200 > $OUT/race.log 2>&1
tail -25 $OUT/race.log
