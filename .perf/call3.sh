set -x
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
export PYTHONPATH=
timeout 100 python3 -m pytest -q tests/test_index_put_cuda.py > $OUT/tests.txt 2>&1
tail -3 $OUT/tests.txt
timeout 470 python3 bench/run.py --suite gpu-broad --mode train-amp --models beit_base_patch16_224,deberta-v3-base,densenet121,mixer_b16_224,llama-4l-1024,inception_v3,wav2vec2-base,bloom-12l-1024 --backends torch_compile,ember --jobs 2 --turns host --out $OUT/race --deadline 330 --model-timeout 200 > $OUT/race.log 2>&1
grep -A40 "### Details" $OUT/race.log | cut -c1-330
