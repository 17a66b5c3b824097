"""The lab's character-level tokenizer: one token per character, loadable without custom code.

It is a ``tokenizers`` WordLevel model behind a pre-tokenizer that splits every character,
and a ``Fuse`` decoder that joins tokens with nothing in between, so ``decode(encode(s)) == s``
holds exactly, spaces included. ``encode`` adds no BOS/EOS: a prompt's ids are its characters.
The response ends with ``</s>`` (EOS); ``<pad>`` pads. The vocabulary is ``SPECIALS`` and then
the task's alphabet (``CHARS`` for the built-in tasks); the alphabet is saved with the tokenizer
(``explorl_alphabet`` in tokenizer_config.json), and ``check_alphabet`` rejects a text with a
character outside it instead of letting it become ``<unk>``.
"""

from __future__ import annotations

import json
from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
CHARS = "0123456789+-*/()=>: "
"""Every character both built-in lab tasks use in prompts and answers."""
ALPHABET_KEY = "explorl_alphabet"


def check_alphabet(alphabet: str) -> None:
    """Raise ValueError unless ``alphabet`` is a non-empty string of distinct characters."""
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"a lab alphabet must be a non-empty string, got {alphabet!r}")
    twice = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if twice:
        raise ValueError(f"lab alphabet {alphabet!r} repeats {''.join(twice)!r}")


def outside(text: str, alphabet: str) -> str:
    """The characters of ``text`` that ``alphabet`` lacks (sorted, each once)."""
    return "".join(sorted(set(text) - set(alphabet)))


def lab_tokenizer(model_max_length: int = 64, alphabet: str = CHARS):
    """A fresh character tokenizer over ``SPECIALS + alphabet`` (ids in that order)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    check_alphabet(alphabet)
    vocab = {t: i for i, t in enumerate([*SPECIALS, *alphabet])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(
        Regex("(?m)."), behavior="isolated"
    )  # (?m): . matches \n too
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        clean_up_tokenization_spaces=False,  # the default cleanup would eat the space in "1 ,"
        model_max_length=model_max_length,
        model_input_names=["input_ids", "attention_mask"],  # Llama takes no token_type_ids
    )
    hf.init_kwargs[ALPHABET_KEY] = alphabet
    return hf


def save_lab_tokenizer(tokenizer, path: str | Path) -> None:
    """``save_pretrained``, with a class name that ``AutoTokenizer`` resolves in 4.x and 5.x."""
    tokenizer.save_pretrained(path)
    # transformers 5 records its own class name ("TokenizersBackend"), unknown to 4.x; the
    # 4.x name still loads in 5.x.
    cfg_path = Path(path) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def tokenizer_alphabet(tokenizer) -> str | None:
    """The alphabet of a lab tokenizer (None for any other tokenizer, or a lab model built
    before the alphabet was saved)."""
    return getattr(tokenizer, "init_kwargs", {}).get(ALPHABET_KEY)
