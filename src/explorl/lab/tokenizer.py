"""The lab's character-level tokenizer: one token per character, loadable without custom code.

It is a ``tokenizers`` WordLevel model behind a pre-tokenizer that splits every character,
and a ``Fuse`` decoder that joins tokens with nothing in between, so ``decode(encode(s)) == s``
holds exactly, spaces included. ``encode`` adds no BOS/EOS: a prompt's ids are its characters.
The response ends with ``</s>`` (EOS); ``<pad>`` pads. Characters outside ``CHARS`` map to
``<unk>``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
CHARS = "0123456789+-*/()=>: "
"""Every character both lab tasks use in prompts and answers."""


def lab_tokenizer(model_max_length: int = 64) -> PreTrainedTokenizerFast:
    """A fresh character tokenizer over ``SPECIALS + CHARS`` (ids in that order)."""
    vocab = {t: i for i, t in enumerate([*SPECIALS, *CHARS])}
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
    return hf


def save_lab_tokenizer(tokenizer: PreTrainedTokenizerFast, path: str | Path) -> None:
    """``save_pretrained``, with a class name that ``AutoTokenizer`` resolves in 4.x and 5.x."""
    tokenizer.save_pretrained(path)
    # transformers 5 records its own class name ("TokenizersBackend"), unknown to 4.x; the
    # 4.x name still loads in 5.x.
    cfg_path = Path(path) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
