"""The one tokenizer loader (ror_annotate.tokenizer): file, folder, name, offline fail-fast, public names, vocab hash."""

from __future__ import annotations

import hashlib
import socket

import pytest

from ror_annotate.errors import ConfigError, HubUnreachableError, InputError
from ror_annotate.tokenizer import load_tokenizer, public_tokenizer_name, tokenizer_vocab_sha256

from . import tokenizers_fixtures as F


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_file_folder_and_objects_load_the_same_fast_tokenizer(tmp_path):
    from tokenizers import Tokenizer

    tok = F.byte_level_bpe()
    tok.save_pretrained(tmp_path / "dir")
    text = "Sum ≥ 5 😀, 数学."
    want = tok(text)["input_ids"]
    for spec in (tmp_path / "dir", str(tmp_path / "dir"), str(tmp_path / "dir" / "tokenizer.json"), tok,
                 Tokenizer.from_file(str(tmp_path / "dir" / "tokenizer.json"))):
        got = load_tokenizer(spec)
        assert got.is_fast, spec
        assert got(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"], spec
        assert got(text, return_offsets_mapping=True)["offset_mapping"]  # offsets exist: what alignment needs
    assert load_tokenizer(str(tmp_path / "dir"))(text)["input_ids"] == want


def test_missing_path_and_slow_tokenizer_are_config_errors(tmp_path):
    from transformers import ByT5Tokenizer

    with pytest.raises(ConfigError, match="no such file or directory"):
        load_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="slow tokenizer"):
        load_tokenizer(ByT5Tokenizer())
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot load tokenizer file"):
        load_tokenizer(str(bad))


@pytest.fixture
def hub_calls(monkeypatch):
    """Record every AutoTokenizer.from_pretrained call; the cache lookup fails as for an uncached name."""
    from transformers import AutoTokenizer

    calls = []

    def fake(name, *args, **kwargs):
        calls.append(kwargs.get("local_files_only", False))
        raise OSError(f"{name} is not in the cache")

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", fake)
    return calls


def test_offline_name_fails_at_once_without_asking_the_hub(monkeypatch, hub_calls):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set") as err:
        load_tokenizer("some-org/not-cached-model")
    assert hub_calls == [True]  # only the local-cache lookup, no online attempt (which retries for 24-48 s)
    assert "tokenizer.json" in str(err.value)


def test_unreachable_hub_fails_at_once_with_a_hint(monkeypatch, hub_calls):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(ConfigError, match="cannot be reached") as err:  # the one hub probe's error (a ConfigError too)
        load_tokenizer("some-org/not-cached-model")
    assert hub_calls == [True]
    assert isinstance(err.value, HubUnreachableError) and err.value.code == "E210"
    assert str(err.value).startswith("cannot load tokenizer 'some-org/not-cached-model' (not in the local Hugging Face cache): the Hugging Face hub (http://127.0.0.1:")
    assert "HF_HUB_OFFLINE=1" in str(err.value)


def test_public_name_never_carries_an_absolute_path(tmp_path, monkeypatch):
    tok = F.byte_level_bpe()
    work = tmp_path / "work"
    (work / "models" / "tok").mkdir(parents=True)
    monkeypatch.chdir(work)
    assert public_tokenizer_name(tok, "Qwen/Qwen3-30B-A3B") == "Qwen/Qwen3-30B-A3B"
    assert public_tokenizer_name(tok, str(work / "models" / "tok")) == "models/tok"  # inside the working dir: relative
    assert public_tokenizer_name(tok, "./models/tok") == "models/tok"
    assert public_tokenizer_name(tok, str(tmp_path / "elsewhere" / "my-tok" / "tokenizer.json")) == "my-tok"
    assert public_tokenizer_name(tok, "/home/alice/.cache/huggingface/hub/models--org--name/snapshots/abc") == "org/name"
    assert public_tokenizer_name(tok, "C:\\Users\\alice\\tok") == "tok"


def test_vocab_hash_is_the_sha256_of_the_sorted_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "b": 2, "a": 1}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    expected = hashlib.sha256(b'[["[UNK]",0],["a",1],["b",2]]').hexdigest()  # written out by hand
    assert tokenizer_vocab_sha256(tok) == expected
    tok.save_pretrained(tmp_path / "t")
    assert tokenizer_vocab_sha256(load_tokenizer(str(tmp_path / "t"))) == expected  # survives a save/load
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "a": 2, "b": 1}, unk_token="[UNK]")))
    assert tokenizer_vocab_sha256(other) != expected  # same tokens, other ids


def test_one_hub_probe_for_datasets_and_tokenizers(monkeypatch):
    """One probe (HTTP HEAD, one timeout, cached per endpoint) and one error, E210, for both look-ups."""
    import httpx

    from ror_annotate import hub, tokenizer

    assert tokenizer.HUB_PROBE_SECONDS is hub.HUB_PROBE_SECONDS
    heads = []

    def head(url, *, timeout):
        heads.append((url, timeout))
        raise httpx.ConnectError("refused")

    monkeypatch.setattr(httpx, "head", head)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint + "/")
    with pytest.raises(HubUnreachableError, match=r"^some-org/data: the Hugging Face hub \(http://127.0.0.1:\d+\) cannot be reached \(ConnectError: refused\)"):
        hub.check_hub("some-org/data")
    with pytest.raises(InputError):  # what a dataset look-up raised before: still caught as one
        hub.check_hub("some-org/data")
    assert heads == [(endpoint, hub.HUB_PROBE_SECONDS)]  # one probe per endpoint and process
    monkeypatch.setenv("HF_HUB_OFFLINE", "yes")
    hub.check_hub("some-org/data")  # offline: no probe, the libraries read the cache
    assert len(heads) == 1
