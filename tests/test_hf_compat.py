"""The KV-cache argument is passed under the name the model declares: no deprecation warning and
the same samples on either side of transformers' ``past_key_values`` -> ``cache`` rename."""

from __future__ import annotations

import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from explorl.hf_compat import cache_kwarg
from explorl.lab.build import sample
from explorl.rollout.hf import HFEngine


class _Old(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=False):
        return input_ids


class _New(torch.nn.Module):
    def forward(self, input_ids, cache=None, use_cache=False):
        return input_ids


class _Wrapper(torch.nn.Module):  # PEFT / DDP style: forward(*args, **kwargs) around the model
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


def test_the_declared_name_is_used_through_wrappers():
    assert cache_kwarg(_Old()) == "past_key_values"
    assert cache_kwarg(_New()) == "cache"
    assert cache_kwarg(_Wrapper(_New())) == "cache"
    assert cache_kwarg(_Wrapper(_Old())) == "past_key_values"
    assert cache_kwarg(torch.nn.Linear(2, 2)) == "past_key_values"  # declares neither: the old name


def _no_cache_warnings(caught):
    return [str(w.message) for w in caught if "past_key_values" in str(w.message)
            or "cache_params" in str(w.message)]


def test_sampling_loops_raise_no_cache_deprecation_warning(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    ids = [tok(p)["input_ids"] for p in ["1+2=", "3+4+5="]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the plain model call (lean off) and the lab build's sampler
        ro = HFEngine(tok, lean=False).generate(model, ids, [2, 2], 1.0, 5, seeds=[1, 2])
        texts = sample(model, ids, temperature=0.0, max_new_tokens=5, eos_id=tok.eos_token_id,
                       pad_id=tok.pad_token_id, vocab=tok.convert_ids_to_tokens,
                       generator=torch.Generator().manual_seed(0))
    assert _no_cache_warnings(caught) == []
    assert ro.response_ids.shape[0] == 4 and len(texts) == 2
    lean = HFEngine(tok).generate(model, ids, [2, 2], 1.0, 5, seeds=[1, 2])
    assert torch.equal(lean.response_ids, ro.response_ids)  # the cache reached the model
