"""A tiny Llama written as a GGUF file by the tests (the gguf package's ``GGUFWriter``), laid
out as llama.cpp's converter writes one: Q and K rows permuted, tied embeddings (no
``output.weight``), a byte-level BPE vocabulary with two merges and a ChatML template."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ 1", "1 2"]


def byte_chars() -> list[str]:
    """GPT-2's byte → printable character table (``bytes_to_unicode``), in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def tokens() -> list[str]:
    return SPECIALS + byte_chars() + ["Ġ1", "12"]


def tiny_llama(seed: int = 0):
    """A random tiny ``LlamaForCausalLM`` over ``tokens()`` (hidden 32, 2 layers, GQA 4/2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tokens()), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    for p in model.parameters():  # random norms too, so a mixed-up tensor would show
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    return model.eval()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order of Q and K (its rotary layout); transformers undoes it on load."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)


def write_gguf(model, path: Path, *, qtype: str = "F32") -> Path:
    """Write ``model`` (``tiny_llama()``) to ``path``: matrices in ``qtype`` (F32, Q8_0, or
    Q8_1: a type gguf cannot dequantise), norms in F32."""
    import gguf

    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(0 if qtype == "F32" else 7)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens())
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens()) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    for i in range(c.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf, gg in names.items():
        a = sd[hf]
        if gg.endswith("attn_q.weight"):
            a = _permute(a, c.num_attention_heads)
        elif gg.endswith("attn_k.weight"):
            a = _permute(a, c.num_key_value_heads)
        if a.ndim == 1 or qtype == "F32":
            w.add_tensor(gg, np.ascontiguousarray(a))
            continue
        t = getattr(gguf.GGMLQuantizationType, qtype)
        if qtype == "Q8_1":  # no quantiser in gguf either: bytes of the right size
            block, nbytes = gguf.GGML_QUANT_SIZES[t]
            raw = np.zeros((a.shape[0], a.shape[1] // block * nbytes), dtype=np.uint8)
        else:
            raw = gguf.quants.quantize(a, t)
        w.add_tensor(gg, raw, raw_shape=raw.shape, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def varied(response: str, ground_truth: str) -> float:
    """A reward that differs between almost any two samples (the share of distinct characters),
    so a few short samples of any model give groups with non-zero advantages."""
    return len(set(response)) / (len(response) + 1)
