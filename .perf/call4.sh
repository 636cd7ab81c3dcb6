set -x
export PYTHONPATH=
timeout 120 python3 -m pytest -q tests/test_cudagraphs_training.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
timeout 280 python3 bench/run.py --suite gpu-broad --mode train-amp --models deberta-v3-base --backends torch_compile,ember --out $OUT/race1 --model-timeout 200 > $OUT/race1.log 2>&1
grep -A8 "### Details" $OUT/race1.log | cut -c1-330; grep -i "replayed\|given up" $OUT/race1.log
timeout 170 python3 bench/run.py --suite gpu-broad --mode train-amp --models densenet121 --backends ember --out $OUT/race2 --model-timeout 160 > $OUT/race2.log 2>&1
grep -A6 "### Details" $OUT/race2.log | cut -c1-330; tail -5 $OUT/race2/run.log
