"""A word-level tokenizer for the bench models (dummy weights, no tokenizer of their own): token id N is the word `tN`
(ids 0-2 are the special `<unk>`, `<s>`, `</s>`), words are split on whitespace and joined with one space, so decode
then encode gives back exactly the same ids. Stdlib only: it writes the two files Hugging Face's fast tokenizer loads
(`tokenizer.json` in the `tokenizers` format, `tokenizer_config.json`).

Why: vLLM's load generator (`vllm bench serve --dataset-name random`) samples token ids from a tokenizer's vocabulary
and sends the *decoded text* (it decodes, re-encodes and checks the count), so the servers must tokenize text with the
same tokenizer: a CR served with `--skip-tokenizer-init` cannot take those prompts. With this tokenizer the prompt
lengths are exact (no decode/encode drift) and every id of the model's vocabulary decodes (vLLM's detokenizer sees
whatever the random weights generate). The vocabulary size is the model's (`vocab_size` in config.json).

Why `<unk>` is written `<unk|chars-per-token-bound>`: vLLM (0.20 `renderers/params.py` `_text_len_check`) refuses a
text prompt longer than `max_input_tokens * max_chars_per_token` characters before tokenizing it, where
`max_chars_per_token` is the vocabulary's longest word. With words `tN` of up to 7 characters plus the joining space,
an 8k-token prompt is ~8 characters per token and was refused (`your prompt contains 65535 characters (more than
64505 ...)`). One long special word raises the bound to 25 characters per token; nothing samples or generates it.

    python3 bench/gpu/word_tokenizer.py DIR [VOCAB_SIZE]     # VOCAB_SIZE default: DIR/config.json's vocab_size
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

UNK = "<unk|chars-per-token-bound>"  # see the module docstring
SPECIAL = (UNK, "<s>", "</s>")
FILES = ("tokenizer.json", "tokenizer_config.json")


def word(i: int) -> str:
    return SPECIAL[i] if i < len(SPECIAL) else f"t{i}"


def tokenizer_json(vocab_size: int) -> dict[str, object]:
    if vocab_size <= len(SPECIAL):
        raise ValueError(f"vocab_size {vocab_size} leaves no ordinary token")
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for i, s in enumerate(SPECIAL)
    ]  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,  # tokenizers then joins the words with one space
        "model": {"type": "WordLevel", "vocab": {word(i): i for i in range(vocab_size)}, "unk_token": UNK},
    }


def tokenizer_config() -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": 1_048_576,
        "clean_up_tokenization_spaces": False,
    }


def write(directory: Path, vocab_size: int | None = None) -> Path:
    """Write the tokenizer files into `directory` (created); vocab_size defaults to its config.json's."""
    directory.mkdir(parents=True, exist_ok=True)
    if vocab_size is None:
        vocab_size = int(json.loads((directory / "config.json").read_text())["vocab_size"])
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab_size), separators=(",", ":")))
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    return directory


def encode(text: str) -> list[int]:
    """What the tokenizer makes of `text` (for stand-ins that take text prompts): `tN` -> N, anything else `<unk>`."""
    return [int(w[1:]) if w[:1] == "t" and w[1:].isdigit() else SPECIAL.index(w) if w in SPECIAL else 0
            for w in text.split()]  # fmt: skip


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
