"""A tiny, randomly initialised Whisper, built at test time: no speech weights can be fetched here.

It proves the audio request path and the line shapes, never the transcript (its text is noise).
With real weights the same path runs `--model openai/whisper-large-v3` (or a local folder).
"""

import io
import json
import math
import struct
import wave
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
]


def build_tiny_whisper(target: Path) -> Path:
    """A Hugging Face folder vLLM loads as Whisper: byte-level tokenizer, one layer each way."""
    import torch
    from transformers import (
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from vllm.model_executor.models.whisper import WhisperForConditionalGeneration as VllmWhisper

    target.mkdir(parents=True, exist_ok=True)
    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    # Every language vLLM may detect (it constrains detection to these tokens), then the rest.
    languages = [f"<|{code}|>" for code in sorted(VllmWhisper.supported_languages)]
    specials = [SPECIAL_TOKENS[0], *languages, *SPECIAL_TOKENS[1:]]
    for token in specials:
        vocab[token] = len(vocab)
    (target / "vocab.json").write_text(json.dumps(vocab))
    (target / "merges.txt").write_text("#version: 0.2\n")
    end = SPECIAL_TOKENS[0]
    tokenizer = WhisperTokenizer(
        str(target / "vocab.json"),
        str(target / "merges.txt"),
        unk_token=end,
        bos_token=end,
        eos_token=end,
        pad_token=end,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": specials[1:]})
    WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tokenizer).save_pretrained(target)
    config = WhisperConfig(
        vocab_size=len(vocab),
        num_mel_bins=80,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        # Random weights never say <|endoftext|>: each answer runs to this length.
        max_target_positions=64,
        decoder_start_token_id=vocab["<|startoftranscript|>"],
        bos_token_id=vocab[end],
        eos_token_id=vocab[end],
        pad_token_id=vocab[end],
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    torch.manual_seed(0)  # the same noise every run
    model = WhisperForConditionalGeneration(config)
    model.generation_config.forced_decoder_ids = None
    model.save_pretrained(target)
    return target


def tone_wav(seconds: float = 1.0, rate: int = 16_000) -> bytes:
    """A 440 Hz tone as a 16-bit mono WAV file."""
    frames = b"".join(
        struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * n / rate)))
        for n in range(int(seconds * rate))
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes(frames)
    return out.getvalue()
